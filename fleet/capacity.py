"""The placer's arithmetic: how many more instances of a request each node can take, why every other node
cannot, and which node gets the work.

This module owns the capacity rules (effective memory, host baseline, host and disk reserves), fail-closed
eligibility, the unfit reason codes, ranking, and the three no-placement outcomes. It is pure: `NodeState`
snapshots in, a `Placement` out, no Django and no clock (health ages arrive already computed), so every rule
is table-tested against measured machines and the same code runs in the service, in replay and in benchmarks.
fleet/placement.py reads the fleet into snapshots and records the verdicts; docs/placer.md has the design.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

# A node and its memory arithmetic live in fleet/nodestate.py; re-exported, as the placer's vocabulary.
from fleet.nodestate import (
    BASELINE_FLOOR_MIB as BASELINE_FLOOR_MIB,
)
from fleet.nodestate import (
    DISK_RESERVE_GIB as DISK_RESERVE_GIB,
)
from fleet.nodestate import (
    HOST_RESERVE_MIB as HOST_RESERVE_MIB,
)
from fleet.nodestate import (
    METRICS_MAX_AGE_S as METRICS_MAX_AGE_S,
)
from fleet.nodestate import (
    Claim as Claim,
)
from fleet.nodestate import (
    Limits as Limits,
)
from fleet.nodestate import (
    MemoryUse as MemoryUse,
)
from fleet.nodestate import (
    NodeState as NodeState,
)
from fleet.nodestate import (
    committed_claims as committed_claims,
)
from fleet.nodestate import (
    committed_mib,
    mem_limit,
)
from fleet.nodestate import (
    effective_use as effective_use,
)
from fleet.nodestate import (
    headroom_of as headroom_of,
)
from fleet.nodestate import (
    host_baseline_mib as host_baseline_mib,
)
from fleet.nodestate import (
    node_limits as node_limits,
)
from fleet.nodestate import (
    split_claims as split_claims,
)

# Health older than this and the node's memory is a guess, so it is ineligible. Close to the sweep that marks
# a node offline, so the window in which a node is "online with unreadable memory" stays narrow.
HEALTH_MAX_AGE_S = 30.0

# A failure message lists this many nodes; the verdicts carry the rest. A 1,000-node report nobody can read.
REPORT_LINES = 10

# Cores are fractional (0.5 of a core); without a tolerance 0.1 + 0.2 cores would not fit in 0.3.
_CORE_EPSILON = 1e-9


class ReasonCode(StrEnum):
    """Why one node cannot take one request now. The values are the API's `reason_code` strings."""

    DRAINING = "draining"
    OFFLINE = "offline"
    DEAD = "dead"
    NO_RECENT_HEALTH = "no_recent_health"
    CAPACITY_UNKNOWN = "capacity_unknown"
    AT_CAPACITY = "at_capacity"
    NO_DISK = "no_disk"
    MISSING_CAPABILITY = "missing_capability"
    # Produced by callers' extra checks (slot table, groups), and TOO_SMALL also here; listed in one place so
    # the API, the console badges and the outcome rules below agree on every code.
    RESERVED = "reserved"
    ANTI_AFFINITY = "anti_affinity"
    AFFINITY = "affinity"
    TOO_SMALL = "too_small"


# Codes that waiting will not fix: the request can never run on such a node as the fleet is built.
PERMANENT = frozenset({ReasonCode.MISSING_CAPABILITY, ReasonCode.TOO_SMALL})
# Codes that mean "we cannot see this node". A fleet made only of these is unreadable, never "full": an
# operator sent to hunt a load problem that is really a dead agent wastes the outage.
BLIND = frozenset(
    {ReasonCode.OFFLINE, ReasonCode.DEAD, ReasonCode.NO_RECENT_HEALTH, ReasonCode.CAPACITY_UNKNOWN}
)


class Outcome(StrEnum):
    """What `place` concluded. Callers act differently on each, so they must never be confused."""

    PLACED = "placed"
    NO_CAPABLE_NODE = "no_capable_node"
    FLEET_AT_CAPACITY = "fleet_at_capacity"
    FLEET_UNREADABLE = "fleet_unreadable"

    @property
    def transient(self) -> bool:
        """True when the caller should queue and retry; a missing capability will not appear by waiting."""
        return self in (Outcome.FLEET_AT_CAPACITY, Outcome.FLEET_UNREADABLE)


@dataclass(frozen=True)
class Need:
    """One instance's size, and how many instances are wanted."""

    mem_mib: int
    disk_gib: int = 0
    cpu_cores: float = 0.0
    capabilities: frozenset[str] = frozenset()
    count: int = 1
    preferred_node: str | None = None

    def __post_init__(self) -> None:
        # A zero-memory instance would give every node unlimited slots and divide by zero in the slot count.
        if self.mem_mib <= 0:
            raise ValueError(f"an instance must claim memory, got mem_mib={self.mem_mib}")
        if self.count < 1:
            raise ValueError(f"at least one instance must be wanted, got count={self.count}")
        if self.disk_gib < 0 or self.cpu_cores < 0:
            raise ValueError(f"disk and cores cannot be negative, got {self.disk_gib} GiB, {self.cpu_cores}")


@dataclass(frozen=True)
class Unfit:
    """What a check returns to exclude a node."""

    code: ReasonCode
    reason: str  # a sentence an operator can act on
    numbers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """One node's answer to one request, fit or not, with the numbers behind it."""

    node: str
    fit: bool
    reason_code: str | None
    reason: str | None
    slots: int | None
    headroom: float | None
    numbers: Mapping[str, Any]


@dataclass(frozen=True)
class Placement:
    """The chosen nodes (one per instance) or why there are none, and every node's verdict."""

    outcome: Outcome
    nodes: tuple[str, ...]
    message: str
    verdicts: tuple[Verdict, ...]  # in rank order, fit first
    preferred_note: str | None = None


def _verdict(
    node: str,
    fit: bool,
    reason_code: str | None,
    reason: str | None,
    slots: int | None,
    headroom: float | None,
    numbers: Mapping[str, Any],
) -> Verdict:
    """Build a Verdict without the frozen dataclass __init__.

    A frozen __init__ sets each field through object.__setattr__: about 2 us per Verdict on the 2-core
    benchmark machine, so 2 ms of the 20 ms p99 budget at 1,000 nodes spent on bookkeeping. Filling __dict__ directly is what
    copy.copy does; the instance is as frozen as any other, since __setattr__ still refuses writes.
    """
    verdict = object.__new__(Verdict)
    verdict.__dict__.update(
        node=node,
        fit=fit,
        reason_code=reason_code,
        reason=reason,
        slots=slots,
        headroom=headroom,
        numbers=numbers,
    )
    return verdict


# An extra check (slot-table conflicts, affinity groups): the node, the need, and the node names already
# chosen for earlier instances of this same placement; returns Unfit to exclude the node, or None.
Check = Callable[[NodeState, Need, Sequence[str]], Unfit | None]


# ------------------------------------------------------------------------------------------------------------
# One node


def assess(
    node: NodeState,
    need: Need,
    *,
    health_max_age_s: float = HEALTH_MAX_AGE_S,
    checks: Sequence[Check] = (),
    chosen: Sequence[str] = (),
) -> Verdict:
    """Can this node take one more instance of `need`, and if not, why not."""
    verdict = _assess_builtin(node, need, health_max_age_s)
    if verdict.fit and checks:
        return _apply_checks(node, need, verdict, checks, chosen)
    return verdict


def _assess_builtin(node: NodeState, need: Need, health_max_age_s: float) -> Verdict:
    # Liveness before size: leases/store.py probes every node with a 1 MiB need to learn which are dead or
    # draining, and a small dead node answering "too small" would stay in the slot table's candidates. Whether
    # waiting can help is decided from the node's facts (`_hopeless`), not from which reason came first.
    unfit = _missing(node, need) or _liveness(node, health_max_age_s) or _too_small(node, need)
    if unfit is not None:
        return _verdict(node.name, False, unfit.code, unfit.reason, None, None, unfit.numbers)
    return _capacity(node, need)


def _exceeds(node: NodeState, need: Need) -> bool:
    """True when one instance is larger than this node could hold with nothing else on it."""
    return (
        need.mem_mib > mem_limit(node)
        or (need.disk_gib > 0 and need.disk_gib > node.disk_total_gib - DISK_RESERVE_GIB)
        or (need.cpu_cores > 0 and need.cpu_cores > node.cpu_cores + _CORE_EPSILON)
    )


def _hopeless(node: NodeState, verdict: Verdict, need: Need) -> bool:
    """True when waiting cannot help: a capability is missing or the node is too small, whatever its state."""
    return (
        verdict.reason_code in PERMANENT or not need.capabilities <= node.capabilities or _exceeds(node, need)
    )


def _missing(node: NodeState, need: Need) -> Unfit | None:
    if need.capabilities <= node.capabilities:
        return None
    missing = sorted(need.capabilities - node.capabilities)
    return Unfit(
        ReasonCode.MISSING_CAPABILITY,
        f"missing {', '.join(missing)}; an instance runs on one node, which needs them all "
        f"(has: {', '.join(sorted(node.capabilities)) or 'none'})",
        {"missing": missing},
    )


def _too_small(node: NodeState, need: Need) -> Unfit | None:
    if not _exceeds(node, need):
        return None
    limits = node_limits(node)
    return Unfit(
        ReasonCode.TOO_SMALL,
        f"too small even when empty: an instance needs {_describe(need)}; this node offers at most "
        f"{_describe_limits(limits)} ({node.mem_total_mib} MiB total less the {HOST_RESERVE_MIB} MiB "
        f"host reserve and a {node.mem_total_mib - HOST_RESERVE_MIB - limits.mem_mib} MiB host baseline)",
        {"limit_mem_mib": limits.mem_mib, "limit_disk_gib": limits.disk_gib, "limit_cores": limits.cpu_cores},
    )


def liveness(node: NodeState, health_max_age_s: float = HEALTH_MAX_AGE_S) -> Unfit | None:
    """Why the node cannot take any work right now whatever its size (status, stale or unreadable health), or None.
    The slot table asks only this: capacity over time is its own job."""
    return _liveness(node, health_max_age_s)


def _liveness(node: NodeState, health_max_age_s: float) -> Unfit | None:
    held = status_unfit(node)
    if held is not None:
        return held
    stale = health_unfit(node, health_max_age_s)
    return stale if stale is not None else readability_unfit(node)


# liveness() in its three steps, asked in this order; a fleet read that remembers a node's row works out the first
# and the last once per row (fleet/placement.py FleetRead), since only the age moves with the clock.


def status_unfit(node: NodeState) -> Unfit | None:
    """Why the node's status rules it out (draining, dead, offline), or None when it is online."""
    if node.status == "draining":
        return Unfit(ReasonCode.DRAINING, "an operator cordoned this node; undrain it to place work here")
    if node.status == "dead":
        return Unfit(ReasonCode.DEAD, "the node stopped reporting and was declared dead")
    if node.status != "online":
        return Unfit(ReasonCode.OFFLINE, f"status is {node.status}: the agent is not connected; check it")
    return None


def health_unfit(node: NodeState, health_max_age_s: float) -> Unfit | None:
    """Why the node's last health report is too old to place on (never sent, or older than the limit), or None."""
    age = node.health_age_s
    if age is None:
        return Unfit(ReasonCode.NO_RECENT_HEALTH, "never reported health, so its memory use is unknown")
    if age > health_max_age_s:
        return Unfit(
            ReasonCode.NO_RECENT_HEALTH,
            f"last health report {age:.0f} s ago (max {health_max_age_s:.0f} s); its memory use is a guess",
            {"health_age_s": age, "health_max_age_s": health_max_age_s},
        )
    return None


def readability_unfit(node: NodeState) -> Unfit | None:
    """Why the node's fresh health still cannot be read as capacity (memory or disk unreadable), or None."""
    total, used, disk = node.observed_mem_total_mib, node.observed_mem_used_mib, node.disk_free_gib
    if total is None or used is None or total <= 0 or disk is None:
        return Unfit(
            ReasonCode.CAPACITY_UNKNOWN,
            f"health is fresh but capacity is unreadable (memory total {total}, used {used} MiB; "
            f"disk free {disk} GiB); check the agent's probes",
        )
    return None


def _capacity(node: NodeState, need: Need) -> Verdict:
    # readability_unfit has excluded every None below; the asserts tell mypy, and cost nothing measurable.
    assert node.observed_mem_total_mib is not None and node.observed_mem_used_mib is not None
    assert node.disk_free_gib is not None
    running, pending = split_claims(node)
    # One pass over the claims instead of a sum() per figure: this runs for every node on every placement.
    running_mib = pending_mib = disk_pending = 0
    cores_used = 0.0
    for c in running:
        running_mib += c.mem_mib
        cores_used += c.cpu_cores
    for c in pending:
        pending_mib += c.mem_mib
        cores_used += c.cpu_cores
        # Running instances' disk is already out of disk_free; pending ones have not written theirs yet.
        disk_pending += c.disk_gib
    observed = node.observed_mem_used_mib
    committed = committed_mib(observed, running_mib, pending_mib, node.idle_baseline_mib)
    effective = max(observed, committed)
    # The smaller of declared and observed: an operator may cap what Slotkeeper uses, and a machine that lost
    # a DIMM reports less than it was declared with. Either way the smaller number is the one that holds.
    total = min(node.mem_total_mib, node.observed_mem_total_mib)
    free_mib = total - effective - HOST_RESERVE_MIB
    disk_left = node.disk_free_gib - disk_pending - DISK_RESERVE_GIB
    cores_free = node.cpu_cores - cores_used
    numbers: dict[str, Any] = {
        "mem_total_mib": total,
        "observed_mib": observed,
        "committed_mib": committed,
        "effective_mib": effective,
        "reserve_mib": HOST_RESERVE_MIB,
        "free_mib": free_mib,
        "claims": len(running) + len(pending),
        "disk_free_gib": node.disk_free_gib,
        "disk_pending_gib": disk_pending,
        "disk_reserve_gib": DISK_RESERVE_GIB,
        "cores_free": cores_free,
    }
    headroom = headroom_of(node)
    unfit = _capacity_unfit(need, numbers, disk_left, cores_free, node.cpu_cores)
    if unfit is not None:
        return _verdict(node.name, False, unfit.code, unfit.reason, 0, headroom, numbers)
    return _verdict(
        node.name, True, None, None, _slots(need, free_mib, disk_left, cores_free), headroom, numbers
    )


def _slots(need: Need, free_mib: int, disk_left: float, cores_free: float) -> int:
    """How many more of THIS request fit, limited by whichever of memory, disk and cores runs out first."""
    slots = free_mib // need.mem_mib
    if need.disk_gib > 0:
        slots = min(slots, int(disk_left // need.disk_gib))
    if need.cpu_cores > 0:
        slots = min(slots, int(cores_free / need.cpu_cores + _CORE_EPSILON))
    return max(slots, 0)


def _capacity_unfit(
    need: Need, numbers: Mapping[str, Any], disk_left: float, cores_free: float, cores: int
) -> Unfit | None:
    # Disk before memory so the message names the real problem: a node out of disk with memory to spare must
    # not send an operator to look at memory.
    if disk_left < need.disk_gib:
        return Unfit(
            ReasonCode.NO_DISK,
            f"needs {need.disk_gib} GiB disk; only {numbers['disk_free_gib']:.0f} GiB free "
            f"({numbers['disk_pending_gib']} GiB promised to pending instances), and the last "
            f"{DISK_RESERVE_GIB} GiB are reserved",
        )
    if numbers["free_mib"] < need.mem_mib:
        return Unfit(
            ReasonCode.AT_CAPACITY,
            f"needs {need.mem_mib} MiB; {max(numbers['free_mib'], 0)} MiB free after the "
            f"{HOST_RESERVE_MIB} MiB host reserve (effective use {numbers['effective_mib']} of "
            f"{numbers['mem_total_mib']} MiB: "
            f"committed {numbers['committed_mib']}, observed {numbers['observed_mib']}; "
            f"{numbers['claims']} instance(s) committed)",
        )
    if need.cpu_cores > 0 and cores_free + _CORE_EPSILON < need.cpu_cores:
        return Unfit(
            ReasonCode.AT_CAPACITY,
            f"needs {need.cpu_cores:g} cores; {max(cores_free, 0):g} of {cores} uncommitted "
            f"({numbers['claims']} instance(s) committed)",
        )
    return None


def _apply_checks(
    node: NodeState, need: Need, verdict: Verdict, checks: Sequence[Check], chosen: Sequence[str]
) -> Verdict:
    for check in checks:
        unfit = check(node, need, chosen)
        if unfit is not None:
            numbers = {**verdict.numbers, **unfit.numbers}
            return Verdict(
                node.name, False, unfit.code, unfit.reason, verdict.slots, verdict.headroom, numbers
            )
    return verdict


# ------------------------------------------------------------------------------------------------------------
# The fleet


def place(
    nodes: Sequence[NodeState],
    need: Need,
    *,
    health_max_age_s: float = HEALTH_MAX_AGE_S,
    checks: Sequence[Check] = (),
    penalties: Mapping[str, int] | None = None,
) -> Placement:
    """Choose a node for each of `need.count` instances, or say which of the three reasons stops it.

    Greedy, one instance at a time: each choice becomes a pending claim on its node before the next, so a
    burst cannot book one node's last slot twice. All or nothing: a lease whose vnodes must start together is
    no use half-placed, so if any instance finds no node, nothing is placed.
    """
    states = list(nodes)
    base = [_assess_builtin(n, need, health_max_age_s) for n in states]
    index = {n.name: i for i, n in enumerate(states)}
    penalty = penalties or {}
    chosen: list[str] = []
    first: tuple[Verdict, ...] | None = None
    prefer = _Preference(need.preferred_node, index.get(need.preferred_node or ""))
    for k in range(need.count):
        verdicts = _checked(states, base, need, checks, chosen) if checks else base
        order = _rank(states, verdicts, need, penalty)
        ranked = (
            tuple(_with_penalty(verdicts[i], penalty) for i in order) if penalty else _pick(verdicts, order)
        )
        first = first or ranked
        pick = prefer.choose(order, verdicts, states, penalty, placed=k)
        if pick is None:
            hopeless = [_hopeless(states[i], verdicts[i], need) for i in order]
            return _no_placement(need, states, ranked, hopeless, placed=k)
        chosen.append(states[pick].name)
        states[pick] = _with_pending(states[pick], need, k)
        base[pick] = _assess_builtin(states[pick], need, health_max_age_s)
    assert first is not None  # need.count >= 1, so the loop ran
    return Placement(Outcome.PLACED, tuple(chosen), _placed_message(need, chosen), first, prefer.note(chosen))


def _checked(
    states: Sequence[NodeState],
    base: Sequence[Verdict],
    need: Need,
    checks: Sequence[Check],
    chosen: Sequence[str],
) -> list[Verdict]:
    return [
        _apply_checks(n, need, v, checks, chosen) if v.fit else v for n, v in zip(states, base, strict=True)
    ]


def _pick(verdicts: Sequence[Verdict], order: Sequence[int]) -> tuple[Verdict, ...]:
    return tuple(verdicts[i] for i in order)


def _rank(
    states: Sequence[NodeState], verdicts: Sequence[Verdict], need: Need, penalty: Mapping[str, int]
) -> list[int]:
    """Fit first: fewest soft-rule violations, most free slots, most headroom, lowest node id. Then unfit.

    Slots before headroom spreads load instead of stacking it; headroom lets an idle node beat one mid-build;
    node id last so the same fleet state always gives the same answer, whatever order the rows arrived in.
    """
    fit = [i for i, v in enumerate(verdicts) if v.fit]
    unfit = [i for i, v in enumerate(verdicts) if not v.fit]
    fit.sort(
        key=lambda i: (
            penalty.get(states[i].name, 0),
            -(verdicts[i].slots or 0),
            -(verdicts[i].headroom or 0.0),
            states[i].id,
        )
    )
    # Capable nodes before incapable ones, so the ten lines a failure message shows are the ones worth acting
    # on, not a screenful of nodes that lack the capability anyway.
    unfit.sort(key=lambda i: (_hopeless(states[i], verdicts[i], need), states[i].id))
    return fit + unfit


def _with_penalty(verdict: Verdict, penalty: Mapping[str, int]) -> Verdict:
    # Show the operator why a node with more slots lost: it broke a soft rule.
    p = penalty.get(verdict.node, 0)
    return replace(verdict, numbers={**verdict.numbers, "penalty": p}) if p and verdict.fit else verdict


def _with_pending(node: NodeState, need: Need, k: int) -> NodeState:
    # An id no real claim carries, so the union by id can never merge it with one and under-count the node.
    claim = Claim(
        f"<instance {k + 1} of {need.count} being placed>", need.mem_mib, need.disk_gib, need.cpu_cores
    )
    return replace(node, pending=(*node.pending, claim))


@dataclass
class _Preference:
    """The preferred node is a request, not a requirement: used while it fits, otherwise placed by rank.

    Treating "where the previous phase ran" as a requirement failed phases outright when that node filled
    up (a non-transient error that never reached the queue), and silently tied every later phase to the first
    node.
    """

    name: str | None
    position: int | None  # index in the fleet; None when the node is not in it
    why_not: str | None = None

    def choose(
        self,
        order: Sequence[int],
        verdicts: Sequence[Verdict],
        states: Sequence[NodeState],
        penalty: Mapping[str, int],
        placed: int,
    ) -> int | None:
        top = order[0] if order and verdicts[order[0]].fit else None
        if self.name is None or self.position is None:
            return top
        v = verdicts[self.position]
        if v.fit and top is not None and penalty.get(self.name, 0) <= penalty.get(states[top].name, 0):
            return self.position
        if self.why_not is None and top is not None:
            self.why_not = self._why(v, penalty, placed)
        return top

    def _why(self, v: Verdict, penalty: Mapping[str, int], placed: int) -> str:
        took = f"took {placed} instance(s), then " if placed else ""
        if v.fit:
            return (
                f"preferred node {self.name} {took}breaks more soft rules ({penalty[v.node]}) than the best"
            )
        return f"preferred node {self.name} {took}was not used ({v.reason_code}): {v.reason}"

    def note(self, chosen: Sequence[str]) -> str | None:
        if self.name is None or all(n == self.name for n in chosen):
            return None
        if self.position is None:
            return f"preferred node {self.name} is not in the fleet; placed by rank"
        return self.why_not


# ------------------------------------------------------------------------------------------------------------
# Messages


def _placed_message(need: Need, chosen: Sequence[str]) -> str:
    return f"placed {len(chosen)} instance(s) of {_describe(need)} on {', '.join(chosen)}"


def _no_placement(
    need: Need,
    states: Sequence[NodeState],
    ranked: tuple[Verdict, ...],
    hopeless: Sequence[bool],
    placed: int,
) -> Placement:
    """Which of the three no-placement outcomes, from the nodes that waiting could still help."""
    candidates = [v for v, never in zip(ranked, hopeless, strict=True) if not never]
    outcome = unplaced_outcome(v.reason_code for v in candidates)
    if outcome == Outcome.NO_CAPABLE_NODE:
        return Placement(Outcome.NO_CAPABLE_NODE, (), _no_capable_message(need, states), ranked)
    partial = (
        f" ({placed} of {need.count} fitted before capacity ran out; none were placed)" if placed else ""
    )
    report = _report(ranked)
    if outcome == Outcome.FLEET_UNREADABLE:
        message = (
            f"fleet unreadable: cannot read the capacity of any capable node; this is NOT a full fleet, "
            f"check the node agents{partial}.\n{report}"
        )
        return Placement(Outcome.FLEET_UNREADABLE, (), message, ranked)
    message = (
        f"fleet at capacity: no capable node can take another instance of {_describe(need)} now; "
        f"the request waits for capacity{partial}.\n{report}"
    )
    return Placement(Outcome.FLEET_AT_CAPACITY, (), message, ranked)


def unplaced_outcome(capable: Iterable[str | None]) -> Outcome:
    """Which of the three no-placement outcomes, from the reason codes of the CAPABLE nodes alone: those that have
    every capability asked for and could hold one instance when empty (None for a node with no reason, one that
    is readable). Nodes that lack a capability or are too small say nothing about whether the capable ones are
    full or blind, so they are not passed in. No capable node: no_capable_node (permanent, never queued); every
    capable node blind (offline, dead, stale, unreadable): fleet_unreadable, which is NOT a full fleet; anything
    else (full, reserved, draining, a group rule): fleet_at_capacity. The scheduler's decision (leases/scheduler.py
    `Scheduler.decide`) and `place` name their outcomes with this one rule."""
    codes = list(capable)
    if not codes:
        return Outcome.NO_CAPABLE_NODE
    if all(code in BLIND for code in codes):
        return Outcome.FLEET_UNREADABLE
    return Outcome.FLEET_AT_CAPACITY


def _no_capable_message(need: Need, states: Sequence[NodeState]) -> str:
    if not states:
        return "no capable node: the fleet has no nodes; start an agent to register one"
    capable = [n for n in states if need.capabilities <= n.capabilities]
    if capable:
        largest = max(capable, key=lambda n: (node_limits(n).mem_mib, -n.id))
        return (
            f"no capable node: an instance needs {_describe(need)}, more than any capable node can hold; "
            f"the largest, {largest.name}, offers at most {_describe_limits(node_limits(largest))} per "
            f"instance. Shrink the request or add a larger node."
        )
    wanted = ", ".join(sorted(need.capabilities))
    closest = min(states, key=lambda n: (len(need.capabilities - n.capabilities), n.id))
    lacks = ", ".join(sorted(need.capabilities - closest.capabilities))
    return (
        f"no capable node: no node has every capability this request needs ({wanted}). An instance runs "
        f"on ONE node, so one node must hold all of them; the closest, {closest.name}, lacks {lacks}. "
        f"Add the missing capabilities to a node or drop them from the request."
    )


def _report(ranked: Sequence[Verdict]) -> str:
    """A tally of reasons, then a line per node for the first few: enough to act on, short enough to read."""
    tally = Counter(str(v.reason_code) for v in ranked)
    lines = [f"  {len(ranked)} node(s): " + ", ".join(f"{n} {code}" for code, n in tally.most_common())]
    lines += [f"  {v.node}: {v.reason_code}: {v.reason}" for v in ranked[:REPORT_LINES]]
    if len(ranked) > REPORT_LINES:
        lines.append(f"  ... and {len(ranked) - REPORT_LINES} more in the verdicts")
    return "\n".join(lines)


def _describe(need: Need) -> str:
    parts = [f"{need.mem_mib} MiB"]
    if need.disk_gib:
        parts.append(f"{need.disk_gib} GiB disk")
    if need.cpu_cores:
        parts.append(f"{need.cpu_cores:g} cores")
    return ", ".join(parts)


def _describe_limits(limits: Limits) -> str:
    return f"{limits.mem_mib} MiB, {limits.disk_gib} GiB disk, {limits.cpu_cores} cores"
