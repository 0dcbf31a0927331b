"""The planning pass: `planning(now)` is the one place where plans are made and committed. It takes the scheduler
lock (a PostgreSQL advisory transaction lock; on SQLite the IMMEDIATE write transaction), brings an in-memory
Scheduler up to the database's version, lets the caller submit / cancel / advance, and writes the scheduler's
change journal back in the same transaction. Because the decision and its commit are one serialised step, two
submitters (or a submitter and the tick) can never both take the last free capacity of a node: the second one
plans on the first one's result.

`_pass` reads top-down as a lease request's walk through it: the fleet read, the cached scheduler kept, caught up
or restored (restore.py), the exclusions and the now-gate's figures (prepare.py), every waiting request planned
(intents.py), the caller's part, the journal written (applying.py), what the pass did reported (reporting.py),
the version bumped, the forecast refreshed, and the scheduler cached again on commit. Only the holder of the plan
lock touches the cached object, so threads of one process can share it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from django.db import OperationalError, transaction

from fleet.placement import read_fleet
from leases import forecasting, pass_metrics
from leases.models import PlanVersion, SchedulerState
from leases.planning.applying import apply
from leases.planning.intents import _plan_intents
from leases.planning.plan import Planning
from leases.planning.prepare import _excluded, _prepare
from leases.planning.reporting import _record_displaced, _record_isolated, _record_stranded, _report_placed
from leases.planning.restore import _cache, _Cached, _current_scheduler, _take_cached
from slotkeeper import events, metrics, planlock, planwake

# PlanVersion rows kept (pruned every PRUNE_EVERY versions).
PLAN_VERSIONS_KEPT = 1000
PRUNE_EVERY = 100


@contextmanager
def planning(now: datetime, *, try_lock: bool = False) -> Iterator[Planning]:
    """Lock, load (or reuse) the scheduler, let the caller plan, write the journal back; all in one transaction.

    The wait for the lock is bounded (PlanBusy, answered 503). A lease the scheduler cannot make sense of is
    isolated (failed, with an alert) rather than failing the whole pass, so one bad row never stops scheduling.
    """
    try:
        with _planning(now, try_lock=try_lock) as plan:
            yield plan
    except StopIteration as exc:
        # A StopIteration escaping a view never becomes a 500: asyncio refuses to put it in a Future, and the
        # request hangs until the client gives up. Whatever raised it, it is a server error, so say so.
        raise RuntimeError(f"planning failed: StopIteration {exc}") from exc
    except OperationalError as exc:
        if planlock.is_busy_error(exc):
            raise planlock.PlanBusy("the scheduler is busy: the database stayed locked; try again") from None
        raise


class LockTaken(Exception):
    """`planning(..., try_lock=True)` found the plan lock held: another pass is running."""


@contextmanager
def _planning(now: datetime, *, try_lock: bool = False) -> Iterator[Planning]:
    started = time.perf_counter()
    with transaction.atomic():
        if try_lock:
            taken = planlock.try_take()
        else:
            planlock.take()
            taken = True
        if taken:
            with _pass(now, started) as plan:
                yield plan
    # The lock was held: the transaction, which wrote nothing, ended by a commit rather than an exception's
    # rollback, after which the driver forgets every statement it prepared on the connection
    # (slotkeeper/statements.py): in a burst, a rollback every four requests had 854 of 1,000 token lookups
    # planned again.
    if not taken:
        raise LockTaken


@contextmanager
def _pass(now: datetime, started: float) -> Iterator[Planning]:
    """A pass under the plan lock, inside `_planning`'s transaction."""
    cpu = _PassCPU()
    state, _ = SchedulerState.objects.select_for_update().get_or_create(pk=1)
    fleet = read_fleet(now)
    nodes, fingerprint = fleet.states, fleet.fingerprint()
    cpu.lap("read")
    cached = _take_cached()
    sched = _current_scheduler(cached, state, nodes, fingerprint)
    cpu.lap("catch_up")
    plan = Planning(scheduler=sched, now=now, excluded=_excluded(fleet), nodes=nodes)
    _prepare(sched, plan)
    cpu.lap("prepare")
    # Group commit: every pass, whoever runs it (a submission, a cancel, an approval, the tick), first plans
    # every lease request that waits, so a burst of requests costs one pass, not one pass each.
    batch = _plan_intents(plan)
    cpu.lap("requests")
    yield plan
    cpu.lap("caller")
    changes = sched.take_changes()
    touched = apply(sched, changes, plan.messages)
    _report_placed(plan, changes)
    _record_isolated(sched.take_isolated(), now)
    _record_stranded(sched.take_stranded(), now)
    _record_displaced(sched.take_displaced(), nodes, now)
    state.version += 1
    state.next_rid = sched.next_rid
    # After the version is bumped: a forecast snapshot taken here describes the version this pass commits.
    plan.forecast = forecasting.refresh(
        sched, state, now, plan.excluded, fingerprint, changed=bool(changes), tick=plan.tick
    )
    state.save(update_fields=["version", "next_rid", *forecasting.STATE_FIELDS])
    version = state.version
    # What this version touched, so a process whose cached scheduler is behind re-reads only those leases.
    # An upsert: were the SchedulerState row ever recreated, its versions would start again from 1, and a
    # leftover row must not fail every pass from then on.
    PlanVersion.objects.bulk_create(
        [PlanVersion(version=version, leases=sorted(touched))],
        update_conflicts=True,
        unique_fields=["version"],
        update_fields=["leases"],
    )
    if version % PRUNE_EVERY == 0:
        PlanVersion.objects.filter(version__lte=version - PLAN_VERSIONS_KEPT).delete()
    planwake.announce(version, batch)

    def keep():
        _cache.value = _Cached(version, fingerprint, sched)

    transaction.on_commit(keep)
    # Counted when the pass's work is done (before its commit, which a caller's outer transaction may hold).
    took = time.perf_counter() - started
    metrics.inc("slotkeeper_plan_passes_total")
    metrics.inc("slotkeeper_plan_pass_seconds_total", took)
    metrics.inc("slotkeeper_plan_batched_requests_total", len(batch))
    pass_metrics.observe(took, len(batch), sched, changes)
    pass_stats.record(len(batch), took)
    if touched:
        events.send_on_commit("slots-changed", leases=sorted(touched)[:50])
    cpu.lap("write")
    cpu.count()


class _PassCPU:
    """A pass's CPU time (its thread's), part by part, counted on /metrics as
    `slotkeeper_plan_pass_cpu_seconds_total{part}`: what the pass's wall time (`slotkeeper_plan_pass_seconds_total`)
    does not say under load, where a pass also waits for the GIL and the cores. Parts: `read` (the scheduler's row
    locked, the fleet read), `catch_up` (the cached scheduler brought up to the database, or loaded), `prepare`
    (observed use, exclusions), `requests` (every waiting lease request planned, its report and audit row built),
    `caller` (what the pass was taken for: a cancel, an approval, the tick) and `write` (the plan's changes, the
    version, the forecast's refresh, the events). The commit, after, is not counted."""

    __slots__ = ("_last", "_parts")

    def __init__(self) -> None:
        self._last = time.thread_time()
        self._parts: list[tuple[str, float]] = []

    def lap(self, part: str) -> None:
        now = time.thread_time()
        self._parts.append((part, now - self._last))
        self._last = now

    def count(self) -> None:
        for part, seconds in self._parts:
            metrics.inc("slotkeeper_plan_pass_cpu_seconds_total", seconds, part=part)


@dataclass
class PassStats:
    """This process's recent passes, for /metrics: the last pass's batch size and time, and the largest batch."""

    last_batch: int = 0
    max_batch: int = 0
    last_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, batch: int, seconds: float) -> None:
        with self._lock:
            self.last_batch, self.last_seconds = batch, seconds
            self.max_batch = max(self.max_batch, batch)


pass_stats = PassStats()
