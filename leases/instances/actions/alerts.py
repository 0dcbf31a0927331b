"""Resolving an alert by hand: one transaction, an audit row, the event after commit. Alerts are raised by the
code that finds the problem (leases/alerts.py)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

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
        alert.save(update_fields=["resolved_at"])
        audit.record(at=now, actor=actor, action="alert.resolve", target=alert, reason=reason)
        events.send_on_commit("alert-raised", alert=alert.pk)
    return alert
