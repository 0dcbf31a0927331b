"""Planning a move (a reschedule): the fleet as a burst of approvals sees it, the lease's group rules and the slot
table as placer checks, and the placer's answer. Reads only: the actions that store the answer are in
leases/instances/actions/reschedules.py.

Placement of a move is decided by the placer (fleet/capacity.py) with two extra checks: the slot table must hold
the vnode for the rest of its reservations on the target, and the lease's groups must allow it (fleet/affinity.py,
the same rules a submission and the agent apply).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from fleet import affinity, capacity, placement
from leases import reads, vnodes
from leases.instance_rows import LIVE
from leases.instances.models import Reschedule, RescheduleStatus
from leases.instances.reads import claims
from leases.lifecycle import InstanceState, LeaseState
from leases.models import Allocation, Group, Instance


@dataclass
class FleetView:
    """The fleet as a burst of approvals sees it: read once, then kept current in memory as each move commits
    (a pending claim on the target, the group member moved), so the hundredth approval of a bulk request sees the
    first ninety-nine without reading the whole fleet ninety-nine more times."""

    states: dict[str, capacity.NodeState]
    ids: dict[str, int]
    names: dict[int, str]
    groups: dict[int, dict[int, list[tuple[int, str]]]]  # group id -> node id -> [(instance pk, iid)]

    @classmethod
    def read(cls, now: datetime) -> FleetView:
        states = placement.snapshot(now, claims=claims())
        return cls(
            states={s.name: s for s in states},
            ids={s.name: s.id for s in states},
            names={s.id: s.name for s in states},
            groups={},
        )

    @classmethod
    def for_proposals(cls, now: datetime) -> FleetView:
        """The fleet as a round of proposals sees it: as read, plus every pending proposal's target as if its move
        were placed (`proposed`), so proposals made one after another (one loss's instances, or a second loss
        while the first's proposals wait) do not all name the one node that can take only one of them."""
        fleet = cls.read(now)
        pending = (
            Reschedule.objects.filter(status=RescheduleStatus.PENDING, proposed_node__isnull=False)
            # Only what an approval could still apply: a move of a lost or live instance of an active lease.
            .filter(instance__state__in=[InstanceState.LOST, *LIVE], lease__state=LeaseState.ACTIVE)
            .select_related("instance__lease")
            .prefetch_related("instance__lease__groups")
            .order_by("pk")
        )
        for proposal in pending:
            target = fleet.names.get(proposal.proposed_node_id)
            if target is not None:
                fleet.proposed(proposal.instance, vnode_need(proposal.instance), target)
        return fleet

    def proposed(self, inst: Instance, need: capacity.Need, target: str) -> None:
        """Counts a proposal (a move not approved) on its target, in this view only: a pending claim there, and the
        instance a member of its lease's groups there, so the next proposal's dry run sees both. Nothing is
        reserved: approval re-plans against what is committed (`moved` keeps a burst of approvals current)."""
        state = self.states.get(target)
        if state is None:
            return
        # Its own claim id: the instance's real claim (a drain's live instance, on its source) is a different one.
        claim = capacity.Claim(
            id=f"{inst.iid} (proposed)",
            mem_mib=need.mem_mib,
            disk_gib=need.disk_gib,
            cpu_cores=need.cpu_cores,
        )
        self.states[target] = replace(state, pending=(*state.pending, claim))
        for group in inst.lease.groups.all():
            # A negative pk: no instance has it, and group_views leaves it out when this instance is planned.
            self.members(group).setdefault(state.id, []).append((-inst.pk, claim.id))

    def members(self, group: Group) -> dict[int, list[tuple[int, str]]]:
        if group.pk not in self.groups:
            self.groups[group.pk] = reads.group_members(group)
        return self.groups[group.pk]

    def moved(self, old: Instance, new: Instance, need: capacity.Need, target: str) -> None:
        state = self.states[target]
        claim = capacity.Claim(
            id=new.iid, mem_mib=need.mem_mib, disk_gib=need.disk_gib, cpu_cores=need.cpu_cores
        )
        self.states[target] = replace(state, pending=(*state.pending, claim))
        # The old instance is lost (not a live member) or stopping; the new one is a member on the target now.
        for group_id in (g.pk for g in old.lease.groups.all()):  # prefetched by do_approve
            by_node = self.groups.get(group_id)
            if by_node is None:
                continue
            by_node[old.node_id] = [(pk, iid) for pk, iid in by_node.get(old.node_id, []) if pk != old.pk]
            by_node.setdefault(new.node_id, []).append((new.pk, new.iid))


def group_views(
    lease, exclude_instance: Instance | None, fleet: FleetView | None = None
) -> list[affinity.GroupMembers]:
    """The lease's groups with where their live members run, the instance being moved left out."""
    fleet = fleet or FleetView(states={}, ids={}, names={}, groups={})
    views = []
    for group in lease.groups.all():
        members: dict[int, list[str]] = {}
        for node_id, entries in fleet.members(group).items():
            # The instance itself, and its own proposal (FleetView.proposed), are not members where it moves.
            for pk, iid in entries:
                if exclude_instance is not None and pk in (exclude_instance.pk, -exclude_instance.pk):
                    continue
                members.setdefault(node_id, []).append(iid)
        views.append(affinity.GroupMembers(reads.group_rule(group), members))
    return views


def group_check(
    views: list[affinity.GroupMembers], names: Mapping[int, str]
) -> tuple[capacity.Check, dict[str, int]]:
    """A placer check for the hard rules, and the soft rules' penalties (node name -> violations)."""

    def check(node: capacity.NodeState, need: capacity.Need, chosen: Sequence[str]) -> capacity.Unfit | None:
        for view in views:
            unfit = affinity.unfit(view, node.id, adding=1 + chosen.count(node.name), names=names)
            if unfit is not None:
                return unfit
        return None

    return check, affinity.penalties(views, names)


def vnode_need(inst: Instance, preferred: str | None = None) -> capacity.Need:
    return vnodes.as_need(inst.lease.vnodes[inst.vnode - 1], inst.lease.capabilities, preferred)


def remaining_windows(
    lease_ids: Iterable[int], now: datetime
) -> dict[tuple[int, int], list[tuple[datetime, datetime]]]:
    """(lease, node) -> the [start, end) windows of the lease's live reservations there that are not over yet."""
    out: dict[tuple[int, int], list[tuple[datetime, datetime]]] = {}
    rows = Allocation.objects.filter(
        reservation__lease_id__in=list(lease_ids), live=True, end__gt=now
    ).values_list("reservation__lease_id", "node_id", "start", "end")
    for lease_id, node_id, start, end in rows:
        out.setdefault((lease_id, node_id), []).append((start, end))
    return out


def slot_check(inst: Instance, now: datetime, table=None, windows=None) -> capacity.Check:
    """The vnode must fit in the slot table on the target for the rest of its lease's live reservations."""
    if windows is None:
        windows = remaining_windows([inst.lease_id], now)
    spans = windows.get((inst.lease_id, inst.node_id), [])
    need_res = vnodes.as_res(inst.lease.vnodes[inst.vnode - 1])

    def check(node: capacity.NodeState, need: capacity.Need, chosen: Sequence[str]) -> capacity.Unfit | None:
        if table is None or node.id == inst.node_id:
            return None
        extra = need_res.scaled(1 + chosen.count(node.name))
        for start, end in spans:
            t0, t1 = max(start, now).timestamp(), end.timestamp()
            if not table.fits(node.id, extra, t0, t1):
                blockers = table.blockers(node.id, extra, t0, t1)
                if blockers:
                    b = blockers[0]
                    begin, finish = (datetime.fromtimestamp(x, now.tzinfo) for x in (b.start, b.end))
                    why = f"reserved {begin:%H:%M}–{finish:%H:%M} by lease {b.lease_id} ({b.kind})"
                else:
                    why = "the slot table has no room for it over its remaining time"
                return capacity.Unfit(capacity.ReasonCode.RESERVED, why, {"window_end": end.isoformat()})
        return None

    return check


def plan_move(
    inst: Instance,
    now: datetime,
    *,
    preferred: str | None = None,
    table=None,
    fleet: FleetView | None = None,
    windows=None,
):
    fleet = fleet or FleetView.read(now)
    views = group_views(inst.lease, exclude_instance=inst, fleet=fleet)
    g_check, penalties = group_check(views, fleet.names)
    need = vnode_need(inst, preferred)
    checks = [g_check, slot_check(inst, now, table, windows)]
    result = placement.place(
        now, need, checks=checks, penalties=penalties, states=list(fleet.states.values())
    )
    return need, result, fleet.ids


def blocker(result: capacity.Placement) -> str:
    """The reason code that keeps a move from being applied, the most telling first."""
    codes = [v.reason_code for v in result.verdicts if not v.fit and v.reason_code]
    for code in ("anti_affinity", "affinity", "reserved", "at_capacity", "no_disk", "missing_capability"):
        if code in codes:
            return code
    return str(result.outcome)


def why_not(result: capacity.Placement, node: str | None) -> str:
    verdict = next((v for v in result.verdicts if v.node == node), None)
    if verdict is None or verdict.fit:
        return "a better node was found"
    return f"{verdict.reason_code}: {verdict.reason}"
