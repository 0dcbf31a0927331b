"""The boundary between the database and the pure scheduler, and the plan applier.

`planning(now)` is the one place where plans are made and committed: it takes the scheduler lock (a PostgreSQL
advisory transaction lock; on SQLite the IMMEDIATE write transaction), brings an in-memory Scheduler up to the
database's version, lets the caller submit / cancel / advance, and writes the scheduler's change journal back in the
same transaction. Because the decision and its commit are one serialised step, two submitters (or a submitter and
the tick) can never both take the last free capacity of a node: the second one plans on the first one's result.

The Scheduler is cached per process and reused while the database's version is the one it planned: a reload costs
one read of every live lease, so a burst of submissions to one process does not pay it each time. Only the holder of
the plan lock touches the cached object, so threads of one process can share it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
from django.conf import settings
from django.db import OperationalError, connections, router, transaction
from django.db.models import Exists

from fleet import affinity, capacity, placement, reports
from fleet.models import PlacementReport
from fleet.placement import read_fleet
from leases import forecasting, pass_metrics, reads, vnodes
from leases.alerts import raise_alert
from leases.instance_rows import present_instances, sync_many
from leases.lifecycle import TERMINAL_LEASE_STATES, LeaseState
from leases.models import (
    LIVE_RESERVATION_STATUSES,
    Allocation,
    Lease,
    LeaseEvent,
    PlanVersion,
    Reservation,
    SchedulerState,
)
from leases.scheduler import (
    Change,
    Decision,
    LeaseRecord,
    LeaseRequest,
    ReservationRecord,
    Scheduler,
    SchedulerConfig,
)
from leases.slottable import Res
from slotkeeper import audit, events, metrics, outbox, planlock, planwake
from slotkeeper.audit import actor_label
from slotkeeper.bulk import Row, insert_many, pipelined, update_many
from slotkeeper.models import AuditEntry
from slotkeeper.statements import compiled

log = logging.getLogger(__name__)
# Node names per cached scheduler (see Planning.names).
_names: weakref.WeakKeyDictionary[Scheduler, dict[int, str]] = weakref.WeakKeyDictionary()


def to_epoch(dt: datetime) -> float:
    return dt.timestamp()


def from_epoch(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def node_capacity(node: capacity.NodeState) -> Res:
    """What the slot table plans with on a node: its allocatable capacity (docs/capacity.md)."""
    return _as_res(capacity.node_limits(node))


@lru_cache(maxsize=4096)  # every pass asks for every node's; a fleet has few distinct figures
def _as_res(limits: capacity.Limits) -> Res:
    return Res(cpu=limits.cpu_cores * 100, mem=limits.mem_mib, disk=limits.disk_gib)


def scheduler_config() -> SchedulerConfig:
    """Haizea's options from settings, with the live service's own decisions (docs/scheduler.md)."""
    config = SchedulerConfig.from_options(getattr(settings, "SLOTKEEPER_SCHEDULING", {}))
    return replace(config, whole_window_retry=True, rank_by_slots=True)


def request_of(
    lease: Lease, groups: Sequence[affinity.GroupMembers] = (), nodes: Sequence[capacity.NodeState] = ()
) -> LeaseRequest:
    """The scheduler's view of a lease: its size and times, and what its capabilities and groups (reads.lease_groups)
    say about the nodes `nodes`: the ones it may never use, and how it spreads over the rest."""
    rules = affinity.spread(groups, [n.id for n in nodes]) if groups else affinity.Spread()
    return LeaseRequest(
        id=lease.pk,
        type=lease.type,
        submit=to_epoch(lease.submitted_at),
        start=to_epoch(lease.requested_start) if lease.requested_start else None,
        duration=lease.duration_s,
        vnodes=tuple(vnodes.as_res(v) for v in lease.vnodes),
        preemptible=lease.preemptible,
        real_duration=lease.real_duration_s,
        spread=rules.limit,
        taken=rules.taken,
        avoid=rules.avoid,
        barred=barred_nodes(lease.capabilities or (), groups, nodes),
        capabilities=frozenset(lease.capabilities or ()),
    )


def barred_nodes(
    capabilities, groups: Sequence[affinity.GroupMembers], nodes: Sequence[capacity.NodeState]
) -> tuple[tuple[int, str], ...]:
    """(node id, "code: sentence") for each node the lease may never use: a capability it lacks, or a hard group
    rule that forbids it (the same rule the approval and the agent's late check apply)."""
    need = set(capabilities)
    if not need and not any(group.members for group in groups):
        return ()  # most leases: nothing bars a node (was a dict of every node's name per lease)
    names = {n.id: n.name for n in nodes}
    out: dict[int, str] = {}
    for node in nodes:
        if need and not need <= node.capabilities:
            out[node.id] = f"missing_capability: lacks {', '.join(sorted(need - node.capabilities))}"
            continue
        for group in groups:
            unfit = affinity.unfit(group, node.id, names=names) if group.members else None
            if unfit is not None:
                out[node.id] = f"{unfit.code}: {unfit.reason}"
                break
    return tuple(sorted(out.items()))


def record_of(
    lease: Lease,
    reservations: list[Reservation],
    groups: Sequence[affinity.GroupMembers] = (),
    nodes: Sequence[capacity.NodeState] = (),
) -> LeaseRecord:
    return LeaseRecord(
        request=request_of(lease, groups, nodes),
        state=LeaseState(lease.state),
        reservations=[
            ReservationRecord(
                rid=r.rid,
                lease_id=lease.pk,
                kind=r.kind,
                start=to_epoch(r.start),
                end=to_epoch(r.end),
                nodes={int(k): v for k, v in r.nodes.items()},
                status=r.status,
                sources={int(k): v for k, v in (r.sources or {}).items()},
            )
            for r in reservations
        ],
        run_time=lease.run_time_s,
        first_start=to_epoch(lease.first_start) if lease.first_start else None,
        end=to_epoch(lease.ended_at) if lease.ended_at else None,
        lost_run_time=lease.lost_run_time_s,
        images={int(k): v for k, v in (lease.images or {}).items()},
        in_future=lease.in_future,
    )


@dataclass
class _Cached:
    version: int
    fingerprint: tuple
    scheduler: Scheduler


class _Cache:
    value: _Cached | None = None


_cache = _Cache()
# Held by a read (`consulting`) for as long as it asks the cached scheduler, and by a pass while it takes that
# scheduler out of the cache: a pass never changes the object a read is still asking, and a read never asks one a
# pass has taken. Never held while waiting for the database's locks (a read only SELECTs under it), so it cannot
# deadlock with the plan lock; each wait for it is bounded all the same.
_cache_lock = threading.Lock()

# How far a cached scheduler may be behind and still catch up; further, or with the versions it missed pruned,
# it reloads. Catching up re-reads the touched leases one version after another's union: past a few hundred
# versions that union approaches every live lease anyway.
MAX_CATCH_UP = 200
# PlanVersion rows kept (pruned every PRUNE_EVERY versions).
PLAN_VERSIONS_KEPT = 1000
PRUNE_EVERY = 100
# The most waiting intents one pass plans: a pass stays bounded however deep the queue, and the rest wait for
# the next one. A pass of 1,000 holds the plan lock about 1 s at 1,000 nodes on a two-core host (a tenth of
# PLAN_LOCK_TIMEOUT_S); against 500, a 10,000-request burst needs half the passes, and so half their fixed cost
# (the commit's flush, the fleet read, the queue run): 9.6-9.7 s against 10.1-10.3 s (docs/BENCHMARKS.md).
MAX_BATCH = 1000
# A pass's reports and audit rows are written this many at a time, pipelined with building the next ones.
REPORT_CHUNK = 100


@dataclass
class CacheStats:
    """How this process's last pass got its scheduler (tests and /metrics read it)."""

    how: str = ""  # "kept", "caught_up", "reloaded"
    behind: int = 0  # versions the cache was behind
    reread: int = 0  # leases re-read by catching up


cache_stats = CacheStats()


@lru_cache(maxsize=4096)  # a pass's messages and reports name the same few instants thousands of times
def live_label(t: float) -> str:
    """A time in the live service's messages: the date as well, so a reservation next week does not read as
    "00:00–00:00" (UTC; the console shows times in the reader's zone)."""
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC" if moment.second == 0 else "%Y-%m-%d %H:%M:%S UTC")


def load(nodes: list[capacity.NodeState], next_rid: int) -> Scheduler:
    """A fresh Scheduler holding every lease that is not over, with every reservation it ever had.

    Not only the live reservations: a lease in the middle of a suspension needs its finished VM reservation to
    know where its memory images are, and loading only live rows lost it (and then every tick failed)."""
    names = {n.id: n.name for n in nodes}
    sched = Scheduler(
        {n.id: node_capacity(n) for n in nodes},
        scheduler_config(),
        label=live_label,
        node_label=lambda node: names.get(node, f"node {node}"),
    )
    for rec in _records(Lease.objects.all(), nodes):
        sched.restore(rec)
    sched.continue_rids_after(next_rid)
    return sched


# A lease in state `new` is an intent: stored, waiting for a planning pass (group commit). No scheduler holds it.
NOT_PLANNED = [*(s.value for s in TERMINAL_LEASE_STATES), LeaseState.NEW.value]


def _records(leases, nodes: list[capacity.NodeState]) -> list[LeaseRecord]:
    """The scheduler's records of the planned, unfinished leases among `leases`, in the order to restore them."""
    live = list(leases.exclude(state__in=NOT_PLANNED).order_by("submitted_at", "id"))
    by_lease: dict[int, list[Reservation]] = {}
    for r in Reservation.objects.filter(lease__in=[lease.pk for lease in live]).order_by("start", "rid"):
        by_lease.setdefault(r.lease_id, []).append(r)
    groups = reads.groups_by_lease([lease.pk for lease in live])
    records = [
        record_of(lease, by_lease.get(lease.pk, []), groups.get(lease.pk, ()), nodes) for lease in live
    ]
    # Leases with work under way first: what runs is in the table before any plan for later, so that when a node's
    # capacity has shrunk it is the unstarted plans that no longer fit, and are planned again, never running work.
    records.sort(key=lambda rec: not any(r.status == "active" for r in rec.reservations))
    return records


def catch_up(sched: Scheduler, lease_ids: set[int], nodes: list[capacity.NodeState]) -> int:
    """Brings a cached scheduler up to the database by re-reading only the leases that the versions it missed
    touched (PlanVersion rows), and every lease sharing a group with one of them (a group's spread rules read where
    its members run). Returns how many leases it re-read.

    Every touched lease is forgotten first and then restored as the database holds it, so the table passes only
    through states that are subsets of a committed, non-overcommitted plan."""
    ids = set(lease_ids)
    if ids:
        links = Lease.groups.through.objects
        group_ids = set(links.filter(lease_id__in=ids).values_list("group_id", flat=True))
        if group_ids:
            ids |= set(links.filter(group_id__in=group_ids).values_list("lease_id", flat=True))
    for lease_id in ids:
        sched.forget(lease_id)
    records = _records(Lease.objects.filter(pk__in=ids), nodes) if ids else []
    for rec in records:
        sched.restore(rec)
    return len(records)


def observed_extra(
    nodes: list[capacity.NodeState], sched: Scheduler, t: float, excluded: Mapping[int, str]
) -> tuple[dict[int, Res], npt.NDArray[np.int64]]:
    """The now-gate's figures (docs/capacity.md): per usable node, the memory it is observed to use beyond its
    remembered baseline and what the plan holds there now, and the disk it is short of what the plan thinks is
    free. Seed 001's rule: a node is charged the worse of observed and committed use. Returned twice: per node,
    and as cpu/memory/disk columns in the slot table's node order (what the report's vectorised verdicts use)."""
    arrays = sched.table.arrays()
    pos = arrays.pos
    columns = np.zeros((len(arrays.nodes), 3), dtype=np.int64)
    seen = [n for n in nodes if n.observed_mem_used_mib is not None and n.id in pos and n.id not in excluded]
    if not seen:
        return {}, columns
    # In columns: a loop over 1,000 nodes was an eighth of every planning pass.
    rows = np.fromiter((pos[n.id] for n in seen), np.int64, len(seen))
    planned = arrays.level_at(t)[rows]  # every node's planned use at t in one pass
    used = np.fromiter((n.observed_mem_used_mib for n in seen), np.int64, len(seen))
    remembered = np.fromiter((n.idle_baseline_mib or 0 for n in seen), np.int64, len(seen))
    mem = np.maximum(0, used - np.maximum(remembered, capacity.BASELINE_FLOOR_MIB) - planned[:, 1])
    disk_free = np.fromiter(
        (n.disk_free_gib if n.disk_free_gib is not None else np.nan for n in seen), np.float64, len(seen)
    )
    # The slot table's disk capacity is the node's allocatable disk (node_capacity; the cache is keyed on it).
    plan_free = arrays.caps[rows, 2] - planned[:, 2]
    short = np.ceil(plan_free - (disk_free - capacity.DISK_RESERVE_GIB))
    disk = np.where(np.isnan(disk_free), 0, np.maximum(0, np.nan_to_num(short))).astype(np.int64)
    columns[rows, 1] = mem
    columns[rows, 2] = disk
    out = {
        n.id: _extra_res(m, d) for n, m, d in zip(seen, mem.tolist(), disk.tolist(), strict=True) if m or d
    }
    return out, columns


# One Res per distinct (memory, disk) figure: a node whose figures did not move since the last pass gets the very
# object it had, so Scheduler.observe finds the figures unchanged by identity (a dataclass __eq__ per node
# otherwise), and a pass builds no Res for it. Bounded: cleared when it grows past a fleet's worth many times over.
_extra_memo: dict[tuple[int, int], Res] = {}


def _extra_res(mem: int, disk: int) -> Res:
    got = _extra_memo.get((mem, disk))
    if got is None:
        if len(_extra_memo) >= 1 << 16:
            _extra_memo.clear()
        got = _extra_memo[(mem, disk)] = Res(mem=mem, disk=disk)
    return got


def _excluded(fleet: placement.FleetRead) -> dict[int, str]:
    return fleet.excluded(settings.SLOTKEEPER["HEALTH_MAX_AGE_S"])


@dataclass
class Planning:
    scheduler: Scheduler
    now: datetime
    excluded: dict[int, str]
    nodes: list[capacity.NodeState]
    # Leases whose placement report the caller wrote; the applier writes one for every other lease placed.
    reported: set[int] = field(default_factory=set)
    # The periodic tick's pass while it holds the forecast runner: a large queue's forecast is snapshotted under
    # the lock and handed back in `forecast`, to be computed after the pass commits (leases/forecasting.py).
    tick: bool = False
    forecast: forecasting.Job | None = None
    # The decided requests' messages, written with the rest of their rows by the applier (`_write_leases`).
    messages: dict[int, str] = field(default_factory=dict)
    # Set by a caller that sent future reservations back to the queue (Scheduler.make_way): it runs the queue.
    make_way: bool = False

    @property
    def t(self) -> float:
        return to_epoch(self.now)

    @cached_property
    def names(self) -> dict[int, str]:
        """Node id -> name. A cached scheduler is only reused while every node keeps its name (the fleet
        fingerprint holds them), so the mapping is built once per scheduler, not once per pass."""
        got = _names.get(self.scheduler)
        if got is None:
            got = _names[self.scheduler] = {n.id: n.name for n in self.nodes}
        return got


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


def _take_cached() -> _Cached | None:
    """The cached scheduler, taken out of the cache for a pass (until the pass commits, nothing in memory can be
    trusted). Waits for a read that is asking it; past the plan lock's timeout the pass loads its own instead."""
    if not _cache_lock.acquire(timeout=planlock.timeout_s()):
        log.warning("a read held the cached scheduler past the plan lock's timeout; the pass loads its own")
        return None
    try:
        cached, _cache.value = _cache.value, None
        return cached
    finally:
        _cache_lock.release()


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


def _forget(sched: Scheduler) -> None:
    if _cache.value is not None and _cache.value.scheduler is sched:
        _cache.value = None


def _current_scheduler(
    cached: _Cached | None, state: SchedulerState, nodes: list[capacity.NodeState], fingerprint: tuple
) -> Scheduler:
    """The cached scheduler if it is current, caught up if it is a little behind, else a fresh load."""
    behind = state.version - cached.version if cached is not None else -1
    if cached is not None and cached.fingerprint == fingerprint and 0 <= behind <= MAX_CATCH_UP:
        if behind == 0:
            _note_cache("kept", 0, 0)
            return cached.scheduler
        missed = list(
            PlanVersion.objects.filter(version__gt=cached.version, version__lte=state.version).values_list(
                "leases", flat=True
            )
        )
        if len(missed) == behind:  # none pruned
            sched = cached.scheduler
            reread = catch_up(sched, {lease_id for ids in missed for lease_id in ids}, nodes)
            sched.continue_rids_after(state.next_rid)
            _note_cache("caught_up", behind, reread)
            return sched
    _note_cache("reloaded", behind, 0)
    return load(nodes, state.next_rid)


def _note_cache(how: str, behind: int, reread: int) -> None:
    cache_stats.how, cache_stats.behind, cache_stats.reread = how, behind, reread
    metrics.inc("slotkeeper_scheduler_cache_total", how=how)
    if reread:
        metrics.inc("slotkeeper_scheduler_caught_up_leases_total", reread)


# How many times one pass starts its batch again after a submit raised (`_restart_pass`: a reload and the batch's
# earlier submits again, each). Past that, the requests after the last one that raised wait for the next pass: a
# defect that makes every submit raise costs each pass a few restarts, never one per request of a 500-request
# batch (measured: 500 restarts over 5,000 live leases held the plan lock for 440 s).
MAX_RESTARTS = 3


def _plan_intents(plan: Planning) -> list[int]:
    """Plans every waiting lease request (state `new`, oldest first, at most MAX_BATCH) at the pass's one `now`:
    each submitted with the queue deferred, the queue processed once, then each request's decision written where
    its waiter reads it (the lease's message and state, its placement report), with its audit row and alert."""
    # The submitters prefetched (one read of each distinct user), not joined: a burst's requests come from a few
    # accounts, and the join built a user instance for every one of them.
    intents = list(
        Lease.objects.filter(state=LeaseState.NEW)
        .select_for_update(of=("self",))
        .prefetch_related("submitted_by")
        .order_by("submitted_at", "id")[:MAX_BATCH]
    )
    if not intents:
        return []
    sched = plan.scheduler
    groups = reads.groups_by_lease([lease.pk for lease in intents])
    unplannable: dict[int, str] = {}
    restarts = 0
    while True:
        got = _submit_intents(plan, intents, groups, unplannable)
        if not isinstance(got, Lease):
            decided = got
            break
        # A submit raised part-way: the scheduler holds half its changes (reservations, preempted leases, journal
        # entries of a lease it no longer knows, which `apply` would fail on in every pass from then on). Start
        # the batch again on the scheduler the pass started from, without the requests that failed.
        _restart_pass(plan)
        restarts += 1
        if restarts >= MAX_RESTARTS:
            intents = intents[: intents.index(got) + 1]  # the rest wait, untouched, for the next pass
    for lease in intents:
        if lease.pk in unplannable:
            _reject_unplannable(lease, unplannable[lease.pk], plan.now)
    sched.run_queue(plan.t)
    # A request accepted by `submit` may have been isolated (failed) while the queue or its start ran: its
    # decision is a failure, with the reason, not the acceptance `submit` returned.
    isolated = dict(sched.isolated)
    decided = [
        (lease, _isolated_decision(lease.pk, isolated[lease.pk]) if lease.pk in isolated else decision)
        for lease, decision in decided
    ]
    reports, audits = [], []
    # The reports and audit rows go in chunks, pipelined: the server writes one chunk while the next one's
    # reports are built (bulk.pipelined; nothing reads their keys back). The plan no longer changes from here,
    # so requests that hold nothing share their verdicts by shape and window (`report_fields`).
    shared: dict = {}
    with pipelined():
        for lease, decision in decided:
            lease.message = sched.describe(lease.pk) if decision.accepted else decision.message
            plan.messages[lease.pk] = lease.message
            plan.reported.add(lease.pk)
            reports.append(
                placement_report(
                    plan,
                    lease.pk,
                    message=lease.message,
                    requested_by=actor_label(lease.submitted_by),
                    shared=shared,
                    code="" if decision.accepted else decision.code or "rejected",
                )
            )
            audits.append(
                audit.entry_row(
                    at=plan.now,
                    actor=lease.submitted_by,
                    action="lease.submit",
                    target=lease,
                    details={"type": lease.type, "accepted": decision.accepted, "message": decision.message},
                )
            )
            # A rejection is the client's answer (its 409), an audit row and a metric: no alert, which is for what
            # an operator must act on (one per rejected request buried the real ones). An isolation has its own.
            events.send_on_commit("lease-changed", lease=lease.pk)
            accepted = str(decision.accepted).lower()
            metrics.inc("slotkeeper_lease_submissions_total", type=lease.type, accepted=accepted)
            outcome = "placed" if decision.accepted else "rejected"
            metrics.inc("slotkeeper_placements_total", kind="lease", outcome=outcome)
            if len(reports) >= REPORT_CHUNK:
                _write_reports(reports, audits)
                reports, audits = [], []
        _write_reports(reports, audits)
    return [lease.pk for lease in intents]


def _write_reports(reports: list[Row], audits: list[Row]) -> None:
    insert_many(reports, model=PlacementReport, returning=False)
    insert_many(audits, model=AuditEntry, returning=False)


def _submit_intents(
    plan: Planning, intents: list[Lease], groups: Mapping, unplannable: dict[int, str]
) -> list[tuple[Lease, Decision]] | Lease:
    """Submits each request not yet found unplannable, deferring the queue. A request the scheduler cannot take
    must not fail every other request of the batch (or, left `new`, fail every pass after it): its reason goes
    into `unplannable`, and the rest go on. Returns the decisions, or the request whose submit raised: that one
    may have changed the scheduler before it raised, and the batch must start again (`_restart_pass`)."""
    sched = plan.scheduler
    decided: list[tuple[Lease, Decision]] = []
    for lease in intents:
        if lease.pk in unplannable:
            continue
        try:
            request = request_of(lease, groups.get(lease.pk, ()), plan.nodes)
        except Exception as exc:  # nothing was handed to the scheduler: it is as it was
            log.exception("lease request could not be planned", extra={"lease": lease.pk})
            unplannable[lease.pk] = f"the scheduler could not plan it: {type(exc).__name__}: {exc}"
            continue
        try:
            decided.append((lease, sched.submit(request, plan.t, plan.excluded, defer=True)))
        except Exception as exc:
            log.exception("lease request could not be planned", extra={"lease": lease.pk})
            unplannable[lease.pk] = f"the scheduler could not plan it: {type(exc).__name__}: {exc}"
            return lease
    return decided


def _prepare(sched: Scheduler, plan: Planning) -> None:
    """A pass's scheduler made ready to plan: this pass's exclusions in force, time moved to the pass's `now`, the
    now-gate's figures observed. The exclusions first: a cancel or an approval runs the queue without handing them
    over itself, and a scheduler rebuilt after a fleet change had none, so the queue placed leases on a node that
    had never sent a heartbeat (tests/leases/test_exclusions_every_pass.py)."""
    sched.use_exclusions(plan.excluded)
    sched.settle(plan.t)
    sched.replaced = []  # set again by this pass's advance(), if it runs one
    _observe(sched, plan)


def _observe(sched: Scheduler, plan: Planning) -> None:
    extra, columns = observed_extra(plan.nodes, sched, plan.t, plan.excluded)
    sched.observe(extra, columns, headroom_of(plan.nodes))


# The last headroom mapping handed to a scheduler, kept while every node's figure is the same: the scheduler keeps
# its ranking column by the mapping's identity.
_headroom_kept: dict[int, float] = {}


def headroom_of(nodes: Sequence[capacity.NodeState]) -> dict[int, float]:
    """Per node, its live CPU headroom (idle %, 0 when unknown or stale): the placer's tie-break between two nodes
    with as many free slots (seed 001: the idler node)."""
    global _headroom_kept
    got = {n.id: capacity.headroom_of(n) for n in nodes}
    if got != _headroom_kept:
        _headroom_kept = got
    return _headroom_kept


def _restart_pass(plan: Planning) -> None:
    """Puts the pass's scheduler back where the pass started: built again from the database (which this pass has
    not written yet) and prepared as `_planning` prepares it, in place, because the pass holds that object and
    caches it when it commits. Paid only when a submit raised: one read of every live lease, as a cache miss."""
    started = time.perf_counter()
    state = SchedulerState.objects.get(pk=1)
    fresh = load(plan.nodes, state.next_rid)
    _prepare(fresh, plan)
    plan.scheduler.take_over(fresh)
    took = time.perf_counter() - started
    log.warning("planning pass restarted after a failed submit", extra={"seconds": round(took, 3)})
    metrics.inc("slotkeeper_plan_pass_restarts_total")


def _isolated_decision(lease_id: int, reason: str) -> Decision:
    return Decision(
        False,
        lease_id,
        LeaseState.FAILED,
        f"isolated by the scheduler, which could not plan it: {reason}"[:2000],
    )


def _reject_unplannable(lease: Lease, reason: str, now: datetime) -> None:
    LeaseEvent.objects.create(lease=lease, at=now, from_state=lease.state, to_state=LeaseState.REJECTED)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.REJECTED, message=reason[:2000])
    PlacementReport.objects.create(
        created_at=now, subject=f"lease:{lease.pk}", request={"type": lease.type}, outcome="rejected",
        message=reason[:2000], requested_by=actor_label(lease.submitted_by),
    )  # fmt: skip
    audit.record(at=now, actor=lease.submitted_by, action="lease.submit", target=lease, reason=reason[:500])
    raise_alert("failed_placement", f"lease {lease.pk} {lease.name}: {reason}"[:2000], now, lease=lease)


# Threads of one process take turns at running a pass for the waiting requests; the others wait to be woken.
_pass_turn = threading.Lock()


def await_decision(lease_id: int, now: datetime, *, since: int | None = None) -> Lease:
    """Returns the lease row once a planning pass has decided the request `lease_id` (stored in state `new`),
    read as that pass left it, in the same query that finds it decided: whoever holds
    the plan lock plans every waiting request, so this caller either runs that pass itself (the lock was free) or
    sleeps until a pass commits (planwake) and looks again. Bounded: when no pass has committed for
    PLAN_LOCK_TIMEOUT_S it waits for the lock as every other writer does, and if even that times out it withdraws
    the request and raises PlanBusy (503). While passes keep committing it keeps waiting: intents are planned
    oldest first, so its turn comes within (requests ahead / MAX_BATCH) passes.

    It looks at its row only when it may have been decided: first (unless `since`, a planwake ticket taken before
    the request was stored, says no pass has named it since), then after a pass that named it (planwake), after
    a sleep that no pass ended (the fallback poll) and once the bound is reached; at every wake-up while this
    process cannot hear every pass (planwake.hears_all)."""
    if transaction.get_connection().in_atomic_block:
        # Inside a caller's transaction the intent is invisible to other processes: plan it here, in it.
        with planning(now):
            pass
        return Lease.objects.get(pk=lease_id)
    began = time.monotonic()
    deadline = began + planlock.timeout_s()
    look = since is None or not planwake.hears_all() or planwake.named_since(since, lease_id)
    seen = since
    while True:
        ticket = planwake.ticket()
        # Without the listener (not started yet, or its connection lost) another process's pass goes unheard:
        # look at every wake-up, as before passes named their requests.
        trusted = planwake.hears_all()
        if (
            look
            or seen is None
            or not trusted
            or planwake.named_since(seen, lease_id)
            or time.monotonic() >= deadline
        ):
            lease = reads.lease_row(lease_id)  # a request deleted meanwhile raises, as before it was decided
            if lease.state != LeaseState.NEW:
                return lease
        look, seen = False, ticket
        # A pass run after a wait plans at the time it runs, not at the time the request came in.
        at = now + timedelta(seconds=time.monotonic() - began) if time.monotonic() - began > 0.05 else now
        if time.monotonic() >= deadline:
            try:
                with planning(at):
                    continue
            except planlock.PlanBusy:
                # Answered 503 "try again", the request must have changed nothing: withdraw the intent, unless
                # a pass has taken it meanwhile (passes lock the intents they plan, so this waits for that one).
                if Lease.objects.filter(pk=lease_id, state=LeaseState.NEW).delete()[0]:
                    raise
                look = True
                continue
        if _try_pass(at):
            continue
        if getattr(settings, "DB_POOL", False):
            # A sleeping waiter gives its pooled connection back: a burst of waiters would otherwise hold every
            # connection of the pool while the pass that would wake them waits for one.
            transaction.get_connection().close()
        if planwake.wait(ticket, min(planwake.FALLBACK_POLL_S, max(0.0, deadline - time.monotonic()))):
            deadline = time.monotonic() + planlock.timeout_s()  # a pass committed: the queue is moving
        else:
            look = True  # no pass was heard of: look anyway (a lost notification, a deleted request)


def _try_pass(now: datetime) -> bool:
    if not _pass_turn.acquire(blocking=False):
        return False
    try:
        with planning(now, try_lock=True):
            pass
        return True
    except LockTaken:
        return False
    finally:
        _pass_turn.release()


def placement_report(
    plan: Planning,
    lease_id: int,
    *,
    message: str,
    requested_by: str = "",
    subject: str = "",
    shared: dict | None = None,
    code: str = "",
) -> Row:
    """An unsaved report of the scheduler's decision about a lease, every node's verdict in it (docs/capacity.md):
    over the VM reservation it got, or over the window it asked for (an AR's, or from now) when it got none. A
    bulk.Row of PlacementReport (`insert_many(rows, model=PlacementReport)`): a pass writes one for every lease
    it decides, only to be inserted (bench/bench_bulk.py: 1.5-1.7 µs a report less, built and inserted).

    `shared`: verdicts kept by `Scheduler.shared_key` while the plan does not change (see `report_fields`)."""
    sched = plan.scheduler
    rec = sched.leases[lease_id]
    req = rec.request
    vm = rec.current_vm()
    chosen: dict[int, Res] = {}
    if vm is not None:
        start, end = vm.start, vm.end
        chosen = sched.alloc_of(rec, vm)
        outcome = "placed"
    else:
        start = req.start if req.start is not None else plan.t
        end = start + req.duration
        outcome = "queued" if rec.state in (LeaseState.QUEUED, LeaseState.SUSPENDED_QUEUED) else "rejected"
    return Row(
        **report_fields(
            plan, req, start, end, outcome=outcome, message=message, chosen=chosen,
            requested_by=requested_by, subject=subject or f"lease:{lease_id}", shared=shared, code=code,
        )
    )  # fmt: skip


def report_row(plan: Planning, req: LeaseRequest, start: float, end: float, **fields: Any) -> PlacementReport:
    """`report_fields` as an unsaved PlacementReport (the preview and the moves save and read theirs)."""
    return PlacementReport(**report_fields(plan, req, start, end, **fields))


def report_fields(
    plan: Planning,
    req: LeaseRequest,
    start: float,
    end: float,
    *,
    outcome: str,
    message: str,
    subject: str,
    requested_by: str = "",
    chosen: Mapping[int, Res] | None = None,
    proposed: Sequence[int] = (),
    shared: dict | None = None,
    code: str = "",
) -> dict[str, Any]:
    """The fields of a report of `req` over [start, end): what it holds (`chosen`, added back) or would take
    (`proposed`), and every node's verdict, stored compactly (fleet/reports.py).

    `shared`, a dict the caller keeps while the plan, its exclusions and its `now` stay as they are: the stored
    verdicts of a request that holds and proposes nothing, kept under `Scheduler.shared_key` and handed to every
    later request with the same key (the same object: stored, never changed). A pass's reports of the requests
    it queued or rejected are written after its last decision, and a burst's queue shares a few shapes and
    windows by the hundred."""
    names = plan.names
    picked = list(chosen or {}) or list(proposed)
    key = None
    if shared is not None and not picked:
        key = plan.scheduler.shared_key(req, start, end)
    verdicts = shared.get(key) if shared is not None and key is not None else None
    if verdicts is None:
        verdicts = _verdicts(plan, req, start, end, chosen, proposed)
        if shared is not None and key is not None:
            shared[key] = verdicts
    return {
        "created_at": plan.now,
        "subject": subject,
        "request": {
            "type": req.type,
            "vnodes": [vnodes.as_json(v) for v in req.vnodes],
            "duration_s": req.duration,
        },
        "outcome": outcome,
        "code": code,
        "message": message,
        "chosen": [names.get(n, str(n)) for n in picked],
        "verdicts": verdicts,
        "requested_by": requested_by,
    }


def _verdicts(
    plan: Planning,
    req: LeaseRequest,
    start: float,
    end: float,
    chosen: Mapping[int, Res] | None,
    proposed: Sequence[int],
) -> dict[str, Any]:
    """Every node's verdict on `req` over [start, end), with the summary, in the stored form."""
    sched = plan.scheduler
    explained = sched.explain(
        req, start, end, chosen=chosen, proposed=proposed, excluded=plan.excluded, now=plan.t
    )
    names = plan.names
    size = explained.vm
    summary = reports.summary(
        {"cpu": size.cpu, "mem": size.mem, "disk": size.disk},
        explained.count,
        {names.get(n, str(n)): h for n, h in explained.holders},
        total=explained.total,
        now=start <= plan.t,
        window=f"{sched.label(start)}–{sched.label(end)}",
        largest=_largest(sched, names),
    )
    return reports.encode(explained.columns, start=start, end=end, summary=summary)


def _largest(sched: Scheduler, names: Mapping[int, str]) -> tuple[str, int] | None:
    """The node with the most allocatable memory (the lowest id among equals), from the slot table's columns."""
    arrays = sched.table.arrays()
    if not len(arrays.nodes):
        return None
    i = int(arrays.caps[:, 1].argmax())
    node = int(arrays.nodes[i])
    return names.get(node, f"node {node}"), int(arrays.caps[i, 1])


def _report_placed(plan: Planning, changes: list[Change]) -> None:
    """A report for every lease the pass placed that its caller did not report on (the queue placing a lease
    later, a due reservation placed again), so every placement explains itself."""
    placed = {
        c.lease_id
        for c in changes
        if c.what == "lease_state" and c.state in (LeaseState.READY, LeaseState.SUSPENDED_SCHEDULED)
    }
    rows = []
    messages = []
    replaced = dict(plan.scheduler.replaced)
    why = {c.lease_id: c.reason for c in changes if c.what == "lease_state" and c.reason}
    for lease_id in sorted(placed - plan.reported):
        rec = plan.scheduler.leases.get(lease_id)
        if rec is None or rec.current_vm() is None:
            continue
        message = f"placed by the queue: {plan.scheduler.describe(lease_id)}"
        if lease_id in why:  # the pass that placed it moved it off its plan first, or freed its room: say why
            message += f" ({why[lease_id]})"
        if lease_id in replaced:
            message = f"re-placed when its reservation came due ({replaced[lease_id]}): {plan.scheduler.describe(lease_id)}"
        rows.append(placement_report(plan, lease_id, message=message, requested_by="scheduler"))
        messages.append(Row(pk=lease_id, message=message))
    if rows:
        insert_many(rows, model=PlacementReport)
        # The decision message said "queued at position N"; it now says where the lease runs.
        update_many(messages, ["message"], model=Lease)


def _record_displaced(
    displaced: list[tuple[int, int, str]], nodes: list[capacity.NodeState], now: datetime
) -> None:
    """Says on each lease why its plan changed when a node's allocatable capacity shrank under it."""
    names = {n.id: n.name for n in nodes}
    for lease_id, node_id, outcome in displaced:
        node = names.get(node_id, f"node {node_id}")
        reason = f"its reservation no longer fit {node}, whose allocatable capacity shrank"
        if outcome == "failed":
            continue  # isolated: _record_isolated says so, with an alert
        lease = Lease.objects.filter(pk=lease_id).first()
        if lease is None:
            continue
        lease.message = f"{reason}; {'queued again' if outcome == 'queued again' else 'moved to other nodes'}"
        lease.save(update_fields=["message"])
        audit.record(at=now, actor=None, action="lease.replace", target=lease, reason=reason)
        log.warning("lease displaced", extra={"lease": lease_id, "node": node, "outcome": outcome})


def _record_stranded(stranded: Mapping[int, str], now: datetime) -> None:
    """Says on each advance reservation left booked on a draining or dead node why it could not be moved: on the
    lease (its message, which its page and the node's list of reservations show), in the audit feed, and as an
    alert, since an operator must decide (bring the node back, or cancel or move the reservation)."""
    for lease_id, why in stranded.items():
        lease = Lease.objects.filter(pk=lease_id).first()
        said = f"lease {lease_id} is {why}"[:2000]
        if lease is None or lease.message == said:
            continue  # said already (a scheduler loaded again finds it again)
        lease.message = said
        lease.save(update_fields=["message"])
        audit.record(at=now, actor=None, action="lease.stranded", target=lease, reason=why[:500])
        raise_alert("reservation_stranded", f"lease {lease_id} {lease.name}: {why}"[:2000], now, lease=lease)


def _record_isolated(isolated: list[tuple[int, str]], now: datetime) -> None:
    """Says why each isolated lease failed: on the lease, in the audit feed, as an alert, in the log."""
    if not isolated:
        return
    for lease_id, reason in isolated:
        lease = Lease.objects.filter(pk=lease_id).first()
        if lease is None:
            continue
        lease.message = f"isolated by the scheduler, which could not plan it: {reason}"[:2000]
        lease.save(update_fields=["message"])
        audit.record(at=now, actor=None, action="lease.isolate", target=lease, reason=reason[:500])
        raise_alert(
            "lease_isolated", f"lease {lease_id} {lease.name} was isolated: {reason}"[:2000], now, lease=lease
        )
        metrics.inc("slotkeeper_leases_isolated_total")
        log.error("lease isolated", extra={"lease": lease_id, "reason": reason})


def apply(sched: Scheduler, changes: list[Change], messages: Mapping[int, str] | None = None) -> set[int]:
    """Writes a change journal: lease states with their history, reservations and their per-node allocations,
    and `messages` (lease id -> the decided request's message).

    Batched: a burst (a bulk approval, a tick that starts a hundred reservations) costs a handful of statements,
    not a handful per change. The last snapshot of each reservation in the journal is the one written.
    """
    touched = {c.lease_id for c in changes}
    if not changes and not messages:
        return touched
    latest: dict[int, ReservationRecord] = {}
    for change in changes:
        if change.reservation is not None:
            latest[change.reservation.rid] = change.reservation
    if latest:
        _write_reservations(sched, latest)
    _write_leases(sched, changes, touched, messages or {})
    if changes:
        _sync_instances(sched, touched, changes)
    return touched


def _sync_instances(sched: Scheduler, touched: set[int], changes: list[Change]) -> None:
    when = from_epoch(max(c.at for c in changes))
    present = present_instances(touched)
    wanted = []
    for lease_id in sorted(touched):
        rec = sched.leases.get(lease_id)
        if rec is None:
            continue
        vm = rec.current_vm()
        nodes = dict(vm.nodes) if vm is not None and vm.status == "active" else None
        wanted.append((lease_id, rec.state, nodes, present.get(lease_id, [])))
    sync_many(wanted, when)


def _write_leases(
    sched: Scheduler, changes: list[Change], touched: set[int], messages: Mapping[int, str]
) -> None:
    """The lease rows of a pass: each touched lease's state (its steps into the history), what the scheduler
    keeps of its run, and its message, in one UPDATE of each row. (Written field by field, a request's row was
    updated three times a pass: each update a new row version with its index entries.) Every writer of these
    fields holds the plan lock, so rewriting an unchanged state or run figure loses nothing.

    A lease tells one story: the steps a pass took it through are one history row (a re-plan is "moved from 08:36
    on batch-01 to 10:09 on batch-03: lease 12 ended early", not ready -> pending -> scheduled -> ready), each
    saying why; and a lease whose state changed without a decided message gets one that matches its state, so a
    queued lease's page never says it runs. A request's own steps from `new` are kept one by one."""
    steps: dict[int, list[Change]] = {}
    for c in changes:
        if c.what == "lease_state":
            steps.setdefault(c.lease_id, []).append(c)
    current = dict(Lease.objects.filter(pk__in=touched | messages.keys()).values_list("id", "state"))
    said = dict(messages)
    history = []
    feed: list[Row] = []
    for lease_id, taken in steps.items():
        before = current[lease_id]
        rows = _history_rows(sched, lease_id, before, taken, changes)
        history.extend(rows)
        current[lease_id] = str(taken[-1].state)
        if lease_id in said:
            # The decision's message (placed and where, rejected and why...).
            rows[-1].message = said[lease_id]
        elif lease_id in sched.leases:
            why = next((c.reason for c in reversed(taken) if c.reason), "")
            story = sched.describe(lease_id)
            said[lease_id] = f"{story}: {why}" if why and before != LeaseState.NEW else story
        feed.extend(_feed_events(sched, lease_id, before, taken, rows[-1].message or said.get(lease_id, "")))
    insert_many(history, model=LeaseEvent)
    outbox.append_many(feed)
    # One statement per set of fields: with or without a message, with or without the scheduler's figures.
    groups: dict[tuple[str, ...], list[Row]] = {}
    for pk, state in current.items():
        fields: dict[str, Any] = {"state": state}
        rec = sched.leases.get(pk) if pk in touched else None
        if rec is not None:
            fields.update(_synced(rec))
        if pk in said:
            fields["message"] = said[pk][:2000]
        groups.setdefault(tuple(fields), []).append(Row(pk=pk, **fields))
    for names, rows in groups.items():
        update_many(rows, names, model=Lease)


_S = LeaseState
_PLANNED = {_S.SCHEDULED, _S.READY, _S.SUSPENDED_SCHEDULED}
_SUSPENDED = {_S.SUSPENDING, _S.SUSPENDED_PENDING, _S.SUSPENDED_QUEUED, _S.SUSPENDED_SCHEDULED}
_ENDS = {_S.DONE: "lease.ended", _S.CANCELLED: "lease.cancelled", _S.REJECTED: "lease.rejected",
         _S.FAILED: "lease.failed"}  # fmt: skip


def _feed_events(
    sched: Scheduler, lease_id: int, before: str, taken: list[Change], message: str
) -> list[Row]:
    """The event feed's words for one lease's steps in one pass (slotkeeper/outbox.py), written with them."""
    at = from_epoch(taken[-1].at)
    after = LeaseState(str(taken[-1].state))
    was = LeaseState(before)
    types: list[str] = []
    if was == _S.NEW:
        types.append("lease.submitted")
        if after in (_S.QUEUED, _S.SUSPENDED_QUEUED):
            types.append("lease.queued")
        elif after in _PLANNED or after == _S.ACTIVE:
            types.append("lease.placed")
    if after in _ENDS:
        types.append(_ENDS[after])
    elif after == _S.ACTIVE and was != _S.NEW:
        resumed = (
            was in _SUSPENDED
            or was in (_S.RESUMING, _S.RESUMED_READY)
            or any(c.state in (_S.RESUMING, _S.RESUMED_READY) for c in taken)
        )
        types.append("lease.resumed" if resumed else "lease.started")
    elif after == _S.ACTIVE:
        types.append("lease.started")
    elif after in _SUSPENDED and was in (_S.ACTIVE, _S.SUSPENDING) and was != after:
        types.append("lease.suspended")
    elif after in (_S.QUEUED, _S.SUSPENDED_QUEUED) and was != _S.NEW:
        types.append("lease.queued")
    elif after in _PLANNED and was in (_S.QUEUED, _S.SUSPENDED_QUEUED, _S.PENDING, _S.SUSPENDED_PENDING):
        types.append("lease.placed")
    elif after in _PLANNED and was != _S.NEW:
        types.append("lease.replanned")
    if not types:
        return []
    data: dict[str, Any] = {"from": before, "to": str(after), "message": message[:2000]}
    reason = next((c.reason for c in reversed(taken) if c.reason), "")
    if reason:
        data["reason"] = reason[:2000]
    rec = sched.leases.get(lease_id)
    vm = rec.current_vm() if rec is not None else None
    if vm is not None:
        data.update(
            start=from_epoch(vm.start).isoformat(),
            end=from_epoch(vm.end).isoformat(),
            nodes=sorted({sched.node_label(n) for n in vm.nodes.values()}),
        )
    return [outbox.event(t, at, lease=lease_id, data=data) for t in types]


def _history_rows(
    sched: Scheduler, lease_id: int, before: str, taken: list[Change], changes: list[Change]
) -> list[Row]:
    """The history rows of one lease's steps in one pass: a request's steps from `new` one by one, anything else
    folded into one row from where it was to where it ended, with why (and where it moved, for a re-plan)."""
    if before == LeaseState.NEW:
        rows, state = [], before
        for c in taken:
            rows.append(Row(lease_id=lease_id, at=from_epoch(c.at), from_state=state, to_state=str(c.state),
                            message=c.reason[:2000]))  # fmt: skip
            state = str(c.state)
        return rows
    reasons = list(dict.fromkeys(c.reason for c in taken if c.reason))
    moved = _moved(sched, lease_id, changes)
    message = "; ".join([*([moved] if moved else []), *reasons])
    last = taken[-1]
    return [
        Row(lease_id=lease_id, at=from_epoch(last.at), from_state=before, to_state=str(last.state),
            message=message[:2000])
    ]  # fmt: skip


def _moved(sched: Scheduler, lease_id: int, changes: list[Change]) -> str:
    """ "moved from 08:36 on batch-01 to 10:09 on batch-03" when a pass replaced the lease's VM reservation by one
    at another time or on other nodes; "" otherwise."""
    dropped = [c.reservation for c in changes if c.lease_id == lease_id and c.what == "reservation_cancelled"
               and c.reservation is not None and c.reservation.kind == "vm"]  # fmt: skip
    added = [c.reservation for c in changes if c.lease_id == lease_id and c.what == "reservation_added"
             and c.reservation is not None and c.reservation.kind == "vm"]  # fmt: skip
    if not dropped or not added:
        return ""
    old, new = dropped[0], added[-1]

    def where(r: ReservationRecord) -> str:
        nodes = ", ".join(sorted({sched.node_label(n) for n in r.nodes.values()}))
        return f"{sched.label(r.start)} on {nodes}" if nodes else sched.label(r.start)

    if (old.start, sorted(old.nodes.values())) == (new.start, sorted(new.nodes.values())):
        return ""
    return f"moved from {where(old)} to {where(new)}"


def _synced(rec: LeaseRecord) -> dict[str, Any]:
    return {
        "run_time_s": rec.run_time,
        "lost_run_time_s": rec.lost_run_time,
        "first_start": from_epoch(rec.first_start) if rec.first_start is not None else None,
        "ended_at": from_epoch(rec.end) if rec.end is not None else None,
        "in_future": rec.in_future,
        "images": {str(k): v for k, v in rec.images.items()},
    }


def _reservation_fields(r: ReservationRecord) -> dict:
    return {
        "lease_id": r.lease_id,
        "kind": r.kind,
        "start": from_epoch(r.start),
        "end": from_epoch(r.end),
        "status": r.status,
        "nodes": {str(k): v for k, v in r.nodes.items()},
        "sources": {str(k): v for k, v in r.sources.items()},
    }


def _write_reservations(sched: Scheduler, latest: dict[int, ReservationRecord]) -> None:
    existing = {row.rid: row for row in Reservation.objects.filter(rid__in=latest)}
    # Rows, not model instances, for what is only inserted (bulk.Row): a burst's pass creates thousands.
    created = insert_many(
        [Row(rid=rid, **_reservation_fields(r)) for rid, r in latest.items() if rid not in existing],
        model=Reservation,
    )
    changed = []
    for rid, row in existing.items():
        for name, value in _reservation_fields(latest[rid]).items():
            setattr(row, name, value)
        changed.append(row)
    if changed:
        update_many(changed, ["kind", "start", "end", "status", "nodes", "sources"])
    allocations: dict[int, list[Allocation]] = {}
    for a in Allocation.objects.filter(reservation__in=changed):
        allocations.setdefault(a.reservation_id, []).append(a)
    fresh, stale, moved_rows = [], [], []
    for row in created:
        fresh.extend(_allocations(sched, latest[row.rid], row))
    for row in changed:
        rows = allocations.get(row.pk, [])
        live = row.status in LIVE_RESERVATION_STATUSES
        if live and {a.node_id for a in rows} != set(latest[row.rid].nodes.values()):
            # A vnode moved (a reschedule): the per-node rows follow it.
            moved_rows.append(row.pk)
            fresh.extend(_allocations(sched, latest[row.rid], row))
            continue
        for a in rows:
            a.start, a.end, a.live = row.start, row.end, live
            stale.append(a)
    if moved_rows:
        Allocation.objects.filter(reservation_id__in=moved_rows).delete()
    if stale:
        update_many(stale, ["start", "end", "live"])
    if fresh:
        insert_many(fresh, model=Allocation)


def _allocations(sched: Scheduler, r: ReservationRecord, row: Reservation | Row) -> list[Row]:
    """A reservation's per-node rows, as bulk.Rows of Allocation."""
    live = r.status in LIVE_RESERVATION_STATUSES
    return [
        Row(
            reservation_id=row.pk,
            node_id=node_id,
            start=row.start,
            end=row.end,
            live=live,
            cpu=res.cpu,
            mem_mib=res.mem,
            disk_gib=res.disk,
        )
        for node_id, res in sched.alloc_of(sched.leases[r.lease_id], r).items()
    ]


def move_vnode(plan: Planning, lease_id: int, vnode: int, old_node: int, new_node: int) -> bool:
    """Moves one vnode's share of a lease's live reservations from `old_node` to `new_node` in the slot table (a
    reschedule), all or nothing (Scheduler.move_vnode). The caller advances the scheduler to now first."""
    return plan.scheduler.move_vnode(lease_id, vnode, old_node, new_node, plan.t)


def drop_cache() -> None:
    _cache.value = None
