"""What a planning pass tells /metrics beyond the plan applier's counters (leases/planning/passes.py): how long it took, as a
histogram and as the last pass's figures, and how long each lease it started for the first time had waited since
its submission.

Called once per pass, where the pass counts itself, with the journal of changes it is about to commit. The waits
are counted when that commit happens: a pass rolled back started nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from leases.lifecycle import LeaseState
from leases.scheduler import Scheduler
from leases.scheduling.records import Change
from slotkeeper import metrics


def observe(seconds: float, batch: int, sched: Scheduler, changes: Sequence[Change]) -> None:
    metrics.observe("slotkeeper_plan_pass_duration_seconds", seconds)
    metrics.set_gauge("slotkeeper_plan_pass_seconds_last", seconds)
    metrics.set_gauge("slotkeeper_plan_batch_size_last", batch)
    _largest[0] = max(_largest[0], batch)
    metrics.set_gauge("slotkeeper_plan_batch_size_max", _largest[0])
    waits = first_starts(sched, changes)
    if waits:
        transaction.on_commit(lambda: _count(waits))


_largest = [0]  # this process's largest batch (the gauge's `max` mode takes the largest of every process's)


def first_starts(sched: Scheduler, changes: Sequence[Change]) -> list[tuple[str, float]]:
    """(lease type, seconds from submission to start) for every lease the journal starts for the first time. A
    lease's first start is the ACTIVE step at the instant the scheduler recorded as its `first_start`; a resumed
    or migrated lease becomes ACTIVE again later, and is not counted twice."""
    waits = []
    seen = set()
    for change in changes:
        if change.what != "lease_state" or change.state != LeaseState.ACTIVE or change.lease_id in seen:
            continue
        rec = sched.leases.get(change.lease_id)
        if rec is None or rec.first_start is None or rec.first_start != change.at:
            continue
        seen.add(change.lease_id)
        waits.append((rec.request.type, max(0.0, rec.first_start - rec.request.submit)))
    return waits


def _count(waits: list[tuple[str, float]]) -> None:
    for type_, seconds in waits:
        metrics.observe("slotkeeper_lease_wait_seconds", seconds, type=type_)
