"""What the scheduler is told and what it answers: its configuration, lease requests, reservation and lease records,
decisions and journal entries, and the plans it builds internally.

PURE: no Django.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

from leases.lifecycle import LeaseState
from leases.slottable import Res

BEST_EFFORT = "best_effort"
ADVANCE_RESERVATION = "advance_reservation"
IMMEDIATE = "immediate"

VM, SUSPEND, RESUME, MIGRATE, SHUTDOWN = "vm", "suspend", "resume", "migrate", "shutdown"
# Room kept on a node for one vnode of a lease that lost its own (a reschedule proposal's target), until the move
# is approved, rejected or expires: in the slot table like any reservation, so new work cannot take it, but not
# part of the lease's plan (`chain`), whose steps it takes no part in.
HOLD = "hold"
SCHEDULED, ACTIVE, DONE, CANCELLED = "scheduled", "active", "done", "cancelled"

_S = LeaseState
SUSPENDED_STATES = frozenset({_S.SUSPENDED_PENDING, _S.SUSPENDED_QUEUED, _S.SUSPENDED_SCHEDULED})
# A lease in one of these states holds only reservations that have not started, or a VM that is simply
# running, so preempting it never cuts a suspension, resumption or migration in half.
PREEMPTABLE_STATES = frozenset({_S.SCHEDULED, _S.READY, _S.ACTIVE, _S.SUSPENDED_SCHEDULED})
REEVALUATED_STATES = frozenset({_S.SCHEDULED, _S.READY, _S.SUSPENDED_SCHEDULED})
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
    # Slotkeeper's own (not a Haizea option, off in replay): when the greedy mapper's first choice would hold a
    # best-effort lease for less than the threshold, try once more for its whole duration before it waits. Haizea
    # gives up there, and the lease waits in the queue while other nodes could run it whole.
    whole_window_retry: bool = False
    # Slotkeeper's own (off in replay, which has no live readings): work that starts now on the live fleet goes,
    # one VM at a time, to the node with the most free slots for it, then the most live CPU headroom, then the
    # lowest id (seed 001's ranking: spread, and the idler of two equal nodes). Haizea's greedy order packs a
    # node before it moves on, and knows nothing of load.
    rank_by_slots: bool = False

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
    # Group rules, as the mapper takes them (fleet/affinity.py decides them): at most `spread` of this lease's
    # VMs on one node, less `taken` (node id, the group's members already there); and `avoid`, nodes a soft rule
    # would rather not use, tried last.
    spread: int | None = None
    taken: tuple[tuple[int, int], ...] = ()
    avoid: frozenset[int] = frozenset()
    # Nodes this lease may never use whatever the time (a missing capability, a hard affinity elsewhere), each
    # with "code: sentence". Kept with the request, so the queue honours them when it places the lease later.
    barred: tuple[tuple[int, str], ...] = ()
    # The capabilities it asks for, for the words of a refusal (the barred nodes already say where it may not go).
    capabilities: frozenset[str] = frozenset()


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
    # Why its next state change will happen, when that is decided now but comes later (a suspension planned for
    # an advance reservation starts at its own time).
    why: str = ""

    def chain(self) -> list[ReservationRecord]:
        """The reservations of the current plan (not yet done or cancelled), in time order; holds apart."""
        return [r for r in self.reservations if r.status in (SCHEDULED, ACTIVE) and r.kind != HOLD]

    def holds(self) -> list[ReservationRecord]:
        """The room held for its vnodes that lost their node (reschedule proposals' targets), not yet released."""
        return [r for r in self.reservations if r.kind == HOLD and r.status in (SCHEDULED, ACTIVE)]

    def current_vm(self) -> ReservationRecord | None:
        return next((r for r in self.chain() if r.kind == VM), None)


@dataclass(frozen=True)
class Decision:
    """The answer to submit / cancel; `Scheduler.explain` says node by node why (docs/capacity.md)."""

    accepted: bool
    lease_id: int
    state: LeaseState
    message: str
    # When not accepted for want of room: the placer's outcome (no_capable_node, fleet_unreadable,
    # fleet_at_capacity), which the API answers as the 409's `code`; "" otherwise.
    code: str = ""


@dataclass(frozen=True)
class Change:
    """One journal entry: reservation_added | reservation_changed | reservation_cancelled | lease_state."""

    at: float
    lease_id: int
    what: str
    reservation: ReservationRecord | None = None
    state: LeaseState | None = None
    # Why a lease's state changed, when something other than its own plan moved it (preempted by lease N, moved
    # earlier after lease M ended, requeued off a draining node): the lease's history says it.
    reason: str = ""


# The placer's outcomes (fleet/capacity.py Outcome), as a Trial names them; REFUSED is a request the scheduler
# does not admit for what it asks (a window already past, a type it does not take), whatever the fleet.
PLACED, NO_CAPABLE_NODE, FLEET_UNREADABLE, FLEET_AT_CAPACITY, REFUSED = (
    "placed",
    "no_capable_node",
    "fleet_unreadable",
    "fleet_at_capacity",
    "refused",
)


@dataclass(frozen=True)
class Trial:
    """The one answer to "can this run, where, and if not why" (`Scheduler.decide`): what a submission of the
    request would get now, without anything being written. `mapping` is vnode -> node over [start, end) when
    placed; `preempt` the best-effort leases an advance reservation would suspend or requeue; `message` says
    why when not placed."""

    outcome: str
    start: float
    end: float
    mapping: Mapping[int, int] = field(default_factory=dict)
    preempt: tuple[int, ...] = ()
    message: str = ""

    @property
    def placed(self) -> bool:
        return self.outcome == PLACED

    @property
    def nodes(self) -> list[int]:
        """The distinct nodes, in vnode order."""
        return list(dict.fromkeys(self.mapping[v] for v in sorted(self.mapping)))


@dataclass
class Spec:
    kind: str
    start: float
    end: float
    nodes: dict[int, int]
    sources: dict[int, int] = field(default_factory=dict)


@dataclass
class Plan:
    specs: list[Spec]
    in_future: bool = False
    preempt: list[int] = field(default_factory=list)


def utc_label(t: float) -> str:
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%H:%M" if moment.second == 0 else "%H:%M:%S")


@lru_cache(maxsize=1024)
def cpu_mem(r: Res) -> Res:
    return Res(cpu=r.cpu, mem=r.mem)
