"""The lease and instance state machines.

This module owns which state changes are legal (for a lease: Haizea's machine, SEMANTICS.md §1.3-§1.4 with
the Slotkeeper decisions of §10; for an instance: the lifecycle of seed 003), which instance states are
consistent with a lease state, and how an instance is named. When an unhealthy instance may be restarted and
what happens to an instance whose node died are the instances package's rules (leases/instances/rules.py).

Pure: no Django, no clock. Every function takes the time it needs as epoch seconds (float), so the live
service, replay and the tests share the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class LeaseState(StrEnum):
    NEW = "new"
    PENDING = "pending"
    REJECTED = "rejected"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    CANCELLED = "cancelled"
    PREPARING = "preparing"
    READY = "ready"
    ACTIVE = "active"
    SUSPENDING = "suspending"
    SUSPENDED_PENDING = "suspended_pending"
    SUSPENDED_QUEUED = "suspended_queued"
    SUSPENDED_SCHEDULED = "suspended_scheduled"
    MIGRATING = "migrating"
    RESUMING = "resuming"
    RESUMED_READY = "resumed_ready"
    DONE = "done"
    FAILED = "failed"
    REJECTED_BY_USER = "rejected_by_user"


class InstanceState(StrEnum):
    REQUESTED = "requested"
    PLACED = "placed"
    FETCHING = "fetching"
    VERIFIED = "verified"
    LOADED = "loaded"
    RUNNING = "running"
    UNHEALTHY = "unhealthy"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"
    LOST = "lost"
    RESCHEDULED = "rescheduled"
    REVOKED = "revoked"
    UNLOADED = "unloaded"


# Short aliases keep the transition tables below readable at 110 columns.
_L = LeaseState
_I = InstanceState

TERMINAL_LEASE_STATES: frozenset[LeaseState] = frozenset(
    {_L.REJECTED, _L.CANCELLED, _L.DONE, _L.FAILED, _L.REJECTED_BY_USER}
)

# Only UNLOADED is final: a stopped, finished or failed instance can still be started again by an operator
# (seed 003), so calling those terminal would let a sweep delete a record somebody is about to revive.
TERMINAL_INSTANCE_STATES: frozenset[InstanceState] = frozenset({_I.UNLOADED})

LIVE_INSTANCE_STATES: frozenset[InstanceState] = frozenset(
    {_I.PLACED, _I.FETCHING, _I.VERIFIED, _I.LOADED, _I.RUNNING, _I.UNHEALTHY, _I.RESTARTING, _I.STOPPING}
)

LEASE_TYPES: tuple[str, ...] = ("best_effort", "advance_reservation", "immediate", "deadline")


# Haizea 1.0's machine (§1.4) plus two 1.1 steps: PENDING -> REJECTED_BY_USER (the quote was refused) and
# PREPARING -> QUEUED (a best-effort lease preempted while preparing is requeued like one that is SCHEDULED or
# READY). 1.1's ACTIVE -> READY is left out: only its deadline mapper used it, and a preempted running lease
# here is either suspended or requeued from scratch (Q8). MIGRATING is entered while a memory-image migration
# reservation runs (Q14) and always returns to SUSPENDED_SCHEDULED, where the resumption starts.
LEASE_TRANSITIONS: Mapping[LeaseState, frozenset[LeaseState]] = MappingProxyType(
    {
        _L.NEW: frozenset({_L.PENDING}),
        _L.PENDING: frozenset({_L.SCHEDULED, _L.QUEUED, _L.CANCELLED, _L.REJECTED, _L.REJECTED_BY_USER}),
        _L.SCHEDULED: frozenset({_L.PREPARING, _L.QUEUED, _L.PENDING, _L.READY, _L.CANCELLED, _L.FAILED}),
        _L.QUEUED: frozenset({_L.SCHEDULED, _L.CANCELLED}),
        _L.PREPARING: frozenset({_L.READY, _L.PENDING, _L.QUEUED, _L.CANCELLED, _L.FAILED}),
        _L.READY: frozenset({_L.ACTIVE, _L.QUEUED, _L.PENDING, _L.CANCELLED, _L.FAILED}),
        _L.ACTIVE: frozenset({_L.SUSPENDING, _L.QUEUED, _L.DONE, _L.CANCELLED, _L.FAILED}),
        _L.SUSPENDING: frozenset({_L.SUSPENDED_PENDING, _L.CANCELLED, _L.FAILED}),
        _L.SUSPENDED_PENDING: frozenset(
            {_L.SUSPENDED_QUEUED, _L.SUSPENDED_SCHEDULED, _L.CANCELLED, _L.FAILED}
        ),
        _L.SUSPENDED_QUEUED: frozenset({_L.SUSPENDED_SCHEDULED, _L.CANCELLED, _L.FAILED}),
        _L.SUSPENDED_SCHEDULED: frozenset(
            {_L.SUSPENDED_QUEUED, _L.SUSPENDED_PENDING, _L.MIGRATING, _L.RESUMING, _L.CANCELLED, _L.FAILED}
        ),
        _L.MIGRATING: frozenset({_L.SUSPENDED_SCHEDULED, _L.CANCELLED, _L.FAILED}),
        _L.RESUMING: frozenset({_L.RESUMED_READY, _L.CANCELLED, _L.FAILED}),
        _L.RESUMED_READY: frozenset({_L.ACTIVE, _L.CANCELLED, _L.FAILED}),
        _L.DONE: frozenset(),
        _L.CANCELLED: frozenset(),
        _L.FAILED: frozenset(),
        _L.REJECTED: frozenset(),
        _L.REJECTED_BY_USER: frozenset(),
    }
)

# An advance reservation runs in its exact window or is rejected, and an immediate lease runs its whole
# duration now or is rejected (Q7): neither is ever queued, suspended, resumed or taken back to PENDING for
# re-evaluation (§3.7 moves best-effort leases only). Without this an immediate lease could be accepted with a
# planned suspension and never resumed, which is the Haizea quirk Q7 removes.
_FIXED_WINDOW_TYPES: Mapping[str, str] = MappingProxyType(
    {"advance_reservation": "an advance reservation", "immediate": "an immediate lease"}
)
_FIXED_WINDOW_STATES = TERMINAL_LEASE_STATES | {
    _L.NEW,
    _L.PENDING,
    _L.SCHEDULED,
    _L.PREPARING,
    _L.READY,
    _L.ACTIVE,
}

# Revocation and node loss can interrupt any instance that exists (seed 003). A RESCHEDULED record is already
# replaced elsewhere and is only ever unloaded, and a REVOKED instance whose node then dies is still revoked:
# marking it LOST would offer it for a reschedule that the revocation forbids.
_INTERRUPTS = frozenset({_I.REVOKED, _I.LOST})
_INSTANCE_STEPS: dict[InstanceState, frozenset[InstanceState]] = {
    _I.REQUESTED: frozenset({_I.PLACED, _I.FAILED}),
    _I.PLACED: frozenset({_I.FETCHING, _I.LOADED, _I.RUNNING, _I.FAILED}),
    _I.FETCHING: frozenset({_I.VERIFIED, _I.FAILED}),
    _I.VERIFIED: frozenset({_I.LOADED, _I.FAILED}),
    _I.LOADED: frozenset({_I.RUNNING, _I.UNLOADED, _I.FAILED}),
    _I.RUNNING: frozenset({_I.UNHEALTHY, _I.STOPPING, _I.STOPPED, _I.FINISHED, _I.FAILED, _I.UNLOADED}),
    _I.UNHEALTHY: frozenset({_I.RUNNING, _I.RESTARTING, _I.STOPPING, _I.FAILED, _I.UNLOADED}),
    _I.RESTARTING: frozenset({_I.RUNNING, _I.UNHEALTHY, _I.FAILED, _I.STOPPING}),
    _I.STOPPING: frozenset({_I.STOPPED, _I.UNLOADED, _I.FAILED}),
    _I.STOPPED: frozenset({_I.RUNNING, _I.UNLOADED, _I.FAILED}),
    _I.FINISHED: frozenset({_I.RUNNING, _I.UNLOADED}),
    _I.FAILED: frozenset({_I.RUNNING, _I.UNLOADED}),
    _I.LOST: frozenset({_I.RUNNING, _I.RESCHEDULED, _I.UNLOADED, _I.FAILED}),
    _I.RESCHEDULED: frozenset({_I.UNLOADED}),
    _I.REVOKED: frozenset({_I.UNLOADED, _I.FAILED}),
    _I.UNLOADED: frozenset(),
}


def _with_interrupts(state: InstanceState, steps: frozenset[InstanceState]) -> frozenset[InstanceState]:
    if state in TERMINAL_INSTANCE_STATES or state is _I.RESCHEDULED:
        return steps
    interrupts = _INTERRUPTS - {_I.LOST} if state is _I.REVOKED else _INTERRUPTS
    return (steps | interrupts) - {state}


INSTANCE_TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = MappingProxyType(
    {state: _with_interrupts(state, steps) for state, steps in _INSTANCE_STEPS.items()}
)


class IllegalTransition(Exception):
    """A state change the machine does not allow; the message names both states (the API answers 409)."""

    def __init__(self, kind: str, ident: str, current: str, target: str, why: str = ""):
        self.kind = kind
        self.ident = ident
        self.current = str(current)
        self.target = str(target)
        self.why = why
        subject = f"{kind} {ident}" if ident else kind
        message = f"{subject}: cannot go from {self.current} to {self.target}"
        super().__init__(f"{message} ({why})" if why else message)


def _fixed_window_refusal(current: LeaseState, target: LeaseState, lease_type: str | None) -> str:
    if lease_type is None:
        return ""
    if lease_type not in LEASE_TYPES:
        raise ValueError(f"unknown lease type {lease_type!r}; known: {', '.join(LEASE_TYPES)}")
    if lease_type not in _FIXED_WINDOW_TYPES:
        return ""
    if target not in _FIXED_WINDOW_STATES or (target is _L.PENDING and current is not _L.NEW):
        return f"{_FIXED_WINDOW_TYPES[lease_type]} is never queued, suspended or re-evaluated"
    return ""


def can_lease(current: LeaseState | str, target: LeaseState | str, *, lease_type: str | None = None) -> bool:
    """Whether a lease may go from `current` to `target`; `lease_type` adds the fixed-window rule (Q7)."""
    here, there = LeaseState(current), LeaseState(target)
    return there in LEASE_TRANSITIONS[here] and not _fixed_window_refusal(here, there, lease_type)


def lease_transition(
    current: LeaseState | str, target: LeaseState | str, *, ident: str = "", lease_type: str | None = None
) -> LeaseState:
    """Return `target` if the step is legal, else raise IllegalTransition (nothing is changed either way)."""
    here, there = LeaseState(current), LeaseState(target)
    if there not in LEASE_TRANSITIONS[here]:
        raise IllegalTransition("lease", ident, here, there)
    why = _fixed_window_refusal(here, there, lease_type)
    if why:
        raise IllegalTransition("lease", ident, here, there, why)
    return there


def can_instance(current: InstanceState | str, target: InstanceState | str) -> bool:
    """Whether an instance may go from `current` to `target` (seed 003's lifecycle)."""
    return InstanceState(target) in INSTANCE_TRANSITIONS[InstanceState(current)]


def instance_transition(
    current: InstanceState | str, target: InstanceState | str, *, ident: str = ""
) -> InstanceState:
    """Return `target` if the step is legal, else raise IllegalTransition."""
    here, there = InstanceState(current), InstanceState(target)
    if there not in INSTANCE_TRANSITIONS[here]:
        raise IllegalTransition("instance", ident, here, there)
    return there


# A CSS colour name per state for the console badges: green runs, orange/yellow waits or is interrupted, blue
# and purple are in transit, red ended badly, grey is idle or gone.
LEASE_BADGES: Mapping[LeaseState, str] = MappingProxyType(
    {
        _L.NEW: "silver",
        _L.PENDING: "lightsteelblue",
        _L.REJECTED: "firebrick",
        _L.SCHEDULED: "steelblue",
        _L.QUEUED: "goldenrod",
        _L.CANCELLED: "dimgray",
        _L.PREPARING: "cadetblue",
        _L.READY: "mediumseagreen",
        _L.ACTIVE: "green",
        _L.SUSPENDING: "darkorange",
        _L.SUSPENDED_PENDING: "orange",
        _L.SUSPENDED_QUEUED: "sandybrown",
        _L.SUSPENDED_SCHEDULED: "peru",
        _L.MIGRATING: "mediumpurple",
        _L.RESUMING: "darkcyan",
        _L.RESUMED_READY: "lightseagreen",
        _L.DONE: "darkgreen",
        _L.FAILED: "crimson",
        _L.REJECTED_BY_USER: "indianred",
    }
)
INSTANCE_BADGES: Mapping[InstanceState, str] = MappingProxyType(
    {
        _I.REQUESTED: "silver",
        _I.PLACED: "lightsteelblue",
        _I.FETCHING: "cadetblue",
        _I.VERIFIED: "steelblue",
        _I.LOADED: "mediumseagreen",
        _I.RUNNING: "green",
        _I.UNHEALTHY: "darkorange",
        _I.RESTARTING: "orange",
        _I.STOPPING: "slategray",
        _I.STOPPED: "dimgray",
        _I.FINISHED: "darkgreen",
        _I.FAILED: "crimson",
        _I.LOST: "firebrick",
        _I.RESCHEDULED: "mediumpurple",
        _I.REVOKED: "indianred",
        _I.UNLOADED: "gainsboro",
    }
)


# Which instance states may coexist with a lease state. Instances of the current run are created (REQUESTED)
# no earlier than PREPARING or READY, and they run only while the lease is ACTIVE or SUSPENDING. Records of an
# earlier run (a lease requeued from ACTIVE keeps its stopped generation, Q8) or instances still winding down
# after a cancel may sit beside any state but NEW. A lease that is QUEUED while one of its instances is
# RUNNING is exactly the Q8 failure (the requeued lease's VM was never stopped), and this rule is what lets a
# sweep see it.
_PRE_RUN = frozenset({_I.REQUESTED, _I.PLACED, _I.FETCHING, _I.VERIFIED, _I.LOADED})
_RUN = frozenset({_I.RUNNING, _I.UNHEALTHY, _I.RESTARTING})
_AFTERMATH = frozenset(InstanceState) - _PRE_RUN - _RUN
_INSTANCES_ALLOWED: Mapping[LeaseState, frozenset[InstanceState]] = MappingProxyType(
    {
        _L.NEW: frozenset(),
        _L.PREPARING: _AFTERMATH | _PRE_RUN,
        _L.READY: _AFTERMATH | _PRE_RUN,
        _L.MIGRATING: _AFTERMATH | _PRE_RUN,
        _L.RESUMING: _AFTERMATH | _PRE_RUN,
        _L.RESUMED_READY: _AFTERMATH | _PRE_RUN,
        _L.ACTIVE: frozenset(InstanceState),
        _L.SUSPENDING: _AFTERMATH | _RUN,
    }
)


def lease_states_allow_instances(lease_state: LeaseState | str) -> frozenset[InstanceState]:
    """The instance states that are consistent with a lease in `lease_state`."""
    return _INSTANCES_ALLOWED.get(LeaseState(lease_state), _AFTERMATH)


def inconsistent_instances(
    lease_state: LeaseState | str, instances: Mapping[str, InstanceState | str], *, ident: str = ""
) -> list[str]:
    """One sentence per instance whose state contradicts its lease's state, in instance-id order."""
    state = LeaseState(lease_state)
    allowed = lease_states_allow_instances(state)
    subject = f"lease {ident}" if ident else "its lease"
    return [
        f"instance {iid} is {InstanceState(istate)} while {subject} is {state}"
        for iid, istate in sorted(instances.items())
        if InstanceState(istate) not in allowed
    ]


def instance_id(lease_id: int | str, vnode: int, generation: int) -> str:
    """The id of one vnode's instance in one generation: "<lease>-<vnode>-<generation>", e.g. "7-1-0"."""
    lease = str(lease_id)
    if not lease or "-" in lease:
        raise ValueError(f"a lease id must be non-empty and contain no '-', got {lease!r}")
    if vnode < 0 or generation < 0:
        raise ValueError(f"vnode and generation must be 0 or more, got {vnode} and {generation}")
    return f"{lease}-{vnode}-{generation}"


def parse_instance_id(text: str) -> tuple[str, int, int]:
    """The (lease, vnode, generation) of an id made by instance_id; ValueError for anything else."""
    parts = text.split("-")
    if len(parts) != 3 or not parts[0] or not (parts[1].isdigit() and parts[2].isdigit()):
        raise ValueError(f"not an instance id (<lease>-<vnode>-<generation>): {text!r}")
    return parts[0], int(parts[1]), int(parts[2])
