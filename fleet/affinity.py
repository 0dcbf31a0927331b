"""Group rules: affinity and anti-affinity, hard and soft, over plain values. PURE: no Django, no clock.

One implementation for every place that asks: a lease's submission (which nodes its hard groups forbid), an
approval or a proposal (the placer check and the soft rules' penalties), a group's creation or change (do its
members already break it), and the agent's late check before it starts an instance. They used to be written
three times on the server, already worded differently; a rule that drifts between submission and approval
lets one path place what the other refuses.

It lives beside the placer (capacity.py owns the affinity reason codes) so the agent, which imports nothing of
the lease app, checks with the same code as the server.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from fleet.capacity import ReasonCode, Unfit

AFFINITY = "affinity"
ANTI_AFFINITY = "anti_affinity"


@dataclass(frozen=True)
class GroupRule:
    name: str
    policy: str  # "affinity" | "anti_affinity"
    hard: bool = True
    max_per_node: int = 1


@dataclass(frozen=True)
class GroupMembers:
    """A rule and where its live members run: node id -> member instance ids."""

    rule: GroupRule
    members: Mapping[int, Sequence[str]]


def crowded(rule: GroupRule, members_here: int, adding: int = 1) -> bool:
    """Whether `adding` more members on a node already holding `members_here` break an anti-affinity limit."""
    return rule.policy == ANTI_AFFINITY and members_here + adding > rule.max_per_node


def unfit(
    group: GroupMembers, node_id: int, *, adding: int = 1, names: Mapping[int, str] | None = None
) -> Unfit | None:
    """Why the group's hard rule forbids `adding` more members on the node, or None when it allows them."""
    rule = group.rule
    if not rule.hard:
        return None
    here = list(group.members.get(node_id, ()))
    if crowded(rule, len(here), adding):
        who = ", ".join(here[:3]) or "a member placed in this request"
        return Unfit(
            ReasonCode.ANTI_AFFINITY,
            f"group {rule.name} already has instance {who} here (at most {rule.max_per_node} per node)",
            {"group": rule.name, "members_here": len(here), "max_per_node": rule.max_per_node},
        )
    if rule.policy == AFFINITY and group.members and node_id not in group.members:
        where = ", ".join(sorted((names or {}).get(n, str(n)) for n in group.members))
        return Unfit(
            ReasonCode.AFFINITY,
            f"group {rule.name} runs on {where}; affinity keeps its members together",
            {"group": rule.name},
        )
    return None


def penalties(groups: Sequence[GroupMembers], names: Mapping[int, str]) -> dict[str, int]:
    """The soft rules: node name -> how many soft rules placing one more member there would break."""
    out: dict[str, int] = {}
    for group in groups:
        rule = group.rule
        if rule.hard:
            continue
        for node_id, name in names.items():
            if _soft_broken(group, node_id):
                out[name] = out.get(name, 0) + 1
    return out


def violation(rule: GroupRule, members: Mapping[int, Collection[str]], names: Mapping[int, str]) -> str:
    """Why members already placed break the rule, or "" when they do not (a group created or changed over
    leases that already run)."""
    if rule.policy == ANTI_AFFINITY:
        over = {n: iids for n, iids in members.items() if crowded(rule, len(iids), adding=0)}
        if over:
            node_id, iids = sorted(over.items())[0]
            return f"{names[node_id]} runs {', '.join(sorted(iids))} (at most {rule.max_per_node} per node)"
    if rule.policy == AFFINITY and len(members) > 1:
        return f"members run on {', '.join(sorted(names[n] for n in members))}, not on one node"
    return ""


@dataclass(frozen=True)
class Spread:
    """The group rules of one lease as its placement takes them: at most `limit` of its VMs on a node, less
    `taken[node]` (so that its VMs and the group's members already there together stay within every rule); and
    `avoid`, the nodes a soft rule would rather not use. `limit` None: no anti-affinity rule applies."""

    limit: int | None = None
    taken: tuple[tuple[int, int], ...] = ()
    avoid: frozenset[int] = frozenset()


def spread(groups: Sequence[GroupMembers], node_ids: Collection[int]) -> Spread:
    """Hard anti-affinity and max_per_node hold among a lease's own VMs and against the group's other members;
    soft rules become nodes to try last. Hard affinity is left to `unfit` (the nodes where the group is not)."""
    hard = [g for g in groups if g.rule.hard and g.rule.policy == ANTI_AFFINITY]
    avoid = frozenset(n for n in node_ids if any(_soft_broken(g, n) for g in groups if not g.rule.hard))
    if not hard:
        return Spread(avoid=avoid)
    limit = min(g.rule.max_per_node for g in hard)
    taken = []
    for node in sorted({n for g in hard for n in g.members}):
        room = min(g.rule.max_per_node - len(g.members.get(node, ())) for g in hard)
        if room < limit:
            taken.append((node, limit - max(room, 0)))
    return Spread(limit, tuple(taken), avoid)


def _soft_broken(group: GroupMembers, node_id: int) -> bool:
    here = len(group.members.get(node_id, ()))
    return crowded(group.rule, here) or (
        group.rule.policy == AFFINITY and bool(group.members) and node_id not in group.members
    )
