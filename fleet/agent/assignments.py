"""What the server asks this node to run: parsing assignments into values, and the late group check.

Owns the shape of one assignment as the agent trusts it. Everything the server sends is validated here,
before any driver sees it, so a malformed assignment is refused whole (and reported back) instead of being
half-run: a process started with the right command but the wrong environment is worse than one not started.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet import affinity

DESIRED_STATES = frozenset({"running", "stopped"})
DRIVERS = frozenset({"process", "sim"})
DEFAULT_STOP_GRACE_S = 10.0

# Instance ids name directories and log files in the work dir. Anything beyond this alphabet ("../", "/", NUL)
# would let a bad assignment write outside the work dir.
_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class MalformedAssignment(ValueError):
    """One assignment the agent refuses to run; the message names the field and the problem."""


@dataclass(frozen=True)
class SimSpec:
    """Failure injection for the sim driver (demos of crash-looping instances)."""

    crash_after_s: float | None = None
    exit_code: int = 1


@dataclass(frozen=True)
class Spec:
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    sim: SimSpec = field(default_factory=SimSpec)


@dataclass(frozen=True)
class Group:
    name: str
    policy: str
    hard: bool
    max_per_node: int
    members_here: tuple[str, ...] = ()


@dataclass(frozen=True)
class Assignment:
    id: str
    generation: int
    desired_state: str
    driver: str
    spec: Spec
    lease: int | None = None
    vnode: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    groups: tuple[Group, ...] = ()


@dataclass(frozen=True)
class Rejected:
    """An assignment that failed validation. `instance_id` is None when even the id was unusable."""

    instance_id: str | None
    detail: str


@dataclass(frozen=True)
class AssignmentBatch:
    valid: tuple[Assignment, ...]
    rejected: tuple[Rejected, ...]


def parse_batch(body: Any, default_driver: str) -> AssignmentBatch:
    """Split the server's answer into assignments to act on and ones to report as failed."""
    if not isinstance(body, dict) or not isinstance(body.get("instances"), list):
        raise MalformedAssignment("assignments response has no 'instances' list")
    valid: list[Assignment] = []
    rejected: list[Rejected] = []
    seen: set[str] = set()
    for raw in body["instances"]:
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        instance_id = raw_id if isinstance(raw_id, str) and _ID_PATTERN.match(raw_id) else None
        try:
            assignment = parse_assignment(raw, default_driver)
            if assignment.id in seen:
                raise MalformedAssignment(f"id {assignment.id!r} is listed twice")
        except MalformedAssignment as exc:
            rejected.append(Rejected(instance_id, f"malformed assignment: {exc}"))
            continue
        seen.add(assignment.id)
        valid.append(assignment)
    return AssignmentBatch(tuple(valid), tuple(rejected))


def parse_assignment(raw: Any, default_driver: str) -> Assignment:
    if not isinstance(raw, dict):
        raise MalformedAssignment("an instance entry is not an object")
    instance_id = raw.get("id")
    if not isinstance(instance_id, str) or not _ID_PATTERN.match(instance_id):
        raise MalformedAssignment(f"id {instance_id!r} is not a short [A-Za-z0-9._-] string")
    driver = raw.get("driver") or default_driver
    if driver not in DRIVERS:
        raise MalformedAssignment(f"driver {driver!r} is not one of {sorted(DRIVERS)}")
    desired = raw.get("desired_state")
    if desired not in DESIRED_STATES:
        raise MalformedAssignment(f"desired_state {desired!r} is not one of {sorted(DESIRED_STATES)}")
    spec = _parse_spec(raw.get("spec"), driver)
    return Assignment(
        id=instance_id,
        generation=_int(raw.get("generation"), "generation", minimum=0),
        desired_state=desired,
        driver=driver,
        spec=spec,
        lease=_optional_int(raw.get("lease"), "lease"),
        vnode=_optional_int(raw.get("vnode"), "vnode"),
        resources=_parse_resources(raw.get("resources")),
        groups=tuple(_parse_group(g) for g in _list(raw.get("groups", []), "groups")),
    )


def _parse_spec(raw: Any, driver: str) -> Spec:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise MalformedAssignment("spec is not an object")
    command = raw.get("command", [])
    if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        raise MalformedAssignment("spec.command must be a list of strings")
    if driver == "process" and (not command or not command[0]):
        raise MalformedAssignment("spec.command is empty: the process driver has nothing to run")
    env = raw.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise MalformedAssignment("spec.env must map strings to strings")
    cwd = raw.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise MalformedAssignment("spec.cwd must be a string or null")
    grace = _number(raw.get("stop_grace_s", DEFAULT_STOP_GRACE_S), "spec.stop_grace_s")
    return Spec(tuple(command), dict(env), cwd, grace, _parse_sim(raw.get("sim")))


def _parse_sim(raw: Any) -> SimSpec:
    if raw is None:
        return SimSpec()
    if not isinstance(raw, dict):
        raise MalformedAssignment("spec.sim is not an object")
    crash = raw.get("crash_after_s")
    return SimSpec(
        crash_after_s=None if crash is None else _number(crash, "spec.sim.crash_after_s"),
        exit_code=_int(raw.get("exit_code", 1), "spec.sim.exit_code", minimum=0),
    )


def _parse_resources(raw: Any) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MalformedAssignment("resources is not an object")
    return {str(key): _number(value, f"resources.{key}") for key, value in raw.items()}


def _parse_group(raw: Any) -> Group:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise MalformedAssignment("a group has no name")
    name = raw["name"]
    policy = raw.get("policy")
    if not isinstance(policy, str):
        raise MalformedAssignment(f"group {name!r} has no policy")
    hard = raw.get("hard", False)
    if not isinstance(hard, bool):
        raise MalformedAssignment(f"group {name!r}: hard must be true or false")
    members = _list(raw.get("members_here", []), f"group {name!r} members_here")
    if not all(isinstance(m, str) for m in members):
        raise MalformedAssignment(f"group {name!r}: members_here must be instance ids")
    limit = raw.get("max_per_node")
    max_per_node = 1 if limit is None else _int(limit, f"group {name!r} max_per_node", minimum=1)
    return Group(name, policy, hard, max_per_node, tuple(members))


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedAssignment(f"{what} is not a list")
    return value


def _int(value: Any, what: str, minimum: int) -> int:
    # bool is an int subclass in Python; `true` as a generation is a server bug, not generation 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MalformedAssignment(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _optional_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what, minimum=0)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise MalformedAssignment(f"{what} must be a number >= 0, got {value!r}")
    return float(value)


def anti_affinity_refusal(assignment: Assignment, local_members: Mapping[str, Iterable[str]]) -> str | None:
    """Why starting `assignment` here would break a hard anti-affinity limit, or None when it may start.

    `local_members` maps a group name to the ids of instances this agent runs (or is starting) in that group.
    They are unioned BY ID with the server's `members_here`, never added: an instance the agent runs and the
    server also lists is one member, and counting it twice would refuse a legal start.
    """
    for group in assignment.groups:
        if not group.hard:
            continue
        here = (set(local_members.get(group.name, ())) | set(group.members_here)) - {assignment.id}
        rule = affinity.GroupRule(group.name, group.policy, group.hard, group.max_per_node)
        if affinity.crowded(rule, len(here)):
            return (
                f"anti_affinity: group {group.name!r} allows {group.max_per_node} per node and "
                f"{', '.join(sorted(here))} already here"
            )
    return None
