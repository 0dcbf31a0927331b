"""A question to the scheduler that changes nothing (a preview, a counter-offer's search, a reschedule's
candidates): `consulting(now)` asks the scheduler the last committed pass left in this process's cache when it is
current, without the plan lock; otherwise it runs a pass, which brings it up to date."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from django.db import connections, router
from django.db.models import Exists

from fleet.placement import read_fleet
from leases.lifecycle import LeaseState
from leases.models import Lease, SchedulerState
from leases.planning.passes import planning
from leases.planning.plan import Planning
from leases.planning.prepare import _excluded, _observe
from leases.planning.records import to_epoch
from leases.planning.restore import _cache, _cache_lock, _forget
from slotkeeper import metrics, planlock
from slotkeeper.statements import compiled

log = logging.getLogger(__name__)


@contextmanager
def consulting(now: datetime) -> Iterator[Planning]:
    """A Planning to ask, not to change (a preview): the scheduler as the last committed pass left it, without the
    plan lock, a version, or a journal written, when this process holds it current (the database's version, the
    same fleet, no lease request waiting); otherwise a planning pass, which brings it up to date, plans whatever
    waits, and commits as every pass does. Either way the caller sees exactly what a pass at `now` would plan on,
    and never a pass half-written: a pass takes the scheduler out of the cache before it changes it, and puts it
    back only when it has committed.

    The caller must only ask (`propose`, `explain`) and must not write to the database inside: on the read path
    it holds the cache's lock, which every pass in this process waits for."""
    plan = _read_plan(now)
    if plan is None:
        metrics.inc("slotkeeper_scheduler_reads_total", how="pass")
        with planning(now) as plan:
            # What a submission does before it plans: the reservations due by now start and end.
            plan.scheduler.catch_up(plan.t)
            yield plan
        return
    try:
        yield plan
    except BaseException:
        _forget(plan.scheduler)  # a failed question may have left the object half-way through something
        raise
    else:
        if plan.scheduler.unwritten:
            # Asking changed what a pass would have to write: no read may do that. The next pass reloads.
            log.error("a read changed the cached scheduler; dropped")
            _forget(plan.scheduler)
    finally:
        _cache_lock.release()
    metrics.inc("slotkeeper_scheduler_reads_total", how="read")


def _read_plan(now: datetime) -> Planning | None:
    """The read path of `consulting`: a Planning on the cached scheduler, with the cache's lock held (the caller
    releases it), or None, with the lock released, when only a pass can give a current one."""
    if not _cache_lock.acquire(timeout=planlock.timeout_s()):
        return None
    plan = None
    try:
        plan = _current_read(now)
    finally:
        if plan is None:
            _cache_lock.release()
    return plan


def _current_read(now: datetime) -> Planning | None:
    """A Planning on the cached scheduler if a pass at `now` would keep it as it is (`_current_scheduler`'s "kept")
    and would plan nothing before the caller's question; else None. Only reads."""
    cached = _cache.value
    if cached is None or cached.scheduler.unwritten:
        return None
    # One statement, so the version and the waiting requests come from one snapshot.
    alias = router.db_for_read(SchedulerState)
    with connections[alias].cursor() as cursor:
        cursor.execute(*compiled(alias, "scheduler.version_waiting", _version_and_waiting))
        got = cursor.fetchone()
    if got is None or (got[0], bool(got[1])) != (cached.version, False):
        return None  # another process committed since, or requests wait to be planned: a pass's work
    if cached.scheduler.due(to_epoch(now)):
        return None  # a reservation starts or ends by now: a submission would plan on the table after it
    fleet = read_fleet(now)
    if fleet.fingerprint() != cached.fingerprint:
        return None  # a pass would reload the scheduler for this fleet
    plan = Planning(scheduler=cached.scheduler, now=now, excluded=_excluded(fleet), nodes=fleet.states)
    # What a pass does before it plans, less `settle`, which has nothing to do on a committed scheduler
    # (`unwritten` above): the now-gate's figures, from this read of the fleet.
    _observe(plan.scheduler, plan)
    return plan


def _version_and_waiting():
    return (
        SchedulerState.objects.filter(pk=1)
        .annotate(waiting=Exists(Lease.objects.filter(state=LeaseState.NEW)))
        .values_list("version", "waiting")[:1]
    )
