"""The periodic work, composed: the sweep (fleet's, then node loss), the tick (the lease core's, then the
reschedules of leases that ended withdrawn, the before-end notices, restarts whose backoff passed, drains with a deadline), and retention (placement reports past theirs). The embedded
loop and Celery beat both run these."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Count

from leases import actions as lease_actions
from leases import forecasting
from leases.instances.actions import alerts, drains, nodes, reschedules, restarts, retention
from leases.instances.models import Reschedule, RescheduleStatus
from slotkeeper import outbox


def tick(now: datetime, background: forecasting.Background | None = None) -> None:
    """One tick; a failure anywhere in it is recorded once for the whole step (leases.actions.recorded_tick).
    `background`: where a large queue's forecast is computed (the embedded loop's thread), else in the tick."""
    with lease_actions.recorded_tick(now):
        # Lost instances' proposals first: a lease that held capacity before its node died goes before the queue.
        reschedules.refresh(now)
        lease_actions.advance(now, background)
        lease_actions.notify_ending(now)
        with transaction.atomic():
            reschedules.withdraw_moot(now)
        alerts.resolve_moot(now)
        restarts.supervise(now)
        drains.drive_drains(now)


def sweep(now: datetime):
    return nodes.sweep(now)


def retain(now: datetime) -> retention.Pruned:
    """Placement reports past their retention deleted, a bounded amount a call (retention.py), and the event feed's
    events past theirs (slotkeeper/outbox.py)."""
    outbox.prune(now)
    return retention.prune_reports(now)


def reschedule_gauges():
    counts = dict.fromkeys(RescheduleStatus.values, 0) | dict(
        Reschedule.objects.values("status").annotate(n=Count("id")).values_list("status", "n")
    )
    return [("slotkeeper_reschedules", {"status": status}, n) for status, n in counts.items()]
