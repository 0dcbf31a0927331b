"""The queue forecast's database side: when to run the pure forecast (leases/scheduling/forecast.py) and writing its
estimates onto the Lease rows.

The plan applier calls `refresh` at the end of every planning pass, under the plan lock and in its transaction, so
the estimates always describe a plan that was committed. The forecast is worth running when the plan changed (a
journal entry), when what it reads changed without a journal entry (the queue, the unusable nodes, the fleet's
shape: a signature of them is kept on SchedulerState), and at least once a minute (time moves estimates that
would start now). Its cost grows with queued leases x nodes (bench/bench_forecast.py: about a second at 2,000 x
1,000), so a pass runs it at once only while that product is small (the common case: estimates on the page a
submission lands on); otherwise the pass marks it stale and the next tick, every few seconds, runs it. Only rows
whose estimate changed are written, in one batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from django.db.models import Q

from leases.lifecycle import LeaseState
from leases.models import Lease, SchedulerState
from leases.scheduler import Estimate, Scheduler, forecast
from slotkeeper.bulk import update_many

log = logging.getLogger(__name__)

# What a pass computes inline: queued leases x nodes. About 25 ms of forecast at the bench's per-lease cost.
INLINE_WORK = 50_000
# The forecast looks at no more queued leases than this; the rest say so in their note.
LIMIT = 5_000
EVERY_S = 60.0
STATE_FIELDS = ("forecast_at", "forecast_signature", "forecast_stale")
QUEUED = (LeaseState.QUEUED.value, LeaseState.SUSPENDED_QUEUED.value)


def refresh(
    sched: Scheduler,
    state: SchedulerState,
    now: datetime,
    excluded: Mapping[int, str],
    fingerprint: tuple,
    *,
    changed: bool,
    tick: bool,
) -> int | None:
    """Run the forecast if it is due and affordable here, write the estimates that changed, and record on `state`
    (the caller saves STATE_FIELDS) what it was computed from. Returns the rows written, None when not run."""
    queue = list(sched.queue)
    # Integers only (lease and node ids, capacities), whose hash is the same in every process (only str and bytes
    # hashes are salted); a tenth of the cost of hashing their repr, which every pass pays.
    signature = str(hash((tuple(queue), tuple(sorted(excluded)), fingerprint)))
    stale = state.forecast_stale or changed or signature != state.forecast_signature
    old = state.forecast_at is None or (now - state.forecast_at).total_seconds() >= EVERY_S
    if not (stale or old):
        return None
    if not tick and len(queue) * max(len(sched.table.nodes), 1) > INLINE_WORK:
        state.forecast_stale = True  # too big to run inside a submission: the next tick runs it
        return None
    started = time.perf_counter()
    estimates = forecast(sched, now.timestamp(), excluded, limit=LIMIT)
    written = write(estimates)
    state.forecast_at, state.forecast_signature, state.forecast_stale = now, signature, False
    log.debug(
        "queue forecast",
        extra={"queued": len(queue), "written": written, "ms": round(1e3 * (time.perf_counter() - started))},
    )
    return written


def write(estimates: Mapping[int, Estimate]) -> int:
    """Each queued lease's estimate, and none for every lease that had one and is no longer queued; only the rows
    whose values change are written."""
    current = Lease.objects.filter(
        Q(state__in=QUEUED) | Q(estimated_start__isnull=False) | ~Q(estimate_note="")
    ).values_list("pk", "estimated_start", "estimated_end", "estimate_note")
    rows = []
    for pk, start, end, note in current:
        e = estimates.get(pk)
        want = (
            (None, None, "")
            if e is None
            else (
                _moment(e.start),
                _moment(e.end),
                e.note[: Lease._meta.get_field("estimate_note").max_length],
            )
        )
        if (start, end, note) != want:
            rows.append(Lease(pk=pk, estimated_start=want[0], estimated_end=want[1], estimate_note=want[2]))
    return update_many(rows, ["estimated_start", "estimated_end", "estimate_note"])


def _moment(t: float | None) -> datetime | None:
    # Whole microseconds, as the database keeps them: an unchanged estimate compares equal and is not rewritten.
    return None if t is None else datetime.fromtimestamp(round(t, 6), UTC)
