"""The instances package's own rules, PURE (no Django, no clock): when an unhealthy instance may be restarted
(bounded restarts with doubling backoff, seed 003) and what happens to an instance whose node died (hold, fail,
or propose a reschedule). Times are epoch seconds (float), so the live service, replay and the tests share them.

The group rules the package applies (affinity, anti-affinity) live beside the placer in fleet/affinity.py, so
the node agent checks with the same code; the state machines stay in leases/lifecycle.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RestartPolicy:
    """Bounded restarts (seed 003): at most `max_restarts` in a sliding window, with doubling backoff."""

    max_restarts: int = 3
    window_s: float = 600.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be 0 or more, got {self.max_restarts}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s must be a positive number of seconds, got {self.window_s}")
        if not (0 <= self.backoff_initial_s <= self.backoff_max_s < math.inf):
            got = f"{self.backoff_initial_s} and {self.backoff_max_s}"
            raise ValueError(f"need 0 <= backoff_initial_s <= backoff_max_s, got {got}")


@dataclass(frozen=True)
class RestartDecision:
    action: Literal["restart", "wait", "exhausted"]
    attempt: int
    not_before: float | None
    reason: str


# 2**64 already dwarfs any sane cap; bounding the exponent stops a policy allowing thousands of restarts from
# overflowing the float multiplication.
_MAX_DOUBLINGS = 64


def backoff_delay(policy: RestartPolicy, attempt: int) -> float:
    """Seconds that restart `attempt` (1-based) waits after the previous restart in the window.

    The first restart goes at once; the second waits the initial backoff, each later one twice the one before,
    never more than the cap (seed 003: 1 s, 2 s, 4 s ... up to 30 s).
    """
    if attempt <= 1:
        return 0.0
    doublings = min(attempt - 2, _MAX_DOUBLINGS)
    return min(policy.backoff_initial_s * 2**doublings, policy.backoff_max_s)


def decide_restart(policy: RestartPolicy, previous_restarts: Sequence[float], now: float) -> RestartDecision:
    """Whether an unhealthy instance may restart at `now`, given every earlier restart of it (epoch seconds).

    Restarts at least `window_s` old no longer count. Records nothing: the caller stores the restart it
    performs.
    """
    recent = sorted(t for t in previous_restarts if now - t < policy.window_s)
    attempt = len(recent) + 1
    if len(recent) >= policy.max_restarts:
        return RestartDecision("exhausted", attempt, None, _exhausted_reason(policy, len(recent)))
    if not recent:
        reason = f"No restart in the last {policy.window_s:g} s, so attempt 1 may go now."
        return RestartDecision("restart", attempt, float(now), reason)
    delay = backoff_delay(policy, attempt)
    eligible = recent[-1] + delay
    if now < eligible:
        reason = f"Attempt {attempt} waits {delay:g} s after the previous restart, {eligible - now:g} s more."
        return RestartDecision("wait", attempt, eligible, reason)
    reason = f"Attempt {attempt} of {policy.max_restarts}: its {delay:g} s backoff has passed."
    return RestartDecision("restart", attempt, float(now), reason)


def _exhausted_reason(policy: RestartPolicy, count: int) -> str:
    if policy.max_restarts == 0:
        return "Restarting is disabled by the policy; the instance is held as failed for the operator."
    return (
        f"{count} restarts in the last {policy.window_s:g} s reach the limit of {policy.max_restarts}; "
        "the instance is held as failed for the operator."
    )


DEFAULT_HARDWARE_NAMESPACES: frozenset[str] = frozenset({"sensor", "device", "feed"})

# Seed 003 writes capabilities as "sensor.camera0"; our placer's capabilities read "backend:claude". Both
# separators mark the namespace, so "device:gpu0" cannot escape the hardware check by spelling alone.
_NAMESPACE_SEPARATOR = re.compile(r"[.:]")


@dataclass(frozen=True)
class ReschedulePolicy:
    """What happens to a lost instance: a bound on moves, the node-hardware allow-list, and auto-approval."""

    max_reschedules: int = 5
    hardware_namespaces: frozenset[str] = DEFAULT_HARDWARE_NAMESPACES
    auto_approve: bool = False

    def __post_init__(self) -> None:
        if self.max_reschedules < 0:
            raise ValueError(f"max_reschedules must be 0 or more, got {self.max_reschedules}")
        odd = sorted(ns for ns in self.hardware_namespaces if capability_namespace(ns) != ns or not ns)
        if odd:
            raise ValueError(f"hardware namespaces must be lower-case names without '.' or ':', got {odd}")


@dataclass(frozen=True)
class LossDecision:
    action: Literal["propose", "hold", "fail"]
    reason: str
    auto_approved: bool = False


def capability_namespace(capability: str) -> str:
    """The namespace of "sensor.camera0" or "device:gpu0" (lower-cased); a bare name is its own namespace."""
    return _NAMESPACE_SEPARATOR.split(capability.strip(), maxsplit=1)[0].lower()


def needs_node_hardware(
    capabilities: Iterable[str], namespaces: frozenset[str] = DEFAULT_HARDWARE_NAMESPACES
) -> bool:
    """Whether any capability names something attached to one particular node.

    An allow-list: a capability in a namespace nobody listed (accel.gpu, backend:claude) never pins a workload
    by accident, since any node with the same accelerator or backend is as good a home.
    """
    return any(capability_namespace(cap) in namespaces for cap in capabilities)


def decide_on_loss(
    policy: ReschedulePolicy, *, migratable: bool, capabilities: Iterable[str], reschedules_so_far: int
) -> LossDecision:
    """What to do with an instance whose node is dead: propose a move, hold it in place, or fail it."""
    if reschedules_so_far < 0:
        raise ValueError(f"reschedules_so_far must be 0 or more, got {reschedules_so_far}")
    caps = sorted(capabilities)
    attached = [cap for cap in caps if capability_namespace(cap) in policy.hardware_namespaces]
    # Holding comes before the bound: a held instance is not moved, so it spends no reschedule, and failing it
    # would throw away the one home (its node, when it returns) where it can work.
    if attached:
        named = ", ".join(attached)
        return LossDecision("hold", f"It needs hardware on its node ({named}); held until the node returns.")
    if not migratable:
        return LossDecision("hold", "It is not migratable; held until its node returns or an operator acts.")
    if reschedules_so_far >= policy.max_reschedules:
        return LossDecision(
            "fail",
            f"It has been rescheduled {reschedules_so_far} times, the limit is {policy.max_reschedules}; "
            "a flapping fleet must not move it forever.",
        )
    # "1 of 5" said what it counts: this instance's moves against its lease's limit (max_reschedules).
    move = f"This instance's move {reschedules_so_far + 1} of the {policy.max_reschedules} its lease allows"
    if policy.auto_approve:
        return LossDecision("propose", f"{move}, approved by policy.", auto_approved=True)
    return LossDecision("propose", f"{move}, waiting for an operator's approval.")
