"""Resolving an alert by hand: one transaction, an audit row, the event after commit. Alerts are raised by the
code that finds the problem (leases/alerts.py)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from leases.alerts import resolve
from leases.lifecycle import TERMINAL_LEASE_STATES
from leases.models import Alert
from slotkeeper import audit, events
from slotkeeper.domain import DomainError, NotFound


def do_resolve_alert(actor, pk: int, *, now: datetime, reason: str = "") -> Alert:
    with transaction.atomic():
        alert = Alert.objects.select_for_update().filter(pk=pk).first()
        if alert is None:
            raise NotFound(f"alert {pk} does not exist")
        if alert.resolved_at is not None:
            raise DomainError(f"alert {pk} was resolved at {alert.resolved_at:%Y-%m-%d %H:%M:%S}")
        alert.resolved_at = now
        alert.resolution = f"resolved by {audit.actor_label(actor)}" + (f": {reason}" if reason else "")
        alert.save(update_fields=["resolved_at", "resolution"])
        audit.record(at=now, actor=actor, action="alert.resolve", target=alert, reason=reason)
        events.send_on_commit("alert-raised", alert=alert.pk)
    return alert


def resolve_moot(now: datetime) -> int:
    """The tick's part: open alerts whose cause has ended resolve themselves, each with the reason: a dead node's
    once it is re-admitted; a held instance's once its node is back; a failed instance's (its restarts or its
    reschedules spent) once its lease has ended, when nothing is left for an operator to do. Returns how many."""
    resolved = 0
    open_alerts = Alert.objects.filter(resolved_at=None)
    with transaction.atomic():
        back = open_alerts.filter(kind="node_dead").exclude(node__status="dead").select_related("node")
        for alert in back.select_for_update(of=("self",)):
            resolved += resolve(
                [alert], now, f"node {alert.node.name} was re-admitted; it is {alert.node.status}"
            )
        held = open_alerts.filter(kind="instance_held").exclude(node__status="dead").select_related("node")
        for alert in held.select_for_update(of=("self",)):
            resolved += resolve([alert], now, f"its node {alert.node.name} is back ({alert.node.status})")
        ended = open_alerts.filter(
            kind__in=[
                "instance_held",
                "restarts_exhausted",
                "reschedule_budget_spent",
                "reservation_stranded",
            ],
            lease__state__in=[s.value for s in TERMINAL_LEASE_STATES],
        ).select_related("lease")
        for alert in ended.select_for_update(of=("self",)):
            resolved += resolve([alert], now, f"lease {alert.lease_id} has ended ({alert.lease.state})")
    return resolved
