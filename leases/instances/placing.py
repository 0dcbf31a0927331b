"""Planning a move (a reschedule): the fleet as a burst of approvals sees it, the lease's group rules and the slot
table as placer checks, and the placer's answer. Reads only: the actions that store the answer are in
leases/instances/actions/reschedules.py.

A proposal's dry run (`plan_move`) is decided by the placer (fleet/capacity.py) with two extra checks: the slot
table must hold the vnode for the rest of its reservations on the target, and the lease's groups must allow it
(fleet/affinity.py, the same rules a submission and the agent apply).

An approval (`decide_move`) is asked of the plan applier's scheduler instead, inside the pass that commits it: the
vnode as a one-VM request over the rest of its reservations, with the lease's group rules as the mapper takes
them. The slot table (with the now-gate and the pass's exclusions) is the one capacity view of the whole pass,
and each move is written into it before the next approval is decided, so a batch of approvals accounts for
itself; the verdicts come from the scheduler's vectorised `explain` (store.report_row), not from a placer run
and a Python dict per node per approval (most of a bulk approval's time, measured: docs/BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from fleet import affinity, capacity, placement
from fleet.models import PlacementReport
from leases import reads, store, vnodes
from leases.instance_rows import LIVE
from leases.instances.models import Reschedule, RescheduleStatus
from leases.instances.reads import claims
from leases.lifecycle import InstanceState, LeaseState
from leases.models import Allocation, Group, Instance
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
    def read(cls, now: datetime, nodes: Sequence[capacity.NodeState] | None = None) -> FleetView:
        """The fleet with what runs where (a proposal's placer run), or, given the nodes a planning pass read
        already, only their names (an approval: the pass's slot table holds the capacity, so nothing is read)."""
        if nodes is not None:
            return cls(
                states={}, ids={n.name: n.id for n in nodes}, names={n.id: n.name for n in nodes}, groups={}
            )
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


def move_request(plan: store.Planning, inst: Instance, fleet: FleetView) -> LeaseRequest | None:
    """The vnode as a one-VM request over what is left of its reservations on its old node, with the lease's group
    rules (the instance itself left out) and capabilities; None when it holds no reservation there to move."""
    sched = plan.scheduler
    rec = sched.leases.get(inst.lease_id)
    if rec is None:
        return None
    ends = [r.end for r in rec.chain() if r.nodes.get(inst.vnode) == inst.node_id and r.end > plan.t]
    if not ends:
        return None
    lease = inst.lease
    groups = group_views(lease, exclude_instance=inst, fleet=fleet)
    rules = affinity.spread(groups, fleet.names) if groups else affinity.Spread()
    barred = ()
    if groups or lease.capabilities:
        barred = store.barred_nodes(lease.capabilities or (), groups, plan.nodes)
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
    plan: store.Planning,
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
        return store.report_row(
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
    with store.consulting(now) as plan:
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
