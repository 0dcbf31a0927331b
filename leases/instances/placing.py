"""Planning a move (a reschedule): the lease's group rules and the question every placement asks of the scheduler
(Scheduler.decide). Reads only: the actions that store the answer are in leases/instances/actions/reschedules.py.

A proposal and its approval are both decided inside a planning pass, on the pass's slot table (with the now-gate
and the pass's exclusions): the vnode as a one-VM request over the rest of its reservations, with the lease's
group rules as the mapper takes them. A proposal holds the room it names (a `hold` reservation of the lease), so
the approval finds it free; a bulk approval writes each move into the table before the next is decided, so it
accounts for itself. The stored report is the scheduler's vectorised verdict the decision was made from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from fleet import affinity, capacity
from fleet.models import PlacementReport
from leases import reads, vnodes
from leases.instance_rows import LIVE
from leases.instances.models import Reschedule, RescheduleStatus
from leases.lifecycle import InstanceState, LeaseState
from leases.models import Group, Instance
from leases.planning.plan import Planning
from leases.planning.reading import consulting
from leases.planning.records import barred_nodes
from leases.planning.reporting import report_row
from leases.scheduler import LeaseRequest


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
    def read(cls, now: datetime, nodes: Sequence[capacity.NodeState]) -> FleetView:
        """The fleet's names as a planning pass read it (the pass's slot table holds the capacity)."""
        return cls(
            states={}, ids={n.name: n.id for n in nodes}, names={n.id: n.name for n in nodes}, groups={}
        )

    @classmethod
    def for_proposals(cls, now: datetime, nodes: Sequence[capacity.NodeState]) -> FleetView:
        """The fleet as a round of proposals sees it: as read (given a planning pass's nodes, their names only:
        the pass's slot table holds the capacity, proposals' held room included), plus every pending proposal's
        target as a member of its lease's groups (`proposed`), so proposals made one after another do not put two
        members of an anti-affinity group on one node."""
        fleet = cls.read(now, nodes)
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
        node_id = self.ids.get(target)
        if node_id is None:
            return
        # Its own claim id: the instance's real claim (a drain's live instance, on its source) is a different one.
        claim = capacity.Claim(
            id=f"{inst.iid} (proposed)",
            mem_mib=need.mem_mib,
            disk_gib=need.disk_gib,
            cpu_cores=need.cpu_cores,
        )
        state = self.states.get(target)
        if state is not None:
            self.states[target] = replace(state, pending=(*state.pending, claim))
        for group in inst.lease.groups.all():
            # A negative pk: no instance has it, and group_views leaves it out when this instance is planned.
            self.members(group).setdefault(node_id, []).append((-inst.pk, claim.id))

    def members(self, group: Group) -> dict[int, list[tuple[int, str]]]:
        if group.pk not in self.groups:
            self.groups[group.pk] = reads.group_members(group)
        return self.groups[group.pk]

    def read_groups(self, groups: Sequence[Group]) -> None:
        """Where the live members of all these groups run, in one query (a bulk approval's groups at once)."""
        wanted = {g.pk for g in groups} - set(self.groups)
        if not wanted:
            return
        for pk in wanted:
            self.groups[pk] = {}
        rows = Instance.objects.filter(lease__groups__in=wanted, state__in=LIVE).values_list(
            "lease__groups", "node_id", "pk", "iid"
        )
        for group_id, node_id, pk, iid in rows:
            if group_id in wanted:
                self.groups[group_id].setdefault(node_id, []).append((pk, iid))

    def moved(self, old: Instance, new: Instance, need: capacity.Need | None, target: str) -> None:
        if target in self.states and need is not None:
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


def vnode_need(inst: Instance, preferred: str | None = None) -> capacity.Need:
    return vnodes.as_need(inst.lease.vnodes[inst.vnode - 1], inst.lease.capabilities, preferred)


# A dry-run request's id: no lease has it (the preview's is -1).
MOVE_ID = -2
# The reason codes that keep a move from being applied, the most telling first.
BLOCKERS = ("anti_affinity", "affinity", "reserved", "at_capacity", "no_disk", "missing_capability")


@dataclass
class MoveDecision:
    """An approval's answer: the target node (None: nothing fits now), its unsaved report (every node's verdict),
    and, when the proposed node was passed over, why ("code: sentence")."""

    target: int | None
    report: PlacementReport
    passed_over: str = ""

    @property
    def blocked_by(self) -> str:
        counts = self.report.counts
        return next((code for code in BLOCKERS if counts.get(code)), self.report.outcome)


def move_request(plan: Planning, inst: Instance, fleet: FleetView) -> LeaseRequest | None:
    """The vnode as a one-VM request over what is left of its reservations on its old node (or, lost and detached
    from its dead node, of the reservations it is missing from), with the lease's group rules (the instance itself
    left out) and capabilities; None when no reservation is left to move it in."""
    sched = plan.scheduler
    rec = sched.leases.get(inst.lease_id)
    if rec is None:
        return None
    ends = [
        r.end
        for r in rec.chain()
        if r.kind != "migrate" and r.end > plan.t and r.nodes.get(inst.vnode, inst.node_id) == inst.node_id
    ]
    if not ends:
        return None
    lease = inst.lease
    groups = group_views(lease, exclude_instance=inst, fleet=fleet)
    rules = affinity.spread(groups, fleet.names) if groups else affinity.Spread()
    barred = ()
    if groups or lease.capabilities:
        barred = barred_nodes(lease.capabilities or (), groups, plan.nodes)
    return LeaseRequest(
        id=MOVE_ID,
        type="immediate",
        submit=plan.t,
        start=plan.t,
        duration=max(ends) - plan.t,
        vnodes=(vnodes.as_res(lease.vnodes[inst.vnode - 1]),),
        preemptible=False,
        spread=rules.limit,
        taken=rules.taken,
        avoid=rules.avoid,
        barred=barred,
    )


def decide_move(
    plan: Planning,
    req: LeaseRequest,
    *,
    preferred: int | None,
    subject: str,
    requested_by: str,
) -> MoveDecision:
    """Where the vnode goes: the proposed node while it still holds the VM for its whole remaining time (the
    scheduler's verdict, now-gate and group rules included), else the node the scheduler's mapper picks, else
    nowhere. The stored report is the verdict the choice was made from, so the two never disagree.

    The window is [now, the end of its last reservation there): for a vnode with several reservations (a suspension
    and its resume) that is stricter than each one's own window, never looser. move_vnode re-checks each exactly."""
    start, end = plan.t, plan.t + req.duration

    def report(proposed: Sequence[int]) -> PlacementReport:
        return report_row(
            plan, req, start, end, outcome="placed", message="", subject=subject,
            requested_by=requested_by, proposed=proposed,
        )  # fmt: skip

    first, passed_over = None, ""
    if preferred is not None and preferred in plan.excluded:
        passed_over = plan.excluded[preferred]
    elif preferred is not None:
        first = report([preferred])
        if first.verdicts["chosen"] == [preferred]:
            return MoveDecision(preferred, first)
        passed_over = _why_not(first, plan.names.get(preferred), plan.names)
    # The question a submission asks (Scheduler.decide): the same ranking, gates and outcome names.
    trial = plan.scheduler.decide(req, plan.t, plan.excluded)
    found = trial.nodes if trial.placed else []
    if found:
        chosen = report(found[:1])
        if chosen.verdicts["chosen"] == found[:1]:
            return MoveDecision(found[0], chosen, passed_over)
    refused = first if first is not None else report([])
    refused.chosen = []
    refused.outcome = trial.outcome if not trial.placed else str(capacity.Outcome.FLEET_AT_CAPACITY)
    refused.code = refused.outcome
    # The outcome first, as the placer worded it ("fleet at capacity: ..."): the console and operators read it.
    refused.message = f"{refused.outcome.replace('_', ' ')}: {refused.summary}"
    return MoveDecision(None, refused, passed_over)


def _why_not(report: PlacementReport, node: str | None, names: Mapping[int, str]) -> str:
    if node is None:
        return "it is no longer in the fleet"
    report.use_names(names)
    row = report.verdict_for(node)
    if row is None or row.get("fit"):
        return "a better node was found"
    return f"{row.get('reason_code')}: {row.get('reason')}"


@dataclass(frozen=True)
class DrainTarget:
    """Where one live instance of a node would go if the node were drained now: a node's name, or the outcome that
    keeps it where it is (no_capable_node, fleet_at_capacity, fleet_unreadable)."""

    iid: str
    lease_id: int
    target: str | None
    outcome: str


def drain_targets(node_id: int, now: datetime) -> list[DrainTarget]:
    """The drain preview's question, asked as a move's approval asks it (Scheduler.decide over the instance's
    remaining window, its group rules, the node itself ruled out as draining): where each live instance of the node
    would go now. Each is asked alone on the plan as it stands; the approvals that apply them are decided in order,
    each counting the ones before. Reads only."""
    insts = list(
        Instance.objects.filter(node_id=node_id, state__in=LIVE)
        .select_related("lease")
        .prefetch_related("lease__groups")
        .order_by("id")
    )
    if not insts:
        return []
    out = []
    with consulting(now) as plan:
        fleet = FleetView.read(now, plan.nodes)
        excluded = {**plan.excluded, node_id: "draining: the drain being previewed"}
        for inst in insts:
            req = move_request(plan, inst, fleet)
            if req is None:
                out.append(DrainTarget(inst.iid, inst.lease_id, None, "nothing_to_move"))
                continue
            trial = plan.scheduler.decide(req, plan.t, excluded)
            target = plan.names.get(trial.nodes[0]) if trial.placed else None
            out.append(DrainTarget(inst.iid, inst.lease_id, target, trial.outcome))
    return out
