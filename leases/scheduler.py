"""The lease scheduler: Haizea's semantics (SEMANTICS.md, with §10's decisions) over a slot table.

This module owns the decisions: whether and where an advance reservation (exact window), an immediate lease
(now, whole duration) or a best-effort lease (FCFS queue with backfilling) runs; which best-effort leases an
AR preempts and whether each is suspended or cancelled and requeued; when suspensions, resumptions, migrations
and shutdowns happen; and what each lease's state is as its reservations start and end. It keeps a journal of
every change so that the live service can write a plan back, and it explains every refusal node by node.

PURE: no Django. Time is always passed in (seconds; epoch seconds live, seconds since the trace start in
replay). Nothing is scheduled before the `now` it is given.
"""

from __future__ import annotations

import contextlib
import heapq
import math
from bisect import insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import lru_cache

from leases.lifecycle import LeaseState, lease_transition
from leases.slottable import Res, Reservation, RoomCounts, SlotTable

BEST_EFFORT = "best_effort"
ADVANCE_RESERVATION = "advance_reservation"
IMMEDIATE = "immediate"

VM, SUSPEND, RESUME, MIGRATE, SHUTDOWN = "vm", "suspend", "resume", "migrate", "shutdown"
SCHEDULED, ACTIVE, DONE, CANCELLED = "scheduled", "active", "done", "cancelled"

_S = LeaseState
_SUSPENDED = frozenset({_S.SUSPENDED_PENDING, _S.SUSPENDED_QUEUED, _S.SUSPENDED_SCHEDULED})
# A lease in one of these states holds only reservations that have not started, or a VM that is simply
# running, so preempting it never cuts a suspension, resumption or migration in half.
_PREEMPTABLE = frozenset({_S.SCHEDULED, _S.READY, _S.ACTIVE, _S.SUSPENDED_SCHEDULED})
_REEVALUATED = frozenset({_S.SCHEDULED, _S.READY, _S.SUSPENDED_SCHEDULED})
_PREEMPTION_POLICIES = ("no-preemption", "ar-preempts-everything", "ar-preempts-be")


# -- configuration -----------------------------------------------------------------------------------------


def _seconds(value: str) -> float:
    return float(int(value))


def _choice(*valid: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in valid:
            raise ValueError(f"{value!r} is not one of {', '.join(valid)}")
        return value

    return parse


# Haizea option name -> (SchedulerConfig field, parser). None as the field: known, accepted and not used.
_OPTIONS: dict[str, tuple[str | None, Callable[[str], object]]] = {
    "backfilling": ("backfilling", _choice("off", "aggressive", "intermediate", "conservative")),
    "backfilling-reservations": ("backfilling_reservations", int),
    "suspension": ("suspension", _choice("none", "serial-only", "all")),
    "suspend-rate": ("suspend_rate", float),
    "resume-rate": ("resume_rate", float),
    "suspendresume-exclusion": ("suspendresume_exclusion", _choice("local", "global")),
    "scheduling-threshold-factor": ("scheduling_threshold_factor", int),
    "force-scheduling-threshold": ("force_scheduling_threshold", _seconds),
    "override-suspend-time": ("override_suspend_time", _seconds),
    "override-resume-time": ("override_resume_time", _seconds),
    "migration": ("migration", _choice("no", "yes", "yes-notransfer")),
    "imagetransfer-bandwidth": ("migration_bandwidth", int),
    "migration-bandwidth": ("migration_bandwidth", int),
    "shutdown-time": ("shutdown_time", _seconds),
    "enactment-overhead": ("enactment_overhead", _seconds),
    "policy-preemption": ("policy_preemption", _choice(*_PREEMPTION_POLICIES)),
    "policy-admission": ("policy_admission", _choice("accept-all", "no-ARs")),
    "policy-host-selection": ("policy_host_selection", _choice("greedy", "no-policy")),
    "mapper": (None, _choice("greedy")),
    "policy-pricing": (None, str),
    "wakeup-interval": (None, str),
    "non-schedulable-interval": (None, str),
    "max-delay-duration": (None, str),
    "max-delay-vm": (None, str),
    "max-delay-action": (None, str),
}


@dataclass(frozen=True)
class SchedulerConfig:
    """Haizea's [scheduling] options (SEMANTICS §5) with Slotkeeper's defaults (§10 Q2, Q3). Seconds, MB/s, Mbit/s."""

    backfilling: str = "aggressive"
    backfilling_reservations: int | None = None
    suspension: str = "all"
    suspend_rate: float = 32.0
    resume_rate: float = 32.0
    suspendresume_exclusion: str = "local"
    scheduling_threshold_factor: int = 1
    force_scheduling_threshold: float | None = None
    override_suspend_time: float | None = None
    override_resume_time: float | None = None
    migration: str = "no"
    migration_bandwidth: int = 100
    shutdown_time: float = 0.0
    enactment_overhead: float = 0.0
    policy_preemption: str = "ar-preempts-be"
    policy_admission: str = "accept-all"
    policy_host_selection: str = "greedy"

    def __post_init__(self) -> None:
        if self.backfilling == "intermediate" and not self.backfilling_reservations:
            raise ValueError("backfilling = intermediate needs backfilling-reservations (a positive number)")
        if self.suspension != "none" and min(self.suspend_rate, self.resume_rate) <= 0:
            raise ValueError("suspend-rate and resume-rate must be positive when suspension is allowed")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SchedulerConfig:
        """Build from Haizea option names (hyphenated); an unknown name raises ValueError listing the known ones."""
        values: dict[str, object] = {}
        for name, raw in options.items():
            if name not in _OPTIONS:
                raise ValueError(f"unknown scheduling option {name!r}; known: {', '.join(sorted(_OPTIONS))}")
            target, parse = _OPTIONS[name]
            try:
                value = parse(raw.strip())
            except ValueError as exc:
                raise ValueError(f"option {name}: {exc}") from None
            # Slotkeeper's own migration-bandwidth wins over the image repository's figure Haizea 1.1 reuses.
            if target and not (name == "imagetransfer-bandwidth" and "migration-bandwidth" in options):
                values[target] = value
        return cls(**values)  # type: ignore[arg-type]

    @property
    def max_in_future(self) -> float:
        """How many queued leases may hold a future reservation at once (§3.6)."""
        caps = {"off": 0.0, "aggressive": 1.0, "conservative": math.inf}
        return caps.get(self.backfilling, float(self.backfilling_reservations or 0))

    @property
    def preempts(self) -> bool:
        return self.policy_preemption != "no-preemption"


# -- plain values in and out -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRequest:
    """What was asked: `type` is best_effort | advance_reservation | immediate; `start` only for an AR."""

    id: int
    type: str
    submit: float
    start: float | None
    duration: float
    vnodes: tuple[Res, ...]
    preemptible: bool = True
    real_duration: float | None = None
    deadline: float | None = None


@dataclass
class ReservationRecord:
    """A lease's reservation as the scheduler tracks it; `nodes` maps vnode (1..n) -> node id.

    For a migration, `nodes` holds the destinations and `sources` the nodes the memory images leave.
    """

    rid: int
    lease_id: int
    kind: str
    start: float
    end: float
    nodes: dict[int, int]
    status: str = SCHEDULED
    sources: dict[int, int] = field(default_factory=dict)


@dataclass
class LeaseRecord:
    """A lease's state, every reservation ever placed for it (cancelled ones too) and its run-time accounting.

    `images` says where each vnode's suspended memory image is (vnode -> node); `in_future` marks a best-effort
    lease holding one of the backfilling algorithm's future reservations.
    """

    request: LeaseRequest
    state: LeaseState = LeaseState.NEW
    reservations: list[ReservationRecord] = field(default_factory=list)
    run_time: float = 0.0
    first_start: float | None = None
    end: float | None = None
    history: list[tuple[float, str, str]] = field(default_factory=list)
    lost_run_time: float = 0.0
    images: dict[int, int] = field(default_factory=dict)
    in_future: bool = False

    def chain(self) -> list[ReservationRecord]:
        """The reservations of the current plan (not yet done or cancelled), in time order."""
        return [r for r in self.reservations if r.status in (SCHEDULED, ACTIVE)]

    def current_vm(self) -> ReservationRecord | None:
        return next((r for r in self.chain() if r.kind == VM), None)


@dataclass(frozen=True)
class Decision:
    """The answer to submit / cancel; `verdicts` says for every node why it could not help (None = it could)."""

    accepted: bool
    lease_id: int
    state: LeaseState
    message: str
    verdicts: dict[int, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    """One journal entry: reservation_added | reservation_changed | reservation_cancelled | lease_state."""

    at: float
    lease_id: int
    what: str
    reservation: ReservationRecord | None = None
    state: LeaseState | None = None


@dataclass
class _Spec:
    kind: str
    start: float
    end: float
    nodes: dict[int, int]
    sources: dict[int, int] = field(default_factory=dict)


@dataclass
class _Plan:
    specs: list[_Spec]
    in_future: bool = False
    preempt: list[int] = field(default_factory=list)


def _utc_label(t: float) -> str:
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%H:%M" if moment.second == 0 else "%H:%M:%S")


@lru_cache(maxsize=1024)
def _cpu_mem(r: Res) -> Res:
    return Res(cpu=r.cpu, mem=r.mem)


def _size_order(vnodes: Sequence[Res]) -> list[int]:
    """vnode numbers (1..n), largest first by Haizea's normalised size; ties keep vnode order."""
    names = [f.name for f in fields(Res)]
    peaks = {n: max(getattr(v, n) for v in vnodes) for n in names}

    def size(v: Res) -> float:
        return sum(getattr(v, n) / peaks[n] for n in names if peaks[n])

    return sorted(range(1, len(vnodes) + 1), key=lambda i: -size(vnodes[i - 1]))


# -- the scheduler -----------------------------------------------------------------------------------------


class Scheduler:
    """Leases, their reservations in a SlotTable, the best-effort queue, and the events that move them on.

    `label` turns a time into the text used in messages (default: UTC clock time of epoch seconds).
    """

    def __init__(
        self,
        capacities: Mapping[int, Res],
        config: SchedulerConfig,
        *,
        label: Callable[[float], str] = _utc_label,
        strict: bool = False,
    ) -> None:
        self.table = SlotTable(capacities)
        # A lease whose records make no sense (a reservation on a node the table does not know, a suspension with
        # no VM behind it) used to raise out of every pass, so one bad row stopped all scheduling for good. Now
        # that lease is isolated: failed, its reservations released, listed in `isolated` for the caller to
        # alert on, and everyone else is scheduled as usual. `strict` re-raises instead (tests of the core).
        self.strict = strict
        self.isolated: list[tuple[int, str]] = []
        self._broken: list[tuple[int, str]] = []
        self.config = config
        self.label = label
        self.leases: dict[int, LeaseRecord] = {}
        self._queue: list[tuple[float, int, int]] = []  # (submit, seq, lease id): FCFS by submit time
        self._seq = 0
        self._records: dict[int, ReservationRecord] = {}
        self._next_rid = 1
        self._events: list[tuple[float, int, int, int]] = []  # (time, phase, tiebreak, rid)
        self._tick = 0
        self._future: set[int] = set()
        self._changes: list[Change] = []
        self.replaced: list[tuple[int, str]] = []  # set by advance(): leases requeued off unusable nodes
        self._excluded: Mapping[int, str] = {}
        self._now = -math.inf
        # Per node: (from, until, leases, next change): the host-score summary holds for every instant in
        # [from, until), the span up to the node's next change of usage or lease set, until a change touches it.
        self._views: dict[int, tuple[float, float, int, float]] = {}
        # Per node: (need, start) -> fits_until. A node's answers hold until a change touches that node, so a
        # queue pass keeps them across the other leases' commits (clearing all of it on every change did not).
        self._fit_memo: dict[int, dict[tuple[Res, float], float]] = {}
        self._room = RoomCounts()
        self._fleet = tuple(self.table.capacity(n) for n in self.table.nodes)  # fixed for a scheduler's life
        self._capacity = dict(zip(self.table.nodes, self._fleet, strict=True))
        self._packs_memo: dict[tuple[Res, ...], bool] = {}
        # Per lease id: the smallest vnode, and the suspend/resume estimates, asked for at every queue pass.
        self._smallest: dict[int, Res] = {}
        self._orders: dict[int, list[int]] = {}
        self._estimates: dict[tuple[int, float, float | None], float] = {}
        self._thresholds: dict[tuple[int, bool], float] = {}

    # -- public API ----------------------------------------------------------------------------------------

    @property
    def queue(self) -> Sequence[int]:
        return [lid for _, _, lid in self._queue]

    def submit(
        self, req: LeaseRequest, now: float, excluded: Mapping[int, str] | None = None, *, defer: bool = False
    ) -> Decision:
        """Take a new request at `now`. ARs and IMs are decided at once; a best-effort lease is queued and the
        queue is processed (unless `defer`, which replay uses to hand in every request of an instant first)."""
        if req.id in self.leases:
            raise ValueError(f"lease {req.id} already exists")
        self._use_exclusions(excluded)
        self._now = max(self._now, now)
        self._run_events(now)
        rec = LeaseRecord(request=req)
        self.leases[req.id] = rec
        self._set_state(rec, _S.PENDING, now)
        refusal = self._admission_refusal(req, now)
        if refusal:
            self._set_state(rec, _S.REJECTED, now)
            return Decision(False, req.id, rec.state, refusal, {})
        if req.type == BEST_EFFORT:
            return self._submit_best_effort(rec, now, defer)
        return self._submit_fixed(rec, now)

    def cancel(self, lease_id: int, now: float) -> Decision:
        """Cancel a lease: the VMs stop now and the rest of its plan is dropped. IllegalTransition if finished."""
        rec = self.leases[lease_id]
        self._now = max(self._now, now)
        self._run_events(now)
        lease_transition(rec.state, _S.CANCELLED, ident=str(lease_id))  # refuse before changing anything
        self._drop_from_queue(lease_id)
        self._future.discard(lease_id)
        rec.in_future = False
        self._stop_chain(rec, now)
        self._set_state(rec, _S.CANCELLED, now)
        rec.end = now
        self._reevaluate(now)
        self._process_queue(now)
        self._run_events(now)
        return Decision(True, lease_id, rec.state, f"lease {lease_id} cancelled at {self.label(now)}")

    def advance(
        self, now: float, excluded: Mapping[int, str] | None = None, *, run_queue: bool = True
    ) -> None:
        """Apply every reservation start/end and early end at or before `now`, in time order, then the queue."""
        self._use_exclusions(excluded)
        if now > self._now:
            # Answers about instants still ahead stay valid (a change drops the touched nodes' entries);
            # nothing is ever asked about an instant before now again.
            # A node nothing touches keeps its memo; past starts are never asked again, so bound its size.
            for node in [n for n, memo in self._fit_memo.items() if len(memo) > 512]:
                del self._fit_memo[node]
            self._room.forget_before(now)
        self._now = max(self._now, now)
        self.replaced = self._recheck_due(now) if self._excluded else []
        self._run_events(now)
        if run_queue:
            self._process_queue(now)
            self._run_events(now)

    def _use_exclusions(self, excluded: Mapping[int, str] | None) -> None:
        # The room counts are sums over the usable nodes: a different set of exclusions makes them wrong.
        if (excluded or {}) != self._excluded:
            self._room.clear()
        self._excluded = excluded or {}

    def _recheck_due(self, now: float) -> list[tuple[int, str]]:
        """A reservation that comes due is checked again: a best-effort lease whose next reservation would start
        on a node that has become unusable (draining, offline, dead, stale health) is requeued before it starts,
        and the queue re-places it. Returns (lease id, reason) for each, so the caller can record why."""
        replaced = []
        for rec in list(self.leases.values()):
            if rec.request.type != BEST_EFFORT or rec.state in (
                _S.ACTIVE,
                _S.SUSPENDING,
                _S.MIGRATING,
                _S.RESUMING,
            ):
                continue
            due = [r for r in rec.chain() if r.status == SCHEDULED and r.start <= now]
            bad = sorted({n for r in due for n in r.nodes.values() if n in self._excluded})
            if not bad:
                continue
            reason = "; ".join(f"node {n} {self._excluded[n]}" for n in bad)
            self._requeue(rec, now)
            replaced.append((rec.request.id, reason))
        return replaced

    def next_event_time(self) -> float | None:
        while self._events and not self._event_valid(self._events[0]):
            heapq.heappop(self._events)
        return self._events[0][0] if self._events else None

    def restore(self, lease: LeaseRecord) -> None:
        """Load an existing lease (the live service, from its database); its live reservations enter the table.

        All or nothing: a lease whose live reservations cannot enter the table (a node that is gone, an
        overcommit) is kept aside as broken, and `isolate_broken(now)` fails it once the caller knows the time."""
        lid = lease.request.id
        self.leases[lid] = lease
        added: list[ReservationRecord] = []
        try:
            for r in lease.chain():
                unknown = sorted({*r.nodes.values(), *r.sources.values()} - set(self.table.nodes))
                if unknown:
                    raise KeyError(
                        f"reservation {r.rid} names node(s) {unknown} that the slot table does not hold"
                    )
                self.table.add(self._table_row(lease, r))
                added.append(r)
        except Exception as exc:
            if self.strict:
                raise
            for r in added:
                self.table.remove(r.rid)
            self._touch({n for r in added for n in (*r.nodes.values(), *r.sources.values())})
            self._broken.append((lid, f"{type(exc).__name__}: {exc}"))
            return
        for r in added:
            self._next_rid = max(self._next_rid, r.rid + 1)
            self._records[r.rid] = r
            self._push_events(r)
            # A migration holds its sources as well as its destinations: both nodes' cached figures change.
            self._touch({*r.nodes.values(), *r.sources.values()})
        if lease.state in (_S.QUEUED, _S.SUSPENDED_QUEUED):
            self._enqueue(lease)
        if lease.in_future:
            self._future.add(lid)

    def isolate_broken(self, now: float) -> None:
        """Fail every lease `restore` could not load (see there), at `now`."""
        broken, self._broken = self._broken, []
        for lid, reason in broken:
            self._isolate(self.leases[lid], now, reason)

    def take_isolated(self) -> list[tuple[int, str]]:
        isolated, self.isolated = self.isolated, []
        return isolated

    @property
    def next_rid(self) -> int:
        """The id the next reservation will get."""
        return self._next_rid

    def continue_rids_after(self, floor: int) -> None:
        """Reservation ids are unique for all time, not just among live rows: never hand out one below `floor`."""
        self._next_rid = max(self._next_rid, floor)

    def journal_change(self, now: float, r: ReservationRecord) -> None:
        """Record that a reservation was changed from outside (a vnode moved by a reschedule)."""
        self._journal(now, r, "reservation_changed")

    def _isolate(self, rec: LeaseRecord, now: float, reason: str) -> None:
        """Take a lease the scheduler cannot handle out of the plan: its reservations leave the table, it leaves
        the queue, and it fails (whatever its state: this is a quarantine, not a lifecycle step)."""
        lid = rec.request.id
        for r in rec.reservations:
            if r.status not in (SCHEDULED, ACTIVE):
                continue
            if r.rid in self._records:
                with contextlib.suppress(KeyError):  # half-restored or already gone: nothing to release
                    self._touch(self.table.remove(r.rid).alloc)
            self._records.pop(r.rid, None)
            r.status = CANCELLED
            self._journal(now, r, "reservation_cancelled")
        self._drop_from_queue(lid)
        self._future.discard(lid)
        rec.in_future = False
        before = rec.state
        rec.state = _S.FAILED
        rec.end = now
        rec.history.append((now, str(before), str(_S.FAILED)))
        self._changes.append(Change(now, lid, "lease_state", state=_S.FAILED))
        self.isolated.append((lid, reason))

    def _contain(self, rec: LeaseRecord, now: float, exc: Exception) -> None:
        if self.strict:
            raise exc
        self._isolate(rec, now, f"{type(exc).__name__}: {exc}")

    def take_changes(self) -> list[Change]:
        changes, self._changes = self._changes, []
        return changes

    # -- submission ----------------------------------------------------------------------------------------

    def _admission_refusal(self, req: LeaseRequest, now: float) -> str:
        if req.type not in (BEST_EFFORT, ADVANCE_RESERVATION, IMMEDIATE):
            return f"lease type {req.type} is not supported (best_effort, advance_reservation, immediate)"
        if not req.vnodes or req.duration <= 0:
            return "a lease needs at least one vnode and a positive duration"
        if not self._packs(req.vnodes):
            return f"{len(req.vnodes)} vnode(s) of this size do not fit even on the whole, empty fleet"
        if req.type == ADVANCE_RESERVATION and self.config.policy_admission == "no-ARs":
            return "advance reservations are not admitted (policy-admission = no-ARs)"
        if req.type == ADVANCE_RESERVATION and (req.start is None or req.start < now):
            return "an advance reservation must start at or after now"
        return ""

    def _packs(self, vnodes: tuple[Res, ...]) -> bool:
        # Memoised here rather than only by _packs' lru_cache, whose key hashed all 144 nodes' capacities at
        # every submission.
        got = self._packs_memo.get(vnodes)
        if got is None:
            got = self._packs_memo[vnodes] = _packs(vnodes, self._fleet)
        return got

    def _submit_best_effort(self, rec: LeaseRecord, now: float, defer: bool) -> Decision:
        self._set_state(rec, _S.QUEUED, now)
        self._enqueue(rec)
        if not defer:
            self._process_queue(now)
            self._run_events(now)
        return Decision(True, rec.request.id, rec.state, self._placement_message(rec))

    def _submit_fixed(self, rec: LeaseRecord, now: float) -> Decision:
        req = rec.request
        if req.type == ADVANCE_RESERVATION:
            assert req.start is not None
            start, end = req.start, req.start + req.duration + self._shutdown_time(req)
            plan = self._plan_exact(rec, now)
        else:
            start, end = now, now + req.duration + self._shutdown_time(req)
            plan = self._plan_asap(rec, now, allow_future=False)
        if plan is None:
            self._set_state(rec, _S.REJECTED, now)
            verdicts = self._verdicts(req, start, end)
            return Decision(False, req.id, rec.state, self._rejection(req, start, end), verdicts)
        for victim in plan.preempt:
            self._preempt(self.leases[victim], start, now)
        self._commit(rec, plan, now)
        self._process_queue(now)
        self._run_events(now)
        return Decision(True, req.id, rec.state, self._placement_message(rec))

    def _rejection(self, req: LeaseRequest, start: float, end: float) -> str:
        what = "advance reservation" if req.type == ADVANCE_RESERVATION else "immediate lease"
        window = f"{self.label(start)}–{self.label(end)}"
        return f"{what} rejected: no room for {len(req.vnodes)} vnode(s) over {window}"

    def _placement_message(self, rec: LeaseRecord) -> str:
        vm = rec.current_vm()
        if rec.state in (_S.QUEUED, _S.SUSPENDED_QUEUED):
            return f"lease {rec.request.id} queued at position {self.queue.index(rec.request.id) + 1}"
        if vm is None:
            return f"lease {rec.request.id} is {rec.state}"
        nodes = ", ".join(str(n) for n in sorted(set(vm.nodes.values())))
        return f"lease {rec.request.id} runs {self.label(vm.start)}–{self.label(vm.end)} on nodes {nodes}"

    def _verdicts(self, req: LeaseRequest, start: float, end: float) -> dict[int, str | None]:
        need = req.vnodes[_size_order(req.vnodes)[0] - 1]
        return {node: self._verdict(node, need, start, end) for node in self.table.nodes}

    def _verdict(self, node: int, need: Res, start: float, end: float) -> str | None:
        if node in self._excluded:
            return self._excluded[node]
        if self.table.fits(node, need, start, end):
            return None
        wanted = f"cpu {need.cpu} mem {need.mem} over {self.label(start)}–{self.label(end)}"
        blockers = self.table.blockers(node, need, start, end)
        if not blockers:
            cap = self.table.capacity(node)
            return f"cannot hold {wanted}: capacity is cpu {cap.cpu} mem {cap.mem}"
        parts = [
            f"reserved {self.label(b.start)}–{self.label(b.end)} by lease {b.lease_id} "
            f"({self.leases[b.lease_id].request.type})"
            for b in blockers
        ]
        return f"cannot hold {wanted}: " + "; ".join(parts)

    # -- the queue (§3.2) ----------------------------------------------------------------------------------

    def _enqueue(self, rec: LeaseRecord) -> None:
        self._seq += 1
        insort(self._queue, (rec.request.submit, self._seq, rec.request.id))

    def _drop_from_queue(self, lease_id: int) -> None:
        self._queue = [q for q in self._queue if q[2] != lease_id]

    def _can_schedule_in_future(self) -> bool:
        return len(self._future) < self.config.max_in_future

    def _process_queue(self, now: float) -> None:
        waiting: list[tuple[float, int, int]] = []
        stopped = False
        for entry in self._queue:
            if stopped:
                waiting.append(entry)
                continue
            future = self._can_schedule_in_future()
            # With no future reservation left to hand out and every CPU taken, nothing in the queue can start:
            # stopping here keeps a long queue from being re-mapped at every event (Haizea does the same).
            if not future and self._cpu_full(now):
                waiting.append(entry)
                stopped = True
                continue
            rec = self.leases[entry[2]]
            try:
                plan = self._plan_asap(rec, now, allow_future=future)
                if plan is None:
                    waiting.append(entry)
                    stopped = self.config.backfilling == "off"
                    continue
                self._commit(rec, plan, now)
            except Exception as exc:
                self._contain(rec, now, exc)
        self._queue = waiting

    def _cpu_full(self, now: float) -> bool:
        # The free CPU summed over the usable nodes is 0 exactly when every node's CPU is taken.
        if not self._excluded:
            return self.table.total_free_cpu_at(now) <= 0
        return self._room.total(now, _ONE_CPU, self._usable_nodes(), self._counter(_ONE_CPU, now)) == 0

    def _counter(self, unit: Res, t: float) -> Callable[[Iterable[int]], dict[int, int]]:
        return lambda nodes: self.table.copies_many(nodes, unit, t)

    def _usable_nodes(self) -> Sequence[int]:
        if not self._excluded:
            return self.table.nodes  # asked at every room count: no list to build in the common case
        return [n for n in self.table.nodes if n not in self._excluded]

    # -- planning: best-effort and immediate (§3.5) --------------------------------------------------------

    def _plan_asap(self, rec: LeaseRecord, now: float, allow_future: bool) -> _Plan | None:
        req = rec.request
        resuming = rec.state in _SUSPENDED
        remaining = req.duration - rec.run_time
        resume_est = (
            self._estimate(req, self.config.resume_rate, self.config.override_resume_time) if resuming else 0
        )
        duration = remaining + resume_est + self._shutdown_time(req)
        # A non-preemptible lease is never suspended, so it is not started where it would have to be (Q1).
        strict = (
            req.type == IMMEDIATE
            or not req.preemptible
            or self.config.suspension == "none"
            or (self.config.suspension == "serial-only" and len(req.vnodes) > 1)
        )
        only = set(rec.images.values()) if resuming and self.config.migration == "no" else None
        threshold = self._threshold(req, resuming)
        plan = self._first_fit(rec, [now], now, duration, threshold, strict, only)
        if plan is None and allow_future:
            plan = self._first_fit(rec, self._future_points(now), now, duration, threshold, strict, only)
            if plan is not None:
                plan.in_future = True
        return plan

    def _could_start(self, req: LeaseRequest, at: float, only: set[int] | None) -> bool:
        """A cheap necessary condition for starting at an instant: enough copies of the smallest vnode fit then.

        Without it a long queue re-runs the full mapper over every node at every event (the 30-day Blue
        Horizon replay spent most of its time there)."""
        smallest = self._smallest_of(req)
        # The fleet's total free capacity bounds how many copies fit on its nodes: most instants fail here.
        if self.table.total_copies_at(smallest, at) < len(req.vnodes):
            return False
        count = self._counter(smallest, at)
        if only is None:
            room = self._room.total(at, smallest, self._usable_nodes(), count)
        elif self._room.knows(at, smallest):
            room = self._room.subtotal(at, smallest, self._usable_nodes(), only, count)
        else:
            # A lease pinned to a few nodes (resuming without migration): counting just those is cheaper than
            # counting the whole fleet for an instant nobody else has asked about.
            usable = [n for n in only if n in self._capacity and n not in self._excluded]
            room = sum(self.table.copies_many(usable, smallest, at).values())
        return room >= len(req.vnodes)

    def _order_of(self, req: LeaseRequest) -> list[int]:
        """_size_order of the lease's vnodes, memoised: every mapping attempt asked for it afresh."""
        got = self._orders.get(req.id)
        if got is None:
            got = self._orders[req.id] = _size_order(req.vnodes)
        return got

    def _smallest_of(self, req: LeaseRequest) -> Res:
        got = self._smallest.get(req.id)
        if got is None:
            got = self._smallest[req.id] = _smallest(req.vnodes)
        return got

    def _future_points(self, now: float) -> list[float]:
        """The ends of every lease's current plan after `now`, sorted (§2.5, §10 Q16): the only instants at
        which capacity comes back."""
        ends = {self._records[rid].end for rid in self._final_rids(now) if self._records[rid].end > now}
        return sorted(ends)

    def _final_rids(self, now: float) -> list[int]:
        finals: list[int] = []
        for r in self.table.reservations(start=now):
            chain = self.leases[r.lease_id].chain()
            if chain and chain[-1].rid == r.rid:
                finals.append(r.rid)
        return finals

    def _first_fit(
        self,
        rec: LeaseRecord,
        candidates: Iterable[float],
        now: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> _Plan | None:
        for start in candidates:
            if not self._could_start(rec.request, start, only):
                continue
            plan = self._plan_at(rec, start, now, duration, threshold, strict, only)
            if plan is not None:
                return plan
        return None

    def _plan_at(
        self,
        rec: LeaseRecord,
        start: float,
        now: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> _Plan | None:
        found = self._find(rec, start, duration, threshold, strict, only)
        if found is None:
            return None
        mapping, end = found
        migrations: list[_Spec] = []
        if rec.state in _SUSPENDED and self._moves(rec, mapping):
            moved = self._plan_migration(rec, mapping, start, end, now, duration, threshold, strict, only)
            if moved is None:
                return None
            migrations, start, mapping, end = moved
        specs = self._run_specs(rec, mapping, start, end)
        return None if specs is None else _Plan(migrations + specs)

    def _find(
        self,
        rec: LeaseRecord,
        start: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> tuple[dict[int, int], float] | None:
        """A mapping for [start, start + duration), or a shorter window of at least `threshold`."""
        if rec.state in _SUSPENDED and self.config.migration == "no":
            # Without migration a suspended lease resumes exactly where its memory images are.
            found = self._check_fixed(self.table, rec.request, rec.images, start, start + duration, strict)
        else:
            found = self._map(self.table, rec.request, start, start + duration, strict, only)
        if found is None:
            return None
        if found[1] < start + duration and found[1] - start < threshold:
            return None
        return found

    def _plan_migration(
        self,
        rec: LeaseRecord,
        mapping: dict[int, int],
        start: float,
        end: float,
        now: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> tuple[list[_Spec], float, dict[int, int], float] | None:
        """Migrations run from now; the resumption waits for them only if they are not done by `start`, and
        only the vnodes that change node cost time (Q9)."""
        specs = self._migration_specs(rec, mapping, now)
        ready = specs[-1].end if specs else now
        if ready > start:
            found = self._find(rec, ready, duration, threshold, strict, only)
            if found is None:
                return None
            later = self._migration_specs(rec, found[0], now)
            if (later[-1].end if later else now) > ready:
                return None
            specs, start, (mapping, end) = later, ready, found
        if not all(self._migration_fits(s) for s in specs):
            return None
        return specs, start, mapping, end

    def _moves(self, rec: LeaseRecord, mapping: dict[int, int]) -> bool:
        return any(rec.images.get(v, n) != n for v, n in mapping.items())

    def _run_specs(
        self, rec: LeaseRecord, mapping: dict[int, int], start: float, end: float
    ) -> list[_Spec] | None:
        """Resumption (if suspended), the VM, then a shutdown or, if the window is short, a suspension."""
        req = rec.request
        specs: list[_Spec] = []
        vm_start = start
        if rec.state in _SUSPENDED:
            specs = self._op_specs(RESUME, mapping, req, start, forward=True)
            vm_start = max(s.end for s in specs)
        remaining = req.duration - rec.run_time
        shutdown = self._shutdown_time(req)
        if end - vm_start >= remaining + shutdown:
            specs.append(_Spec(VM, vm_start, vm_start + remaining, dict(mapping)))
            if shutdown > 0:
                specs.append(
                    _Spec(SHUTDOWN, vm_start + remaining, vm_start + remaining + shutdown, dict(mapping))
                )
            return specs
        if end - vm_start >= remaining:
            return (
                None  # it could run to the end but not shut down: a suspension would cut its shutdown (1.1)
            )
        suspensions = self._op_specs(SUSPEND, mapping, req, end, forward=False)
        suspend_start = min(s.start for s in suspensions)
        if suspend_start <= vm_start:
            return None
        specs.append(_Spec(VM, vm_start, suspend_start, dict(mapping)))
        return specs + suspensions

    # -- planning: advance reservations and preemption (§3.4, §4.4, §10 Q1, Q6) ---------------------------

    def _plan_exact(self, rec: LeaseRecord, now: float) -> _Plan | None:
        req = rec.request
        assert req.start is not None
        start, vm_end = req.start, req.start + req.duration
        end = vm_end + self._shutdown_time(req)
        found = self._map(self.table, req, start, end, True, None)
        victims: list[int] = []
        if found is None and self.config.preempts:
            victims = self._minimal_victims(req, start, end, now)
            if victims:
                found = self._map(self._without(victims, start), req, start, end, True, None)
        if found is None:
            return None
        mapping = found[0]
        specs = [_Spec(VM, start, vm_end, dict(mapping))]
        if end > vm_end:
            specs.append(_Spec(SHUTDOWN, vm_end, end, dict(mapping)))
        return _Plan(specs, preempt=victims)

    def _candidates(self, req: LeaseRequest, start: float, end: float) -> list[int]:
        """Preemptible best-effort leases in the way, youngest first (Q6)."""
        ids = {r.lease_id for r in self.table.reservations(start=start, end=end)}
        ok = [
            self.leases[i]
            for i in ids
            if i != req.id
            and self.leases[i].request.type == BEST_EFFORT
            and self.leases[i].request.preemptible
            and self.leases[i].state in _PREEMPTABLE
        ]
        ok.sort(key=lambda r: (-r.request.submit, -r.request.id))
        return [r.request.id for r in ok]

    def _minimal_victims(self, req: LeaseRequest, start: float, end: float, now: float) -> list[int]:
        """Add the youngest candidates until the AR fits, then drop every one it still fits without."""
        chosen: list[int] = []
        for lid in self._candidates(req, start, end):
            chosen.append(lid)
            if self._map(self._without(chosen, start), req, start, end, True, None) is not None:
                break
        else:
            return []
        for lid in reversed(list(chosen)):
            rest = [c for c in chosen if c != lid]
            if self._map(self._without(rest, start), req, start, end, True, None) is not None:
                chosen = rest
        return chosen

    def _without(self, lease_ids: Iterable[int], after: float) -> SlotTable:
        scratch = self.table.copy()
        for lid in lease_ids:
            for r in self.leases[lid].chain():
                if r.end > after:
                    scratch.remove(r.rid)
        return scratch

    def _preempt(self, rec: LeaseRecord, at: float, now: float) -> None:
        """Suspend the lease so that it is off its nodes by `at`, or cancel and requeue it (§4.4)."""
        vm = rec.current_vm()
        if vm is None or vm.start >= at or not self._can_suspend(rec, vm, at, now):
            self._requeue(rec, now)
            return
        for r in rec.chain():
            if r.kind in (SHUTDOWN, SUSPEND):
                self._cancel_record(r, now)
        suspensions = self._op_specs(SUSPEND, vm.nodes, rec.request, at, forward=False)
        self._retime(vm, min(s.start for s in suspensions), now)
        for spec in suspensions:
            self._place(rec, spec, now)

    def _can_suspend(self, rec: LeaseRecord, vm: ReservationRecord, at: float, now: float) -> bool:
        req = rec.request
        if self.config.suspension == "none" or (
            self.config.suspension == "serial-only" and len(req.vnodes) > 1
        ):
            return False
        if at - vm.start < self._threshold(req, rec.state in _SUSPENDED):
            return False
        suspensions = self._op_specs(SUSPEND, vm.nodes, req, at, forward=False)
        return min(s.start for s in suspensions) > max(vm.start, now)

    def _requeue(self, rec: LeaseRecord, now: float) -> None:
        """Cancel the lease's plan and put it back in the queue at its submit-time position.

        A running VM is stopped now and the lease will start again from scratch with its full duration; the
        work it loses is recorded (Q8), so that the run-time invariant still holds at its end."""
        running = rec.state == _S.ACTIVE
        vm = rec.current_vm()
        self._stop_chain(rec, now, count=False)
        if running and vm is not None:
            rec.lost_run_time += rec.run_time + (now - vm.start)
            rec.run_time = 0.0
            rec.images = {}
        self._future.discard(rec.request.id)
        rec.in_future = False
        target = _S.SUSPENDED_QUEUED if rec.state in _SUSPENDED else _S.QUEUED
        self._set_state(rec, target, now)
        self._enqueue(rec)

    # -- the greedy mapper (§4.1, §4.2) --------------------------------------------------------------------

    def _map(
        self,
        table: SlotTable,
        req: LeaseRequest,
        start: float,
        end: float,
        strict: bool,
        only: set[int] | None,
    ) -> tuple[dict[int, int], float] | None:
        """Pack vnodes (largest first) onto nodes in host-policy order; without `strict` the window may shrink.

        Returns (vnode -> node, end of the window found), or None."""
        order = self._order_of(req)
        mapping: dict[int, int] = {}
        latest = end
        i = 0
        for node in self._host_order(table, req, start, end - start, only):
            need = _EMPTY
            cap = self._capacity[node]
            while i < len(order):
                vnode = req.vnodes[order[i] - 1]
                trial = need + vnode if need is not _EMPTY else vnode
                # More than the node holds when empty never fits: fits_until would answer `start` (a full
                # node's second VM, every time a wide lease is mapped).
                until = self._fits_until(table, node, trial, start) if trial.fits_in(cap) else start
                if until < latest:
                    if strict or until <= start:
                        break
                    latest = until
                need = trial
                mapping[order[i]] = node
                i += 1
            if i == len(order):
                return mapping, latest
        return None

    def _check_fixed(
        self,
        table: SlotTable,
        req: LeaseRequest,
        fixed: dict[int, int],
        start: float,
        end: float,
        strict: bool,
    ) -> tuple[dict[int, int], float] | None:
        per_node: dict[int, Res] = {}
        for v, n in fixed.items():
            if n in self._excluded:
                return None
            use = req.vnodes[v - 1]
            per_node[n] = per_node[n] + use if n in per_node else use  # no Res built for a one-VM node
        latest = min(min(self._fits_until(table, n, need, start) for n, need in per_node.items()), end)
        if latest <= start or (strict and latest < end):
            return None
        return dict(fixed), latest

    def _fits_until(self, table: SlotTable, node: int, need: Res, start: float) -> float:
        if table is not self.table:
            return table.fits_until(node, need, start)
        memo = self._fit_memo.get(node)
        if memo is None:
            memo = self._fit_memo[node] = {}
        until = memo.get((need, start))
        if until is None:
            until = memo[(need, start)] = table.fits_until(node, need, start)
        return until

    def _host_order(
        self, table: SlotTable, req: LeaseRequest, start: float, duration: float, only: set[int] | None
    ) -> list[int]:
        nodes = [n for n in table.nodes if n not in self._excluded and (only is None or n in only)]
        if self.config.policy_host_selection == "no-policy":
            return nodes
        # A node where not even the smallest vnode fits at `start` can take nothing, so it is left out before
        # scoring: on a busy fleet this skips most of the per-node work of every mapping attempt.
        smallest = self._smallest_of(req)
        if table is self.table:
            # The room counts of _could_start already say, per node, how many smallest vnodes fit at `start`.
            per = self._room.counts(start, smallest, self._usable_nodes(), self._counter(smallest, start))
            nodes = [n for n in nodes if per[n] > 0]
        else:
            nodes = [n for n in nodes if smallest.fits_in(table.available_at(n, start))]

        def score(node: int) -> float:
            leases, change = (
                self._summary(node, start) if table is self.table else _summary(table, node, start)
            )
            crowd = (4 - min(leases, 4)) / 4
            steady = 1.0 if change == math.inf or duration <= 0 else min(1.0, (change - start) / duration)
            return 0.5 * crowd + 0.25 + 0.25 * steady

        return sorted(nodes, key=lambda n: -score(n))

    def _summary(self, node: int, t: float) -> tuple[int, float]:
        got = self._views.get(node)
        if got is None or not got[0] <= t < got[1]:
            leases, change, _ = _summary_span(self.table, node, t)
            # The answer holds for every t' in [t, change): the node's usage and lease set stay what they are
            # at t until `change`, so the count is the same and the first change after t' is still `change`.
            got = self._views[node] = (t, change, leases, change)
        return got[2], got[3]

    # -- suspend / resume / migrate / shutdown timing (§3.8, §3.12) ----------------------------------------

    def _shutdown_time(self, req: LeaseRequest) -> float:
        return self.config.shutdown_time + self.config.enactment_overhead * len(req.vnodes)

    def _op_time(self, mem: int, rate: float, override: float | None) -> float:
        return override if override is not None else float(math.ceil(mem / rate))

    def _estimate(self, req: LeaseRequest, rate: float, override: float | None) -> float:
        """Whole-lease suspend or resume estimate: one VM after another (Q5, the 1.1 formula)."""
        key = (req.id, rate, override)
        got = self._estimates.get(key)
        if got is None:
            overhead = self.config.enactment_overhead
            got = self._estimates[key] = sum(
                self._op_time(v.mem, rate, override) + overhead for v in req.vnodes
            )
        return got

    def _threshold(self, req: LeaseRequest, resuming: bool) -> float:
        """The shortest run worth starting or keeping (§3.9); 0 without suspension (Q17)."""
        if self.config.suspension == "none":
            return 0.0
        if self.config.force_scheduling_threshold is not None:
            return self.config.force_scheduling_threshold
        key = (req.id, resuming)  # asked for every queued lease at every pass, like the estimates below it
        got = self._thresholds.get(key)
        if got is None:
            safe = self._estimate(req, self.config.suspend_rate, self.config.override_suspend_time)
            if resuming:
                safe += self._estimate(req, self.config.resume_rate, self.config.override_resume_time)
            got = self._thresholds[key] = safe * (1 + self.config.scheduling_threshold_factor)
        return got

    def _op_specs(
        self, kind: str, mapping: Mapping[int, int], req: LeaseRequest, anchor: float, *, forward: bool
    ) -> list[_Spec]:
        """Suspension (backwards from `anchor`) or resumption (forwards) reservations for the mapped vnodes."""
        cfg = self.config
        rate, override = (
            (cfg.resume_rate, cfg.override_resume_time)
            if kind == RESUME
            else (cfg.suspend_rate, cfg.override_suspend_time)
        )
        ops = {v: self._op_time(req.vnodes[v - 1].mem, rate, override) for v in sorted(mapping)}
        if cfg.suspendresume_exclusion == "global":
            groups = _global_groups(ops, mapping, anchor, forward, cfg.enactment_overhead)
        else:
            groups = _local_groups(ops, mapping, anchor, forward, cfg.enactment_overhead)
        return [_Spec(kind, a, b, vn) for a, b, vn in sorted(groups, key=lambda g: g[0])]

    def _migration_specs(self, rec: LeaseRecord, mapping: dict[int, int], now: float) -> list[_Spec]:
        """Rounds of disjoint node pairs, back to back from now, each as long as its largest memory image."""
        moves = {v: (rec.images[v], n) for v, n in sorted(mapping.items()) if rec.images.get(v, n) != n}
        if self.config.migration == "yes-notransfer":
            return []
        specs: list[_Spec] = []
        t = now
        while moves:
            busy: set[int] = set()
            batch: dict[int, tuple[int, int]] = {}
            for v, (src, dst) in moves.items():
                if src not in busy and dst not in busy:
                    batch[v] = (src, dst)
                    busy |= {src, dst}
            for v in batch:
                del moves[v]
            largest = max(rec.request.vnodes[v - 1].mem for v in batch)
            length = float(math.ceil(largest * 8 / self.config.migration_bandwidth))
            specs.append(
                _Spec(
                    MIGRATE,
                    t,
                    t + length,
                    {v: d for v, (_, d) in batch.items()},
                    {v: s for v, (s, _) in batch.items()},
                )
            )
            t += length
        return specs

    def _migration_fits(self, spec: _Spec) -> bool:
        alloc = self._migration_alloc(spec)
        return all(self.table.fits(n, use, spec.start, spec.end) for n, use in alloc.items())

    def _migration_alloc(self, spec: _Spec) -> dict[int, Res]:
        """The migration bandwidth on both ends, capped by what a node declares (a fleet may declare none)."""
        bw = self.config.migration_bandwidth
        alloc: dict[int, Res] = {}
        for v, dst in spec.nodes.items():
            src = spec.sources[v]
            alloc[src] = alloc.get(src, Res()) + Res(net_out=min(bw, self.table.capacity(src).net_out))
            alloc[dst] = alloc.get(dst, Res()) + Res(net_in=min(bw, self.table.capacity(dst).net_in))
        return alloc

    # -- committing plans and changing the table -----------------------------------------------------------

    def _commit(self, rec: LeaseRecord, plan: _Plan, now: float) -> None:
        for spec in plan.specs:
            self._place(rec, spec, now)
        if rec.state in _SUSPENDED:
            self._set_state(rec, _S.SUSPENDED_SCHEDULED, now)
        else:
            self._set_state(rec, _S.SCHEDULED, now)
            self._set_state(rec, _S.READY, now)
        if plan.in_future:
            self._future.add(rec.request.id)
            rec.in_future = True

    def _alloc(self, rec: LeaseRecord, spec: _Spec) -> dict[int, Res]:
        if spec.kind == MIGRATE:
            return self._migration_alloc(spec)
        alloc: dict[int, Res] = {}
        for v, n in spec.nodes.items():
            use = rec.request.vnodes[v - 1]
            # A suspension or resumption holds the memory of the VMs it moves and the CPU that moves it (Q13).
            if spec.kind in (SUSPEND, RESUME):
                use = _cpu_mem(use)
            # One VM per node is the common case: no sum to build (a 48-VM lease placed or retimed built 96 Res).
            alloc[n] = alloc[n] + use if n in alloc else use
        return alloc

    def alloc_of(self, rec: LeaseRecord, r: ReservationRecord) -> dict[int, Res]:
        """What a reservation holds on each node (node id -> resources), for checks and displays."""
        return self._alloc(rec, _Spec(r.kind, r.start, r.end, r.nodes, r.sources))

    def _table_row(self, rec: LeaseRecord, r: ReservationRecord) -> Reservation:
        return Reservation(r.rid, r.lease_id, r.kind, r.start, r.end, self.alloc_of(rec, r))

    def _place(self, rec: LeaseRecord, spec: _Spec, now: float) -> ReservationRecord:
        r = ReservationRecord(self._next_rid, rec.request.id, spec.kind, spec.start, spec.end, spec.nodes)
        r.sources = dict(spec.sources)
        self._next_rid += 1
        row = self._table_row(rec, r)
        self.table.add(row)
        self._touch(row.alloc)
        self._records[r.rid] = r
        rec.reservations.append(r)
        self._push_events(r)
        self._journal(now, r, "reservation_added")
        return r

    def _retime(self, r: ReservationRecord, end: float, now: float) -> None:
        """Move a reservation's end (a VM cut short to make room for its suspension)."""
        row = replace(self.table.get(r.rid), end=end)
        self.table.replace(row)
        self._touch(row.alloc)
        r.end = end
        self._push_events(r)
        self._journal(now, r, "reservation_changed")

    def _retire(self, r: ReservationRecord, end: float, now: float) -> None:
        """A reservation is over at `end` (<= now). Its row leaves the table: nothing is ever planned before
        now, and without this the 30-day replay's table grew to every reservation ever made."""
        self._touch(self.table.remove(r.rid).alloc)
        r.end, r.status = end, DONE
        self._journal(now, r, "reservation_changed")

    def _cancel_record(self, r: ReservationRecord, now: float) -> None:
        self._touch(self.table.remove(r.rid).alloc)
        r.status = CANCELLED
        self._journal(now, r, "reservation_cancelled")

    def _stop_chain(self, rec: LeaseRecord, now: float, *, count: bool = True) -> None:
        """Drop what has not started and cut what is running at `now`; a cut VM's time counts if `count`."""
        for r in rec.chain():
            if r.start >= now:
                self._cancel_record(r, now)
            else:
                if r.kind == VM and count:
                    rec.run_time += min(now, r.end) - r.start
                self._retire(r, min(now, r.end), now)

    def _touch(self, nodes: Iterable[int]) -> None:
        nodes = tuple(nodes)  # walked twice below, and callers may hand in a generator
        for node in nodes:
            self._views.pop(node, None)
            self._fit_memo.pop(node, None)
        self._room.touch(nodes)

    def _journal(self, now: float, r: ReservationRecord, what: str) -> None:
        snapshot = replace(r, nodes=dict(r.nodes), sources=dict(r.sources))
        self._changes.append(Change(now, r.lease_id, what, reservation=snapshot))

    def _set_state(self, rec: LeaseRecord, target: LeaseState, now: float) -> None:
        before = rec.state
        rec.state = lease_transition(before, target, ident=str(rec.request.id), lease_type=rec.request.type)
        rec.history.append((now, str(before), str(target)))
        self._changes.append(Change(now, rec.request.id, "lease_state", state=target))

    # -- events (§3.1) -------------------------------------------------------------------------------------

    def _push_events(self, r: ReservationRecord) -> None:
        self._tick += 1
        if r.status == SCHEDULED:
            heapq.heappush(self._events, (r.start, 2, self._tick, r.rid))
        heapq.heappush(self._events, (r.end, 1, self._tick, r.rid))

    def _push_early_end(self, rec: LeaseRecord, vm: ReservationRecord) -> None:
        at = self._early_end(rec, vm)
        if at is not None:
            self._tick += 1
            heapq.heappush(self._events, (at, 0, self._tick, vm.rid))

    def _early_end(self, rec: LeaseRecord, vm: ReservationRecord) -> float | None:
        """When the VM stops because the lease's real run time is used up (simulation), if before its plan ends."""
        real = rec.request.real_duration
        if real is None or vm.status != ACTIVE:
            return None
        at = vm.start + (real - rec.run_time)
        suspends = any(r.kind == SUSPEND for r in rec.chain())
        return at if at < vm.end or (at == vm.end and suspends) else None

    def _event_valid(self, event: tuple[float, int, int, int]) -> bool:
        t, phase, _, rid = event
        r = self._records.get(rid)
        if r is None:
            return False
        if phase == 0:
            return r.kind == VM and self._early_end(self.leases[r.lease_id], r) == t
        if phase == 1:
            return r.status == ACTIVE and r.end == t
        return r.status == SCHEDULED and r.start == t

    def _run_events(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            event = heapq.heappop(self._events)
            if not self._event_valid(event):
                continue
            t, phase, _, rid = event
            r = self._records[rid]
            rec = self.leases[r.lease_id]
            try:
                if phase == 0:
                    self._end_early(rec, r, t)
                elif phase == 1:
                    self._on_end(rec, r, t)
                else:
                    self._on_start(rec, r, t)
            except Exception as exc:
                self._contain(rec, t, exc)

    def _on_start(self, rec: LeaseRecord, r: ReservationRecord, t: float) -> None:
        r.status = ACTIVE
        self._journal(t, r, "reservation_changed")
        if r.kind == VM:
            self._set_state(rec, _S.ACTIVE, t)
            if rec.first_start is None:
                rec.first_start = t
            self._future.discard(rec.request.id)
            rec.in_future = False
            self._push_early_end(rec, r)
        elif r.kind == MIGRATE:
            self._set_state(rec, _S.MIGRATING, t)
        elif r.kind == RESUME and rec.state == _S.SUSPENDED_SCHEDULED:
            self._set_state(rec, _S.RESUMING, t)
        elif r.kind == SUSPEND and rec.state == _S.ACTIVE:
            self._set_state(rec, _S.SUSPENDING, t)

    def _on_end(self, rec: LeaseRecord, r: ReservationRecord, t: float) -> None:
        self._retire(r, t, t)
        left = [x for x in rec.chain() if x.kind == r.kind]
        if r.kind == VM:
            rec.run_time += r.end - r.start
            if not rec.chain():
                self._finish(rec, t)
        elif r.kind == SHUTDOWN:
            self._finish(rec, t)
        elif r.kind == MIGRATE:
            rec.images.update(r.nodes)
            self._set_state(rec, _S.SUSPENDED_SCHEDULED, t)
        elif r.kind == RESUME and not left:
            self._set_state(rec, _S.RESUMED_READY, t)
        elif r.kind == SUSPEND and not left:
            rec.images = self._suspended_images(rec, r)
            self._set_state(rec, _S.SUSPENDED_PENDING, t)
            self._set_state(rec, _S.SUSPENDED_QUEUED, t)
            self._enqueue(rec)

    def _suspended_images(self, rec: LeaseRecord, r: ReservationRecord) -> dict[int, int]:
        """Where the memory images of a lease just suspended are: on the nodes of its last VM. A lease loaded from
        the database without that VM still has its suspensions, whose vnodes -> nodes are the same mapping."""
        vm = next((x for x in reversed(rec.reservations) if x.kind == VM), None)
        if vm is not None:
            return dict(vm.nodes)
        images: dict[int, int] = {}
        for x in rec.reservations:
            if x.kind == SUSPEND and x.end == r.end:
                images.update(x.nodes)
        return images

    def _finish(self, rec: LeaseRecord, t: float) -> None:
        self._set_state(rec, _S.DONE, t)
        rec.end = t

    def _end_early(self, rec: LeaseRecord, vm: ReservationRecord, t: float) -> None:
        """The lease's real run time is used up: stop the VM, drop the rest of its plan, re-evaluate (§3.7)."""
        for r in rec.chain():
            if r.rid != vm.rid:
                self._cancel_record(r, t)
        rec.run_time += t - vm.start
        self._retire(vm, t, t)
        self._finish(rec, t)
        self._reevaluate(max(t, self._now))

    def _reevaluate(self, now: float) -> None:
        """Pull future best-effort reservations earlier into capacity that freed up; they can only improve."""
        for lid in sorted(self._future, key=lambda i: (self.leases[i].request.submit, i)):
            rec = self.leases[lid]
            if rec.state not in _REEVALUATED:
                continue
            for r in rec.chain():
                self._cancel_record(r, now)
            self._future.discard(lid)
            rec.in_future = False
            suspended = rec.state == _S.SUSPENDED_SCHEDULED
            try:
                self._set_state(rec, _S.SUSPENDED_PENDING if suspended else _S.PENDING, now)
                plan = self._plan_asap(rec, now, allow_future=self._can_schedule_in_future())
                if plan is not None:
                    self._commit(rec, plan, now)
                else:
                    self._set_state(rec, _S.SUSPENDED_QUEUED if suspended else _S.QUEUED, now)
                    self._enqueue(rec)
            except Exception as exc:
                self._contain(rec, now, exc)


# -- helpers ---------------------------------------------------------------------------------------------


_ONE_CPU = Res(cpu=1)
_EMPTY = Res()  # a node's share before any vnode is mapped to it (compared by identity)


@lru_cache(maxsize=4096)
def _smallest(vnodes: tuple[Res, ...]) -> Res:
    """The component-wise minimum of a lease's vnodes: no vnode can go where this does not fit."""
    return Res(*(min(getattr(v, f.name) for v in vnodes) for f in fields(Res)))


@lru_cache(maxsize=1024)  # a trace asks the same few shapes again and again; each check is O(vnodes x nodes)
def _packs(vnodes: tuple[Res, ...], capacities: tuple[Res, ...]) -> bool:
    """First-fit, largest first, into empty nodes: a lease failing this could never run, and queueing it
    would keep a replay (or the live queue) waiting forever."""
    free = list(capacities)
    for v in _size_order(vnodes):
        need = vnodes[v - 1]
        slot = next((i for i, f in enumerate(free) if need.fits_in(f)), None)
        if slot is None:
            return False
        free[slot] = free[slot] - need
    return True


def _summary(table: SlotTable, node: int, t: float) -> tuple[int, float]:
    """At t on a node: how many leases are there, and when its availability or lease set next changes."""
    leases, change, _ = _summary_span(table, node, t)
    return leases, change


def _summary_span(table: SlotTable, node: int, t: float) -> tuple[int, float, float]:
    """_summary, plus the node's next reservation start or end after t: the answer holds until then."""
    rows = [(r.start, r.end, r.lease_id, r.alloc[node]) for r in table.reservations(start=t, node=node)]

    def state_at(x: float) -> tuple[Res, frozenset[int]]:
        used = Res()
        leases: set[int] = set()
        for a, b, lid, use in rows:
            if a <= x < b:
                used = used + use
                leases.add(lid)
        return used, frozenset(leases)

    now = state_at(t)
    # Back-to-back reservations of one lease with the same use (a VM and its shutdown) are one span, as in
    # Haizea's availability window, so only a real change of availability or of lease set counts.
    points = sorted({p for a, b, _, _ in rows for p in (a, b) if p > t})
    change = next((x for x in points if state_at(x) != now), math.inf)
    return len(now[1]), change, points[0] if points else math.inf


def _local_groups(
    ops: dict[int, float], mapping: Mapping[int, int], anchor: float, forward: bool, overhead: float
) -> list[tuple[float, float, dict[int, int]]]:
    """Local exclusion: VMs on one node one after another, nodes in parallel; equal windows form one group,
    each group grows by the enactment overhead per VM, and groups are shifted apart so they never overlap."""
    windows: dict[tuple[float, float], dict[int, int]] = {}
    by_node: dict[int, list[int]] = {}
    for v in sorted(ops):
        by_node.setdefault(mapping[v], []).append(v)
    for node, vnodes in by_node.items():
        t = anchor
        for v in vnodes:
            a, b = (t, t + ops[v]) if forward else (t - ops[v], t)
            t = b if forward else a
            windows.setdefault((a, b), {})[v] = node
    groups: list[tuple[float, float, dict[int, int]]] = []
    for (a, b), vn in windows.items():
        extra = overhead * len(vn)
        groups.append((a, b + extra, vn) if forward else (a - extra, b, vn))
    return _separate(groups, forward)


def _separate(
    groups: list[tuple[float, float, dict[int, int]]], forward: bool
) -> list[tuple[float, float, dict[int, int]]]:
    ordered = sorted(groups, key=lambda g: g[0] if forward else -g[1])
    out: list[tuple[float, float, dict[int, int]]] = []
    for a, b, vn in ordered:
        if out and forward and a < out[-1][1]:
            a, b = a + (out[-1][1] - a), b + (out[-1][1] - a)
        elif out and not forward and b > out[-1][0]:
            a, b = a - (b - out[-1][0]), b - (b - out[-1][0])
        out.append((a, b, vn))
    return out


def _global_groups(
    ops: dict[int, float], mapping: Mapping[int, int], anchor: float, forward: bool, overhead: float
) -> list[tuple[float, float, dict[int, int]]]:
    """Global exclusion: every VM of the lease one after another, each taking its time plus the overhead."""
    groups: list[tuple[float, float, dict[int, int]]] = []
    t = anchor
    for v in sorted(ops):
        step = ops[v] + overhead
        a, b = (t, t + step) if forward else (t - step, t)
        t = b if forward else a
        groups.append((a, b, {v: mapping[v]}))
    return groups
