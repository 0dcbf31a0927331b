"""The queue forecast's database side: when to run the pure forecast (leases/scheduling/forecast.py) and writing its
estimates onto the Lease rows.

The plan applier calls `refresh` at the end of every planning pass, under the plan lock and in its transaction. The
forecast is worth running when the plan changed (a journal entry), when what it reads changed without a journal
entry (the queue, the unusable nodes, the fleet's shape: a signature of them is kept on SchedulerState), and at
least once a minute (time moves estimates that would start now). Its cost grows with queued VMs x nodes
(bench/bench_forecast.py: about 1.3 s of CPU at 2,000 x 1,000, 8-10 s of wall time on a loaded machine), so:

- while that product is small (INLINE_WORK) and the forecast, at what the last inline one cost per unit, would take
  at most INLINE_BUDGET_S (25 ms), the pass runs it at once and writes the estimates in its own transaction: the
  page a submission lands on already shows its estimate, and no second transaction is needed;
- beyond that, only a tick that holds the forecast runner (`runner`: one at a time per process, and on PostgreSQL
  across processes) takes a `Snapshot` under the lock, which costs the queue's length, not the forecast's; the
  tick computes the forecast from it after its pass commits, outside the lock, and `commit` writes the estimates
  in a short transaction only if no pass has since changed what the forecast reads (compare-and-swap on
  `forecast_version`, the plan version the snapshot was taken at, and `forecast_stale`, which every such pass
  sets). Otherwise the result is dropped: the pass that moved it marked the forecast stale, and the next tick
  takes a new snapshot. Other passes with a large queue only mark it stale.

Why not compare the raw plan version: every pass bumps it, also the many that change nothing the forecast reads
(most ticks: nothing due), and with beat's 5 s tick (the embedded loop's 2 s) and a forecast that takes 8-10 s
of wall time under load a strict compare would drop every result. A pass that changes nothing the forecast reads leaves
`forecast_stale` alone, so the result computed meanwhile is still the answer for the plan as it is.

Where the tick computes it: Celery's tick task computes it itself (beat's sweep is a task of its own, in another
pool slot). The embedded loop runs the sweep and the tick one after the other in one round every 2 s, so a large
forecast computed in the tick (6-16 s of wall time for 1,000 queued leases of 64 VMs, an outside tester found)
delayed the next sweep past SWEEP_OUTAGE_GAP_S, which read it as its own outage and reset every node's grace: a
failing node was not found offline or dead for as long as the queue stayed long. Its ticks hand the Job to
`Background` instead: a thread of its own, holding the runner (so the ticks meanwhile take no snapshot), that
commits through the same compare-and-swap, and that takes the next one no sooner than 9x the last one's wall time
after it ended, so large forecasts take at most about a tenth (SHARE) of a process that also serves the requests,
and the throttle wins over EVERY_S: estimates a little older are the lesser harm.

Only rows whose estimate changed are written, in one batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import OperationalError, connection, transaction
from django.db.models import Q

from leases.lifecycle import LeaseState
from leases.models import Lease, SchedulerState
from leases.scheduler import Estimate, Scheduler, Snapshot, forecast, snapshot
from leases.scheduling.calibration import KEPT, Likely, WaitCalibration
from slotkeeper import events, metrics, planlock
from slotkeeper.bulk import Row, update_many

log = logging.getLogger(__name__)

# What a pass computes inline: queued VMs x nodes (of single-VM leases on the bench). About 25 ms of forecast at
# the bench's per-lease cost.
INLINE_WORK = 50_000
# ...and at most this long as last measured. What one VM x node costs depends on the plan the queue is packed
# into: on an empty fleet about 0.5 µs, on a full one (1,000 nodes, 3,400 leases running) about 35 µs, when a
# forecast of 50 queued leases took 1.7 s, inside every pass and so inside every lease request's answer. Each
# inline forecast measures its cost per unit; a pass whose forecast would take longer at that rate leaves it to
# the tick, outside the plan lock (the large queue's path).
INLINE_BUDGET_S = 0.025
_per_unit_s = INLINE_BUDGET_S / INLINE_WORK
# The forecast looks at no more queued leases than this; the rest say so in their note ("beyond the first 500
# queued leases the forecast looks at"). As Slurm's backfill tests at most bf_max_job_test (500) jobs a cycle: a
# lease's estimate rests on every one ahead of it ending as planned, so past the first hundreds it says little,
# and each one costs more than the last (the table fills up). The outsider's 1,000 leases of 64 VMs on the demo
# fleet: 0.8 s of CPU for the first 500, 2.4 s for all (bench/bench_loop_forecast.py); was 5,000.
LIMIT = 500
EVERY_S = 60.0
# The embedded loop's large forecasts take at most about this share of the process's time (Background).
SHARE = 0.1
STATE_FIELDS = ("forecast_at", "forecast_signature", "forecast_stale", "forecast_version")
ESTIMATE_FIELDS = ["estimated_start", "estimated_end", "estimate_note", "first_estimate"]
QUEUED = (LeaseState.QUEUED.value, LeaseState.SUSPENDED_QUEUED.value)
# An arbitrary constant: the session advisory lock a process holds while it may compute a large forecast.
RUNNER_LOCK_ID = 0x5107_F0CA


@dataclass(frozen=True)
class Job:
    """A forecast a pass handed off: what it reads, copied under the plan lock, and the version it describes."""

    snapshot: Snapshot
    now: datetime
    excluded: Mapping[int, str]
    version: int
    signature: str


def refresh(
    sched: Scheduler,
    state: SchedulerState,
    now: datetime,
    excluded: Mapping[int, str],
    fingerprint: tuple,
    *,
    changed: bool,
    tick: Callable[[], bool] | None,
) -> Job | None:
    """Under the plan lock, with `state.version` already the version this pass commits: run the forecast if it
    is due and cheap, or, for a large queue in a pass whose caller holds the runner (`tick`, asked only then
    whether to take one now: the embedded loop's throttle), return the Job to compute after the pass commits.
    Records on `state` (the caller saves STATE_FIELDS) what it was taken from."""
    queue = sched.queue
    # Integers only (lease and node ids, capacities), whose hash is the same in every process (only str and bytes
    # hashes are salted); a tenth of the cost of hashing their repr, which every pass pays.
    signature = str(hash((tuple(queue), tuple(sorted(excluded)), fingerprint)))
    if changed or signature != state.forecast_signature:
        # Whatever is being computed from an earlier snapshot describes a plan that is gone: it must not be written.
        state.forecast_stale = True
    if not queue and signature == state.forecast_signature:
        # The forecast last taken was of an empty queue too (the signature holds the queue): it cleared every
        # estimate and there is none to make, so the pass reads no lease and writes none (a burst that queues
        # nothing paid both in every pass). A forecast still being computed from an older snapshot is dropped.
        _taken(state, signature)
        state.forecast_at = now
        return None
    old = state.forecast_at is None or (now - state.forecast_at).total_seconds() >= EVERY_S
    if not (state.forecast_stale or old):
        return None
    # Its work is the VMs it packs, not the leases: a batch of 1,000 leases of 64 VMs counted as 1,000 and was
    # forecast inside the batch's own pass (0.8 s of that request); only the first LIMIT are looked at.
    vms = sum(len(sched.leases[lid].request.vnodes) for lid in queue[:LIMIT])
    work = vms * max(len(sched.table.nodes), 1)
    if work <= INLINE_WORK and work * _per_unit_s <= INLINE_BUDGET_S:
        started, started_cpu = time.perf_counter(), time.thread_time()
        estimates = forecast(sched, now.timestamp(), excluded, limit=LIMIT)
        cpu = _learn(work, time.thread_time() - started_cpu)
        _say_slow(cpu > INLINE_BUDGET_S, len(queue), cpu)
        written = write(estimates)
        _taken(state, signature)
        state.forecast_at = now
        log.debug(
            "queue forecast",
            extra={
                "queued": len(queue),
                "written": written,
                "ms": round(1e3 * (time.perf_counter() - started)),
            },
        )
        return None
    if tick is None or not tick():
        return None  # too big to run inside this pass: the next tick that holds the runner (and may) takes it
    job = Job(snapshot(sched), now, dict(excluded), state.version, signature)
    _taken(state, signature)
    return job


def _learn(work: int, cpu_s: float) -> float:
    """Remembers what a forecast cost, in CPU seconds per queued VM x node: the latest is the best guess (the
    cost follows the plan, which changes slowly). Inline forecasts and the ticks' both teach it, so passes go
    back to forecasting inline once the fleet is cheap to pack again."""
    global _per_unit_s
    _per_unit_s = cpu_s / max(work, 1)
    return cpu_s


def _taken(state: SchedulerState, signature: str) -> None:
    state.forecast_signature, state.forecast_stale, state.forecast_version = signature, False, state.version


def complete(job: Job) -> int | None:
    """Computes a handed-off forecast (outside the plan lock: the caller's pass has committed) and writes it if it
    still holds. Returns the rows written, None when the result was dropped."""
    # This thread's CPU: in the embedded run the web process's other threads run alongside.
    started, started_cpu = time.perf_counter(), time.thread_time()
    estimates = forecast(job.snapshot, job.now.timestamp(), job.excluded, limit=LIMIT)
    cpu = _learn(
        len(job.snapshot.queue) * max(len(job.snapshot.table.nodes), 1), time.thread_time() - started_cpu
    )
    written = commit(job, estimates)
    metrics.inc("slotkeeper_forecast_runs_total", outcome="written" if written is not None else "dropped")
    metrics.inc("slotkeeper_forecast_cpu_seconds_total", cpu)
    log.info(
        "queue forecast" if written is not None else "queue forecast dropped: the plan moved while it ran",
        extra={
            "queued": len(job.snapshot.queue),
            "version": job.version,
            "written": written,
            "cpu_ms": round(1e3 * cpu),
            "ms": round(1e3 * (time.perf_counter() - started)),
        },
    )
    return written


def commit(job: Job, estimates: Mapping[int, Estimate]) -> int | None:
    """Writes `estimates` only if no pass changed what the forecast reads since `job` was taken: one conditional
    update of SchedulerState (the compare-and-swap), then the changed Lease rows, in one short transaction.

    The conditional update locks SchedulerState's row, which every pass locks first (leases/planning/passes.py),
    so no pass can commit between the check and the writes: one that is running finishes first and the update then
    sees what it wrote; one that starts waits for the writes (18-111 ms for 2,000 queued leases on SQLite, as the
    in-pass write took before: bench_forecast.py --db). Returns None when dropped."""
    try:
        with transaction.atomic(durable=True):
            if connection.vendor == "postgresql":
                # No wait is unbounded: a pass that holds the row longer than the plan lock's timeout wins.
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        [f"{int(planlock.timeout_s() * 1000)}ms"],
                    )
            won = SchedulerState.objects.filter(
                pk=1, forecast_version=job.version, forecast_stale=False
            ).update(forecast_at=job.now)
            if not won:
                return None
            rows = _changed(estimates)
            written = update_many(rows, ESTIMATE_FIELDS, model=Lease)
            if rows:
                # Written after the pass's own "slots-changed" went out: the consoles showing them fetch again.
                events.send_on_commit("slots-changed", leases=sorted(row.pk for row in rows)[:50])
            return written
    except OperationalError as exc:
        if planlock.is_busy_error(exc) or getattr(exc.__cause__, "sqlstate", None) == "55P03":
            # SQLite's write lock, PostgreSQL's row lock (lock_timeout) or the pool stayed taken. Dropped like a
            # stale result; nothing marks it stale (that write would wait on the same lock), so the minute rule
            # retakes it at the latest.
            log.warning("queue forecast not written: the database stayed locked")
            return None
        raise


@contextmanager
def runner() -> Iterator[bool]:
    """Whether the caller may take a large forecast's snapshot and compute it: True when no other thread of this
    process is computing one and, on PostgreSQL, no other process either (a session advisory lock, tried and
    never waited for). Without it two Celery workers whose ticks overlap (beat every 5 s, a forecast 8-10 s of
    wall time under load) would each compute a forecast, and each new snapshot would drop the other's result."""
    if not _running.acquire(blocking=False):
        yield False
        return
    try:
        if connection.vendor != "postgresql":
            # SQLite is the embedded run: one process, whose periodic loop runs one tick at a time.
            yield True
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [RUNNER_LOCK_ID])
            (held,) = cursor.fetchone()
        try:
            yield bool(held)
        finally:
            if held:
                # A broken connection releases it as it closes; a working one must, or it would stay held in the pool.
                with suppress(Exception), connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [RUNNER_LOCK_ID])
    finally:
        _running.release()


_running = threading.Lock()


class Background:
    """The embedded loop's way to compute a large forecast: on a thread of its own, so the loop's next rounds (the
    sweep above all, whose promised timing a 6-16 s forecast inside the round broke) keep their period, and no
    more than SHARE of the time, so the forecast does not monopolise the process that also serves the requests.

    One at a time: the thread holds the runner while it computes, so the ticks meanwhile take no snapshot. The
    next one is taken no sooner than the last one's wall time x (1/SHARE - 1) after it ended, even past EVERY_S:
    estimates a minute or two older are the lesser harm than a process a forecast keeps busy."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._not_before = 0.0
        self._said = False  # whether this throttle's hold was logged: once a hold, not every tick's

    def may_take(self) -> bool:
        """Asked by a tick's pass only when a large forecast is due: whether to take its snapshot now."""
        if self._thread is not None and self._thread.is_alive():
            return False
        wait = self._not_before - self._clock()
        if wait <= 0:
            return True
        if not self._said:
            self._said = True
            log.info(
                "queue forecast throttled: the last one took long, the next waits",
                extra={"share": SHARE, "next_in_s": round(wait, 1)},
            )
        return False

    def start(self, job: Job) -> threading.Thread:
        """Computes `job` on a new thread (after the tick released the runner, which the thread takes)."""
        # Daemon: a process that is stopping does not wait for a forecast; its result is retaken after.
        self._thread = threading.Thread(target=self._run, args=(job,), name="queue-forecast", daemon=True)
        self._thread.start()
        return self._thread

    def _run(self, job: Job) -> None:
        started = self._clock()
        try:
            with runner() as may:
                if may:
                    complete(job)
                else:
                    # Another thread or process took it between the tick's pass and now: its own snapshot is the
                    # newer, which this one's result could only lose to.
                    log.info(
                        "queue forecast skipped: another runner took over", extra={"version": job.version}
                    )
        except Exception:
            log.exception("queue forecast failed")
        finally:
            # Django's connections are per thread: this thread's would stay open, and hold SQLite's file, otherwise.
            connection.close()
            ended = self._clock()
            self._not_before = ended + (ended - started) * (1 / SHARE - 1)
            self._said = False


def write(estimates: Mapping[int, Estimate]) -> int:
    """Each queued lease's estimate, and none for every lease that had one and is no longer queued; only the rows
    whose values change are written."""
    return update_many(_changed(estimates), ESTIMATE_FIELDS, model=Lease)


def _changed(estimates: Mapping[int, Estimate]) -> list[Row]:
    current = Lease.objects.filter(
        Q(state__in=QUEUED) | Q(estimated_start__isnull=False) | ~Q(estimate_note="")
    ).values_list("pk", "estimated_start", "estimated_end", "estimate_note", "first_estimate", "first_start")
    rows = []
    for pk, start, end, note, first, started in current:
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
            # The first estimate a lease is given before it ever runs stays: what it was told, for the calibration
            # (issue 48); a lease queued again after running is not waiting from its submission.
            kept = first if first is not None or e is None or started is not None else want[0]
            rows.append(
                Row(
                    pk=pk,
                    estimated_start=want[0],
                    estimated_end=want[1],
                    estimate_note=want[2],
                    first_estimate=kept,
                )
            )
    return rows


def likely_start(estimated: datetime, now: datetime) -> Likely | None:
    """A queued lease's likely start and range, from how the last KEPT leases queued at submission waited against
    their first estimate (leases/scheduling/calibration.py); None when too few have started yet to say."""
    seen = (
        Lease.objects.filter(first_estimate__isnull=False, first_start__isnull=False)
        .order_by("-first_start")
        .values_list("submitted_at", "first_estimate", "first_start")[:KEPT]
    )
    calibration = WaitCalibration().observe_all(
        (submitted.timestamp(), first.timestamp(), started.timestamp()) for submitted, first, started in seen
    )
    return calibration.likely(now.timestamp(), estimated.timestamp())


def _moment(t: float | None) -> datetime | None:
    # Whole microseconds, as the database keeps them: an unchanged estimate compares equal and is not rewritten.
    return None if t is None else datetime.fromtimestamp(round(t, 6), UTC)


_slow = (
    False  # whether the last inline forecast was over its budget: said once when it becomes so, and when not
)


def _say_slow(slow: bool, queued: int, cpu: float) -> None:
    """Logs the forecast's moving to the ticks (too slow for a pass) once, and its coming back once, not at every
    pass that finds it so (the terminal repeated the line 15 times in 45 minutes of the demo)."""
    global _slow
    if slow and not _slow:
        log.info(
            "queue forecast slower than a pass may wait: ticks compute it until it is cheap again",
            extra={"queued": queued, "ms": round(1e3 * cpu)},
        )
    elif not slow and _slow:
        log.info("queue forecast cheap again: passes compute it inline", extra={"queued": queued})
    _slow = slow
