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


def raise_alert(kind: str, message: str, now: datetime, *, instance=None, lease=None, node=None) -> Alert:
    """An open alert of this kind about this subject (instance, lease, node), raised once: raised again while it
    is open, it counts (`count`, `last_seen_at`) and takes the newer message instead of adding a row, so a cause
    that recurs does not bury the others."""
    lease = lease or (instance.lease if instance else None)
    node = node or (instance.node if instance else None)
    subject = {"instance": instance, "lease": lease, "node": node}
    alert = Alert.objects.select_for_update().filter(kind=kind, resolved_at=None, **subject).first()
    if alert is not None:
        alert.count += 1
        alert.last_seen_at = now
        alert.message = message
        alert.save(update_fields=["count", "last_seen_at", "message"])
    else:
        alert = Alert.objects.create(kind=kind, message=message, created_at=now, last_seen_at=now, **subject)
    events.send_on_commit("alert-raised", alert=alert.pk)
    return alert


def resolve(alerts, now: datetime, why: str) -> int:
    """Resolves these open alerts with the reason, each with its audit row (the system's own "its cause ended")."""
    count = 0
    for alert in alerts:
        alert.resolved_at = now
        alert.resolution = why[:2000]
        alert.save(update_fields=["resolved_at", "resolution"])
        audit.record(at=now, actor=None, action="alert.resolve", target=alert, reason=why[:500])
        events.send_on_commit("alert-raised", alert=alert.pk)
        count += 1
    return count


def resolve_open(kind: str, now: datetime, why: str) -> None:
    """Resolves every open alert of a kind, each with its audit row (the system's own "it passed again")."""
    resolve(Alert.objects.filter(kind=kind, resolved_at=None), now, why)
