"""Raising and resolving alerts: rows an operator should look at. Called inside the caller's transaction, so an
alert commits with the change that raised it; its event goes out after commit.

In the lease core because the plan applier raises them (a lease isolated, a submission rejected, the tick
failing); the instances package raises its own (restarts exhausted, node lost, instance held) through here, and
owns the alert pages, the API and resolving one by hand.
"""

from __future__ import annotations

from datetime import datetime

from leases.models import Alert
from slotkeeper import audit, events
from slotkeeper.bulk import Row, insert_many


def raise_alert(kind: str, message: str, now: datetime, *, instance=None, lease=None, node=None) -> Alert:
    alert = Alert.objects.create(
        kind=kind,
        message=message,
        created_at=now,
        instance=instance,
        lease=lease or (instance.lease if instance else None),
        node=node or (instance.node if instance else None),
    )
    events.send_on_commit("alert-raised", alert=alert.pk)
    return alert


def raise_lease_alerts(kind: str, alerts: list[tuple[int, str]], now: datetime) -> None:
    """`raise_alert` for many leases at once, (lease id, message) each, in one INSERT: a pass that rejects
    thousands of requests (immediate leases on a full fleet) raised an alert each with a statement of its own."""
    if not alerts:
        return
    rows = insert_many(
        [Row(kind=kind, message=message, created_at=now, lease_id=lease_id) for lease_id, message in alerts],
        model=Alert,
    )
    for row in rows:
        events.send_on_commit("alert-raised", alert=row.pk)


def resolve_open(kind: str, now: datetime, why: str) -> None:
    """Resolves every open alert of a kind, each with its audit row (the system's own "it passed again")."""
    for alert in Alert.objects.filter(kind=kind, resolved_at=None):
        alert.resolved_at = now
        alert.save(update_fields=["resolved_at"])
        audit.record(at=now, actor=None, action="alert.resolve", target=alert, reason=why)
        events.send_on_commit("alert-raised", alert=alert.pk)
