"""Trace replay: the scheduler driven by a simulated clock over a workload, with metrics and invariant checks.

This module owns the simulation loop of SEMANTICS §3.1 (hand in each request at its submit time, let leases end
at their real duration, jump to the next event), the metrics of §1.1 with §10 Q12, the invariants every replay
must keep, and the JSON shape `manage.py replay --json` prints. It imports no Django, so benchmarks and tests use
it directly. Times are seconds after the trace start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from leases.haizea_config import HaizeaConfig
from leases.lifecycle import LeaseState
from leases.scheduler import (
    ADVANCE_RESERVATION,
    BEST_EFFORT,
    CANCELLED,
    VM,
    LeaseRecord,
    LeaseRequest,
    Scheduler,
    SchedulerConfig,
    forecast,
)
from leases.scheduling.calibration import Likely, WaitCalibration
from leases.slottable import Res
from leases.traces import Trace, TraceLease, merge_traces, parse_resources, read_trace

_FINAL = frozenset({LeaseState.DONE, LeaseState.REJECTED, LeaseState.CANCELLED})
_EPS = 1e-6


class InvariantError(AssertionError):
    """A replay broke a rule every schedule must keep; the message names the lease or node and the numbers."""


@dataclass(frozen=True)
class Metrics:
    leases: int
    last_best_effort_end_s: float | None
    mean_wait_s: float | None
    mean_bounded_slowdown: float | None
    utilisation: float
    ar_accepted: int
    ar_rejected: int


@dataclass
class ReplayResult:
    trace: Trace
    scheduler: Scheduler
    metrics: Metrics
    steps: int


def locate(path: str | Path, roots: Iterable[str | Path] = ()) -> Path:
    """The file a config names, on this disk.

    Haizea's configs name traces on their author's disk (/usr/share/haizea/traces/multi/inj1.lwf), so a path
    that does not exist is looked for under each root by its trailing parts, longest first
    (traces/multi/inj1.lwf, then multi/inj1.lwf, then inj1.lwf). The path as written is returned when nothing
    matches, so the error names what the config said.
    """
    given = Path(path).expanduser()
    if given.exists():
        return given
    parts = given.parts[1:] if given.is_absolute() else given.parts
    for k in range(len(parts)):
        for root in roots:
            candidate = Path(root) / Path(*parts[k:])
            if candidate.is_file():
                return candidate
    return given


def load_workload(tracefile: str | Path, injectionfile: str | Path | None = None) -> Trace:
    """The trace, with the injection's advance reservations merged in (Haizea's [tracefile] injectionfile).

    TraceError for an unreadable file; ValueError for an injection that breaks Haizea's rules (merge_traces).
    """
    trace = read_trace(tracefile)
    if injectionfile is None:
        return trace
    return merge_traces(trace, read_trace(injectionfile))


def to_request(lease: TraceLease) -> LeaseRequest:
    return LeaseRequest(
        id=lease.id,
        type=lease.type,
        submit=lease.submit_s,
        start=lease.start_s,
        duration=lease.duration_s,
        vnodes=lease.vnodes,
        preemptible=lease.preemptible,
        real_duration=lease.real_duration_s,
        deadline=lease.deadline_s,
    )


def fleet(site: tuple[Res, ...], bandwidth: int) -> dict[int, Res]:
    """Nodes 1..N in site order. A site that declares no network gets the migration bandwidth on each side,
    so that a node moves one memory image at a time (Haizea gives such nodes a huge figure instead)."""
    return {
        i: Res(c.cpu, c.mem, c.disk, c.net_in or bandwidth, c.net_out or bandwidth)
        for i, c in enumerate(site, start=1)
    }


def setup(trace: Trace, haizea: HaizeaConfig | None) -> tuple[dict[int, Res], SchedulerConfig]:
    """The fleet (the trace's <site>, or the config's `resources`) and the scheduler config for a replay."""
    options = haizea.scheduling_options() if haizea else {}
    config = SchedulerConfig.from_options(options)
    spec = haizea.resources if haizea else None
    if spec and spec != "in-tracefile":
        site = parse_resources(spec)
    elif trace.site:
        site = trace.site
    else:
        raise ValueError(f"{trace.path}: no <site> in the trace and no resources in the config")
    return fleet(site, config.migration_bandwidth), config


@dataclass
class ForecastAccuracy:
    """How far each best-effort lease's start, as estimated when it was submitted, was from its actual start
    (issue 48): the estimate a user is shown at submission, for a lease the queue holds the queue forecast's
    (`estimated_start`), for one planned at once its planned start."""

    # |actual - estimated| in seconds, one per started lease; actual - estimated (positive: it started later).
    errors: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)
    # The same for the leases the queue held at submission: the forecast's own (the rest were planned at once).
    queued_errors: list[float] = field(default_factory=list)
    no_estimate: int = 0  # submitted with no estimate at all (a forecast that could not place it)
    never_started: int = 0
    # The queued leases that got a calibrated range at submission (leases/scheduling/calibration.py): the
    # likely start's error, the forecast's own error for the same leases, and whether the start fell in the range.
    likely_errors: list[float] = field(default_factory=list)
    likely_baseline: list[float] = field(default_factory=list)
    in_range: int = 0

    def summary(self) -> dict[str, Any]:
        covered = self.in_range / len(self.likely_errors) if self.likely_errors else None
        return {**_accuracy(self.errors, self.late), "no_estimate": self.no_estimate,
                "never_started": self.never_started, "queued": _accuracy(self.queued_errors, []),
                "likely": {**_accuracy(self.likely_errors, []), "range_coverage": covered},
                "likely_baseline": _accuracy(self.likely_baseline, [])}  # fmt: skip


def _accuracy(errors_in: list[float], late_in: list[float]) -> dict[str, Any]:
    """Shares within 1 min, 10 min and 1 h, the median and p90 absolute errors, and how many started late."""
    errors = sorted(errors_in)
    n = len(errors)

    def within(s: float) -> float | None:
        return sum(1 for e in errors if e <= s) / n if n else None

    def pct(p: float) -> float | None:
        return errors[min(n - 1, int(p * (n - 1) + 0.5))] if n else None

    late = sum(1 for d in late_in if d > 60)
    return {
        "leases": n,
        "within_1_min": within(60),
        "within_10_min": within(600),
        "within_1_h": within(3600),
        "median_abs_error_s": pct(0.5),
        "p90_abs_error_s": pct(0.9),
        "started_later_than_estimated": late / n if n and late_in else None,
    }


def replay(
    trace: Trace,
    capacities: Mapping[int, Res],
    config: SchedulerConfig,
    *,
    check: bool = False,
    progress: Callable[[float, int, int], None] | None = None,
    label: Callable[[float], str] | None = None,
    accuracy: ForecastAccuracy | None = None,
    exact_runtimes: bool = False,
) -> ReplayResult:
    """Run the whole trace; `check` runs the invariants after every step (slow on large traces). With `accuracy`,
    each best-effort lease's estimated start at its submission is kept and compared with its actual start at the
    end; `exact_runtimes` runs every lease for its whole requested duration (no early ends), where the forecast,
    which plans with the requested durations, can only be wrong through what arrives after."""
    sched = Scheduler(capacities, config, label=label) if label else Scheduler(capacities, config)
    pending = (
        [replace(x, real_duration_s=None) for x in trace.leases] if exact_runtimes else list(trace.leases)
    )
    estimated: dict[int, float | None] = {}
    queued_at_submission: set[int] = set()
    # Learnt as leases start, as the console learns it from leases that have started (never from the future).
    calibration = WaitCalibration()
    likely: dict[int, Likely | None] = {}
    waiting: dict[
        int, tuple[float, float]
    ] = {}  # queued at submission, not started yet: (submitted, estimate)
    i = steps = 0
    while True:
        t = _next_time(sched, pending, i)
        if t is None:
            break
        sched.advance(t, run_queue=False)
        batch = []
        while i < len(pending) and pending[i].submit_s <= t:
            batch.append(pending[i])
            i += 1
        # Haizea hands in every request of an instant, decides the ARs and IMs, then runs the queue (§3.2).
        for lease in sorted(batch, key=lambda x: x.type == BEST_EFFORT):
            sched.submit(to_request(lease), t, defer=True)
        sched.advance(t)
        if accuracy is not None:
            for lid in [lid for lid in waiting if sched.leases[lid].first_start is not None]:
                calibration.observe(*waiting.pop(lid), sched.leases[lid].first_start)  # type: ignore[arg-type]
            new = [x.id for x in batch if x.type == BEST_EFFORT]
            _estimate(sched, new, t, estimated, queued_at_submission)
            for lid in new:
                est = estimated.get(lid)
                if lid in queued_at_submission and est is not None:
                    waiting[lid] = (t, est)
                    likely[lid] = calibration.likely(t, est)
        sched.take_changes()
        steps += 1
        if check:
            check_invariants(sched)
        if progress:
            progress(t, i, len(pending))
    if check:
        check_invariants(sched, final=True)
    if accuracy is not None:
        for lid, est in estimated.items():
            actual = sched.leases[lid].first_start
            if actual is None:
                accuracy.never_started += 1
            elif est is None:
                accuracy.no_estimate += 1
            else:
                accuracy.errors.append(abs(actual - est))
                accuracy.late.append(actual - est)
                if lid in queued_at_submission:
                    accuracy.queued_errors.append(abs(actual - est))
                seen = likely.get(lid)
                if seen is not None:
                    accuracy.likely_errors.append(abs(actual - seen.start))
                    accuracy.likely_baseline.append(abs(actual - est))
                    accuracy.in_range += seen.low <= actual <= seen.high
    return ReplayResult(trace, sched, metrics(sched), steps)


def _estimate(
    sched: Scheduler, new: list[int], now: float, out: dict[int, float | None], queued_out: set[int]
) -> None:
    """What each newly submitted best-effort lease was told of its start: its planned start, or, queued, the
    queue forecast's estimate (as the lease page and `estimated_start` give it)."""
    queued = {lid: i for i, lid in enumerate(sched.queue)}
    waiting = [lid for lid in new if lid in queued]
    queued_out.update(waiting)
    estimates = forecast(sched, now, limit=max(queued[lid] for lid in waiting) + 1) if waiting else {}
    for lid in new:
        rec = sched.leases[lid]
        if lid in queued:
            out[lid] = estimates[lid].start if lid in estimates else None
        else:
            vm = rec.current_vm()
            out[lid] = vm.start if vm is not None else rec.first_start


def _next_time(sched: Scheduler, pending: list[TraceLease], i: int) -> float | None:
    times = [
        x
        for x in (sched.next_event_time(), pending[i].submit_s if i < len(pending) else None)
        if x is not None
    ]
    return min(times) if times else None


def metrics(sched: Scheduler) -> Metrics:
    leases = list(sched.leases.values())
    be = [r for r in leases if r.request.type == BEST_EFFORT and r.state == LeaseState.DONE]
    ars = [r for r in leases if r.request.type == ADVANCE_RESERVATION]
    waits = [r.first_start - r.request.submit for r in be if r.first_start is not None]
    slowdowns = [(r.end - r.request.submit) / max(r.run_time, 10.0) for r in be if r.end is not None]
    return Metrics(
        leases=len(leases),
        last_best_effort_end_s=max((r.end for r in be if r.end is not None), default=None),
        mean_wait_s=sum(waits) / len(waits) if waits else None,
        mean_bounded_slowdown=sum(slowdowns) / len(slowdowns) if slowdowns else None,
        utilisation=_utilisation(sched, leases),
        ar_accepted=sum(1 for r in ars if r.state != LeaseState.REJECTED),
        ar_rejected=sum(1 for r in ars if r.state == LeaseState.REJECTED),
    )


def _utilisation(sched: Scheduler, leases: list[LeaseRecord]) -> float:
    """CPU-seconds the VMs held over CPU-seconds the fleet had, from the trace start to the last end."""
    horizon = max((r.end for r in leases if r.end is not None), default=0.0)
    total = sum(sched.table.capacity(n).cpu for n in sched.table.nodes) * horizon
    used = 0.0
    for rec in leases:
        for r in rec.reservations:
            if r.kind == VM and r.status != CANCELLED:
                cpu = sum(rec.request.vnodes[v - 1].cpu for v in r.nodes)
                used += cpu * (min(r.end, horizon) - r.start)
    return used / total if total else 0.0


# -- invariants ------------------------------------------------------------------------------------------


def check_invariants(sched: Scheduler, *, final: bool = False) -> None:
    """No node over capacity at any instant (from the scheduler's own records, not the table's arithmetic);
    at the end, every lease done, rejected or cancelled and every done lease's run time equal to its requested
    or real duration."""
    _check_capacity(sched)
    if final:
        for rec in sched.leases.values():
            _check_final(rec)


def _check_capacity(sched: Scheduler) -> None:
    deltas: dict[int, list[tuple[float, int, Res]]] = {n: [] for n in sched.table.nodes}
    for rec in sched.leases.values():
        for r in rec.reservations:
            if r.status == CANCELLED or r.end <= r.start:
                continue
            for node, use in sched.alloc_of(rec, r).items():
                deltas[node] += [(r.start, 1, use), (r.end, 0, use)]
    for node, events in deltas.items():
        cap = sched.table.capacity(node)
        used = Res()
        for t, sign, use in sorted(events, key=lambda e: (e[0], e[1])):
            used = used + use if sign else used - use
            if sign and not used.fits_in(cap):
                raise InvariantError(f"node {node} over capacity at t={t}: uses {used}, has {cap}")


def _check_final(rec: LeaseRecord) -> None:
    lid = rec.request.id
    if rec.state not in _FINAL:
        raise InvariantError(f"lease {lid} ended the replay {rec.state}, not done, rejected or cancelled")
    if rec.state != LeaseState.DONE:
        return
    real = rec.request.real_duration
    expected = rec.request.duration if real is None else min(real, rec.request.duration)
    if abs(rec.run_time - expected) > _EPS:
        raise InvariantError(f"lease {lid} ran {rec.run_time} s, expected {expected} s")


# -- JSON ------------------------------------------------------------------------------------------------


def as_json(result: ReplayResult, start: datetime) -> dict[str, Any]:
    """The one object `replay --json` prints; times are ISO on the trace's clock."""

    def iso(t: float | None) -> str | None:
        return None if t is None else (start + timedelta(seconds=t)).isoformat()

    injected = set(result.trace.injected)
    leases = []
    for rec in sorted(result.scheduler.leases.values(), key=lambda r: r.request.id):
        leases.append(
            {
                "id": rec.request.id,
                "type": rec.request.type,
                "injected": rec.request.id in injected,
                "state": str(rec.state),
                "submitted": iso(rec.request.submit),
                "start": iso(rec.first_start),
                "end": iso(rec.end),
                "reservations": [
                    {
                        "kind": r.kind,
                        "start": iso(r.start),
                        "end": iso(r.end),
                        "nodes": sorted(set(r.nodes.values()) | set(r.sources.values())),
                        "status": r.status,
                    }
                    for r in rec.reservations
                ],
            }
        )
    m = result.metrics
    workload = {
        "trace": result.trace.name,
        "injection": result.trace.injection,
        "injected_leases": len(injected),
    }
    metrics = {k: getattr(m, k) for k in Metrics.__dataclass_fields__}
    return {"workload": workload, "leases": leases, "metrics": metrics}


# -- one configured run, and sweeps over a multi-configuration ------------------------------------------------


def run_config(
    haizea: HaizeaConfig | None,
    tracefile: str | Path,
    injectionfile: str | Path | None = None,
    **kwargs: Any,
) -> ReplayResult:
    """Replay a trace (plus injection) under a Haizea config; kwargs go to `replay`."""
    trace = load_workload(tracefile, injectionfile)
    capacities, config = setup(trace, haizea)
    return replay(trace, capacities, config, **kwargs)


@dataclass(frozen=True)
class SweepRun:
    """One trace x injection combination of a multi-configuration, with its files located on this disk."""

    config: HaizeaConfig
    tracefile: str
    injectionfile: str | None


@dataclass(frozen=True)
class SweepRow:
    """One result line of a sweep: what ran, the metrics, and what it cost (CPU seconds of the worker)."""

    profile: str | None
    trace: str
    injection: str | None
    metrics: Metrics
    steps: int
    cpu_s: float


SWEEP_COLUMNS = ("profile", "trace", "injection", *Metrics.__dataclass_fields__, "steps", "cpu_s")


def sweep_runs(configs: Iterable[HaizeaConfig], roots: Iterable[str | Path] = ()) -> list[SweepRun]:
    """The runs of an expanded multi-configuration; ValueError when a config names no trace."""
    roots = tuple(roots)
    runs = []
    for c in configs:
        if not c.tracefile:
            raise ValueError(f"{c.path}: profile {c.profile} names no tracefile")
        inj = c.injectionfile
        runs.append(SweepRun(c, str(locate(c.tracefile, roots)), str(locate(inj, roots)) if inj else None))
    return runs


def run_sweep_one(run: SweepRun) -> SweepRow:
    """Replay one combination; a module-level function so that worker processes can be handed it."""
    started = time.process_time()
    result = run_config(run.config, run.tracefile, run.injectionfile)
    return SweepRow(
        profile=run.config.profile,
        trace=Path(run.tracefile).stem,
        injection=Path(run.injectionfile).stem if run.injectionfile else None,
        metrics=result.metrics,
        steps=result.steps,
        cpu_s=time.process_time() - started,
    )


def sweep(
    runs: list[SweepRun], *, jobs: int = 1, progress: Callable[[int, int], None] | None = None
) -> list[SweepRow]:
    """Every run, in `jobs` worker processes (in this process when 1); rows come back in the runs' order."""
    rows: list[SweepRow | None] = [None] * len(runs)
    done = 0
    if jobs <= 1 or len(runs) <= 1:
        for i, run in enumerate(runs):
            rows[i] = run_sweep_one(run)
            done += 1
            if progress:
                progress(done, len(runs))
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(runs))) as pool:
            futures = {pool.submit(run_sweep_one, run): i for i, run in enumerate(runs)}
            for future in as_completed(futures):
                rows[futures[future]] = future.result()
                done += 1
                if progress:
                    progress(done, len(runs))
    return [row for row in rows if row is not None]


def sweep_record(row: SweepRow) -> dict[str, Any]:
    """A row as a flat dict under SWEEP_COLUMNS, for CSV and JSON."""
    return {
        "profile": row.profile,
        "trace": row.trace,
        "injection": row.injection,
        **{k: getattr(row.metrics, k) for k in Metrics.__dataclass_fields__},
        "steps": row.steps,
        "cpu_s": round(row.cpu_s, 3),
    }


# -- time series for plots ---------------------------------------------------------------------------------

_QUEUED = frozenset({str(LeaseState.QUEUED), str(LeaseState.SUSPENDED_QUEUED)})


def timeline(sched: Scheduler) -> list[tuple[float, float, int]]:
    """(t, CPU utilisation of the fleet, best-effort leases waiting in the queue) at every instant either
    changes, from the trace start to the last end; each value holds until the next row's t."""
    total = sum(sched.table.capacity(n).cpu for n in sched.table.nodes)
    cpu: dict[float, float] = {}
    queued: dict[float, int] = {}
    for rec in sched.leases.values():
        for r in rec.reservations:
            if r.kind == VM and r.status != CANCELLED and r.end > r.start:
                use = sum(rec.request.vnodes[v - 1].cpu for v in r.nodes)
                cpu[r.start] = cpu.get(r.start, 0.0) + use
                cpu[r.end] = cpu.get(r.end, 0.0) - use
        for t, before, after in rec.history:
            step = (after in _QUEUED) - (before in _QUEUED)
            if step:
                queued[t] = queued.get(t, 0) + step
    rows: list[tuple[float, float, int]] = []
    used, waiting = 0.0, 0
    for t in sorted(set(cpu) | set(queued)):
        used += cpu.get(t, 0.0)
        waiting += queued.get(t, 0)
        rows.append((t, used / total if total else 0.0, waiting))
    return rows
