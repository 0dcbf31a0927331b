"""Instances: their lifecycle on nodes, bounded restarts, node loss, reschedules and groups.

The write paths here are part of the leases action layer (ARCHITECTURE.md): they run inside the transaction of the
action that calls them (the plan applier for lease changes and approvals, the heartbeat for agent reports), write
history rows, and announce changes after commit. Every state change goes through the pure machine in
leases/lifecycle.py: an illegal step is refused and logged, never applied.

Placement of a move (a reschedule) is decided by the placer (fleet/capacity.py) with two extra checks: the slot
table must hold the vnode for the rest of its reservations on the target, and the lease's groups must allow it.
Approvals run under the plan lock, so a move counts every other move already committed; two approvals that race
(seed 002, Nova bug 1735407) are serialised and the second is re-planned instead of violating the group.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Max

from fleet import capacity, placement
from fleet.models import Node, NodeStatus
from leases.lifecycle import (
    LIVE_INSTANCE_STATES,
    InstanceState,
    LeaseState,
    ReschedulePolicy,
    RestartPolicy,
    can_instance,
    decide_on_loss,
    decide_restart,
    instance_id,
)
from leases.models import (
    Alert,
    Allocation,
    Group,
    GroupPolicy,
    Instance,
    InstanceEvent,
    Lease,
    Reschedule,
    RescheduleStatus,
    RestartRecord,
)
from slotkeeper import audit, events, metrics
from slotkeeper.bulk import update_many
from slotkeeper.domain import DomainError, NotFound, StaleVersion

log = logging.getLogger(__name__)
_I = InstanceState

LIVE = [s.value for s in LIVE_INSTANCE_STATES]
# States in which an instance still occupies its node from the agent's point of view (what assignments list).
ON_NODE = [*LIVE, _I.FINISHED, _I.REVOKED, _I.STOPPED, _I.FAILED, _I.RESCHEDULED, _I.LOST]


# -- state steps ---------------------------------------------------------------------------------------------


def step(
    inst: Instance, target: InstanceState, now: datetime, reason: str = "", *, save: bool = True
) -> bool:
    """Moves an instance to `target` if the machine allows it; otherwise logs the refusal and changes nothing."""
    if inst.state == target:
        return True
    if not can_instance(inst.state, target):
        log.warning(
            "illegal instance step refused",
            extra={"instance": inst.iid, "from": inst.state, "to": str(target), "reason": reason},
        )
        return False
    InstanceEvent.objects.create(instance=inst, at=now, from_state=inst.state, to_state=target, reason=reason)
    inst.state = target
    inst.state_changed_at = now
    if save:
        inst.save(update_fields=["state", "state_changed_at"])
    events.send_on_commit("instance-changed", instance=inst.iid, lease=inst.lease_id)
    return True


def _next_generation(lease_id: int, vnode: int) -> int:
    top = Instance.objects.filter(lease_id=lease_id, vnode=vnode).aggregate(g=Max("generation"))["g"]
    return 0 if top is None else top + 1


def placed_instance(
    lease_id: int, vnode: int, generation: int, node_id: int, now: datetime, *, replaces=None
) -> tuple[Instance, InstanceEvent]:
    """A new instance placed on a node, and its first history row, both unsaved: how every instance starts,
    whether one is created at a time (a lease starting) or many in one write (a bulk approval)."""
    inst = Instance(
        iid=instance_id(lease_id, vnode, generation),
        lease_id=lease_id,
        vnode=vnode,
        generation=generation,
        node_id=node_id,
        state=_I.PLACED,
        desired_state="running",
        created_at=now,
        state_changed_at=now,
        replaces=replaces,
    )
    return inst, InstanceEvent(at=now, from_state=_I.REQUESTED, to_state=_I.PLACED, reason="placed")


def create_instance(lease_id: int, vnode: int, node_id: int, now: datetime, *, replaces=None) -> Instance:
    inst, first = placed_instance(
        lease_id, vnode, _next_generation(lease_id, vnode), node_id, now, replaces=replaces
    )
    inst.save()
    first.instance = inst
    first.save()
    events.send_on_commit("instance-changed", instance=inst.iid, lease=lease_id)
    return inst


def wind_down(inst: Instance, now: datetime, *, finished: bool, reason: str) -> None:
    """The lease no longer runs this instance here: the agent is told to stop it, and confirms by not reporting it."""
    inst.desired_state = "stopped"
    inst.save(update_fields=["desired_state"])
    if inst.state == _I.RUNNING and finished:
        step(inst, _I.FINISHED, now, reason)
    elif inst.state in (_I.PLACED, _I.FETCHING, _I.VERIFIED, _I.LOADED):
        step(inst, _I.REVOKED, now, reason)
    elif inst.state in (_I.RUNNING, _I.UNHEALTHY, _I.RESTARTING):
        step(inst, _I.STOPPING, now, reason)


# -- leases drive their instances ----------------------------------------------------------------------------


def present_instances(lease_ids: Iterable[int]) -> dict[int, list[Instance]]:
    """The instances that stand for their vnodes (live, lost or failed), by lease, oldest generation first."""
    out: dict[int, list[Instance]] = {}
    rows = Instance.objects.filter(lease_id__in=list(lease_ids), state__in=[*LIVE, _I.LOST, _I.FAILED])
    # Locked in id order (the order every writer of instance rows takes), so a heartbeat ingesting reports for
    # the same rows waits for this change, or this change for it.
    locked = list(rows.select_for_update().order_by("id"))
    for inst in sorted(locked, key=lambda i: (i.generation, i.pk)):
        out.setdefault(inst.lease_id, []).append(inst)
    return out


def sync_lease_instances(
    lease_id: int,
    lease_state: LeaseState,
    vm_nodes: dict[int, int] | None,
    now: datetime,
    *,
    present: list[Instance] | None = None,
) -> None:
    """Keeps a lease's instances consistent with its state: one live instance per vnode while it is active, on the
    node its VM reservation names; none otherwise."""
    # A lost or failed instance still stands for its vnode: a reschedule (or an operator) decides what replaces it,
    # never a side effect of some other change to the lease.
    if present is None:
        present = present_instances([lease_id]).get(lease_id, [])
    live = {i.vnode: i for i in present}
    if lease_state == LeaseState.ACTIVE and vm_nodes:
        for vnode, node_id in vm_nodes.items():
            current = live.pop(vnode, None)
            if current is not None and (current.node_id == node_id or current.state in (_I.LOST, _I.FAILED)):
                continue
            if current is not None:
                wind_down(current, now, finished=False, reason=f"vnode {vnode} moved to node {node_id}")
            create_instance(lease_id, vnode, node_id, now)
    finished = lease_state == LeaseState.DONE
    for inst in live.values():
        if inst.state in LIVE:
            wind_down(inst, now, finished=finished, reason=f"lease is {lease_state}")


# -- agent reports -------------------------------------------------------------------------------------------


def restart_policy(lease: Lease) -> RestartPolicy:
    return RestartPolicy(**(lease.restart_policy or {}))


def ingest_reports(node: Node, reports: Sequence[dict], now: datetime) -> None:
    """What the node's agent says it runs: running confirms, an exit or a missed report makes the instance
    unhealthy and asks the restart policy, and an instance the agent no longer has is unloaded when it should be."""
    by_id = {r["id"]: r for r in reports}
    # Locked, in id order, and read under the lock: a cancel or an approval that changes the same rows either
    # committed before (and this sees its desired_state) or waits for this heartbeat. Read without the lock, a
    # cancel that committed meanwhile was overwritten, leaving instances running with desired_state=stopped.
    instances = list(
        Instance.objects.select_for_update(of=("self",))
        .select_related("lease")
        .filter(node=node, state__in=ON_NODE)
        .exclude(state=_I.LOST)
        .order_by("id")
    )
    for inst in instances:
        report = by_id.get(inst.iid)
        status = report["status"] if report else None
        if report:
            _keep_report(inst, report)
        if inst.desired_state == "running" and inst.state in LIVE:
            _reconcile_running(inst, status, report, now)
        elif inst.desired_state == "stopped" and inst.state in (_I.RUNNING, _I.UNHEALTHY, _I.RESTARTING):
            # Told to stop but still recorded as running (a row left so by an earlier race): stopping, so the agent
            # is told to stop it and the placer stops counting it once it is gone.
            step(inst, _I.STOPPING, now, "desired state is stopped")
            if status in (None, "stopped", "exited", "failed"):
                _confirm_gone(inst, now)
        elif status in (None, "stopped", "exited", "failed"):
            _confirm_gone(inst, now)


def _keep_report(inst: Instance, report: dict) -> None:
    fields = []
    if report.get("exit_code") is not None:
        inst.last_exit_code = report["exit_code"]
        fields.append("last_exit_code")
    if report.get("log_tail"):
        inst.log_tail = report["log_tail"][-50:]
        fields.append("log_tail")
    if report.get("detail"):
        inst.detail = report["detail"][:2000]
        fields.append("detail")
    if fields:
        inst.save(update_fields=fields)


def _reconcile_running(inst: Instance, status: str | None, report: dict | None, now: datetime) -> None:
    if status == "running":
        if inst.state != _I.RUNNING:
            step(inst, _I.RUNNING, now, "agent reports it running")
        return
    if status in ("exited", "failed"):
        why = f"agent reports it {status}"
        if report and report.get("exit_code") is not None:
            why += f" with exit code {report['exit_code']}"
        detail = (report or {}).get("detail") or ""
        if detail and not detail.startswith("exit code"):  # the agent's default detail repeats the code
            why += f": {detail[:200]}"
        _unhealthy(inst, now, why)
    elif status is None and inst.state == _I.RUNNING:
        _unhealthy(inst, now, "missing from the agent's report")


def _unhealthy(inst: Instance, now: datetime, why: str) -> None:
    if inst.state == _I.RESTARTING and inst.restart_not_before is not None:
        return  # waiting for its backoff: the old generation's exit is old news
    if inst.state != _I.UNHEALTHY and not step(inst, _I.UNHEALTHY, now, why):
        return
    decide_and_restart(inst, now, why)


def decide_and_restart(inst: Instance, now: datetime, why: str) -> RestartRecord:
    previous = [r.at.timestamp() for r in inst.restarts.filter(decision="restart")]
    decision = decide_restart(restart_policy(inst.lease), previous, now.timestamp())
    next_at = datetime.fromtimestamp(decision.not_before, now.tzinfo) if decision.not_before else None
    record = RestartRecord.objects.create(
        instance=inst,
        at=now,
        attempt=decision.attempt,
        reason=why,
        decision=decision.action,
        next_eligible_at=next_at,
        explanation=decision.reason,
    )
    if decision.action == "exhausted":
        step(inst, _I.FAILED, now, decision.reason)
        inst.desired_state = "stopped"
        inst.save(update_fields=["desired_state"])
        raise_alert(
            "restarts_exhausted", f"instance {inst.iid} failed: {decision.reason}", now, instance=inst
        )
    elif decision.action == "wait":
        step(inst, _I.RESTARTING, now, decision.reason)
        inst.restart_not_before = next_at
        inst.save(update_fields=["restart_not_before"])
    else:
        _restart_now(inst, now, decision.reason)
    return record


def _restart_now(inst: Instance, now: datetime, reason: str) -> None:
    """A new generation on the same node: the agent sees a new id and starts it (it never reruns a generation)."""
    step(inst, _I.RESTARTING, now, reason)
    inst.generation = _next_generation(inst.lease_id, inst.vnode)
    inst.iid = instance_id(inst.lease_id, inst.vnode, inst.generation)
    inst.restart_not_before = None
    inst.save(update_fields=["generation", "iid", "restart_not_before"])


def _confirm_gone(inst: Instance, now: datetime) -> None:
    if inst.state == _I.STOPPING:
        step(inst, _I.STOPPED, now, "agent stopped it")
    if inst.state in (_I.STOPPED, _I.FINISHED, _I.REVOKED, _I.RESCHEDULED, _I.FAILED):
        step(inst, _I.UNLOADED, now, "agent no longer runs it")


def supervise(now: datetime) -> int:
    """Restarts whose backoff has passed go now (the periodic work). Claims each row with a conditional update so
    two ticks never restart the same instance twice."""
    due = Instance.objects.filter(state=_I.RESTARTING, restart_not_before__lte=now).select_related("lease")
    count = 0
    for inst in due:
        with transaction.atomic():
            claimed = Instance.objects.filter(
                pk=inst.pk, state=_I.RESTARTING, restart_not_before=inst.restart_not_before
            ).update(restart_not_before=None)
            if not claimed:
                continue
            RestartRecord.objects.create(
                instance=inst,
                at=now,
                attempt=inst.restarts.filter(decision="restart").count() + 1,
                reason="backoff passed",
                decision="restart",
                explanation="its backoff has passed",
            )
            _restart_now(inst, now, "backoff passed")
            count += 1
    return count


# -- node loss -----------------------------------------------------------------------------------------------


def raise_alert(kind: str, message: str, now: datetime, *, instance=None, lease=None, node=None) -> Alert:
    alert = Alert.objects.create(
        kind=kind,
        message=message,
        created_at=now,
        instance=instance,
        lease=lease or (instance.lease if instance else None),
        node=node or (instance.node if instance else None),
    )
    events.send_on_commit("alert-raised", alert=alert.pk)
    return alert


def reschedules_so_far(lease_id: int, vnode: int) -> int:
    return Reschedule.objects.filter(
        lease_id=lease_id, instance__vnode=vnode, status=RescheduleStatus.APPLIED
    ).count()


def on_nodes_died(node_ids: Iterable[int], now: datetime, reason: str = "") -> list[Reschedule]:
    """Every live instance on the dead nodes is lost; each is held, failed, or proposed for a reschedule."""
    proposals = []
    for node in Node.objects.filter(pk__in=list(node_ids)):
        lost = Instance.objects.filter(node=node, state__in=LIVE).count()
        raise_alert(
            "node_dead",
            f"node {node.name} is dead ({reason or 'no reason given'}); {lost} live instance(s) on it",
            now,
            node=node,
        )
    for inst in Instance.objects.select_related("lease", "node").filter(
        node_id__in=list(node_ids), state__in=LIVE
    ):
        if not step(inst, _I.LOST, now, f"node {inst.node.name} died: {reason}".rstrip(": ")):
            continue
        lease = inst.lease
        decision = decide_on_loss(
            ReschedulePolicy(
                max_reschedules=lease.max_reschedules, auto_approve=lease.auto_approve_reschedules
            ),
            migratable=lease.migratable,
            capabilities=lease.capabilities,
            reschedules_so_far=reschedules_so_far(lease.pk, inst.vnode),
        )
        if decision.action == "hold":
            raise_alert(
                "instance_held", f"instance {inst.iid} is held: {decision.reason}", now, instance=inst
            )
        elif decision.action == "fail":
            step(inst, _I.FAILED, now, decision.reason)
            raise_alert(
                "reschedule_budget_spent",
                f"instance {inst.iid} failed: {decision.reason}",
                now,
                instance=inst,
            )
        else:
            proposal = propose(inst, now, cause="node_dead", note=decision.reason)
            if proposal is not None:
                proposals.append(proposal)
    return proposals


# -- groups as placer checks ---------------------------------------------------------------------------------


@dataclass
class GroupView:
    group: Group
    members: dict[int, list[str]]  # node id -> instance ids of members placed there (live)


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
        states = placement.snapshot(now)
        return cls(
            states={s.name: s for s in states},
            ids={s.name: s.id for s in states},
            names={s.id: s.name for s in states},
            groups={},
        )

    def members(self, group: Group) -> dict[int, list[tuple[int, str]]]:
        if group.pk not in self.groups:
            rows = Instance.objects.filter(lease__groups=group, state__in=LIVE).values_list(
                "node_id", "pk", "iid"
            )
            by_node: dict[int, list[tuple[int, str]]] = {}
            for node_id, pk, iid in rows:
                by_node.setdefault(node_id, []).append((pk, iid))
            self.groups[group.pk] = by_node
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
    lease: Lease, exclude_instance: Instance | None, fleet: FleetView | None = None
) -> list[GroupView]:
    fleet = fleet or FleetView(states={}, ids={}, names={}, groups={})
    views = []
    for group in lease.groups.all():
        members: dict[int, list[str]] = {}
        for node_id, entries in fleet.members(group).items():
            for pk, iid in entries:
                if exclude_instance is not None and pk == exclude_instance.pk:
                    continue
                members.setdefault(node_id, []).append(iid)
        views.append(GroupView(group, members))
    return views


def group_check(
    views: list[GroupView], names: dict[int, str] | None = None
) -> tuple[capacity.Check, dict[str, int]]:
    """A placer check for the hard rules and the soft rules' penalties (node name -> violations)."""
    if names is None:
        names = dict(Node.objects.values_list("id", "name"))

    def check(node: capacity.NodeState, need: capacity.Need, chosen: Sequence[str]) -> capacity.Unfit | None:
        for view in views:
            g = view.group
            if not g.hard:
                continue
            here = view.members.get(node.id, [])
            if (
                g.policy == GroupPolicy.ANTI_AFFINITY
                and len(here) + chosen.count(node.name) >= g.max_per_node
            ):
                who = ", ".join(here[:3]) or "a member placed in this request"
                return capacity.Unfit(
                    capacity.ReasonCode.ANTI_AFFINITY,
                    f"group {g.name} already has instance {who} here (at most {g.max_per_node} per node)",
                    {"group": g.name, "members_here": len(here), "max_per_node": g.max_per_node},
                )
            if g.policy == GroupPolicy.AFFINITY and view.members and node.id not in view.members:
                where = ", ".join(sorted(names.get(n, str(n)) for n in view.members))
                return capacity.Unfit(
                    capacity.ReasonCode.AFFINITY,
                    f"group {g.name} runs on {where}; affinity keeps its members together",
                    {"group": g.name},
                )
        return None

    penalties: dict[str, int] = {}
    for view in views:
        if view.group.hard:
            continue
        for node_id, name in names.items():
            here = len(view.members.get(node_id, []))
            if view.group.policy == GroupPolicy.ANTI_AFFINITY and here >= view.group.max_per_node:
                penalties[name] = penalties.get(name, 0) + 1
            if view.group.policy == GroupPolicy.AFFINITY and view.members and node_id not in view.members:
                penalties[name] = penalties.get(name, 0) + 1
    return check, penalties


def group_violation(policy: str, max_per_node: int, lease_ids: Sequence[int]) -> str:
    """Why these leases' live instances already break the hard rule, or "" when they do not."""
    per_node: dict[int, list[str]] = {}
    for node_id, iid in Instance.objects.filter(lease_id__in=lease_ids, state__in=LIVE).values_list(
        "node_id", "iid"
    ):
        per_node.setdefault(node_id, []).append(iid)
    names = dict(Node.objects.filter(pk__in=per_node).values_list("id", "name"))
    if policy == GroupPolicy.ANTI_AFFINITY:
        crowded = {n: iids for n, iids in per_node.items() if len(iids) > max_per_node}
        if crowded:
            node_id, iids = sorted(crowded.items())[0]
            return f"{names[node_id]} runs {', '.join(sorted(iids))} (at most {max_per_node} per node)"
    if policy == GroupPolicy.AFFINITY and len(per_node) > 1:
        return f"members run on {', '.join(sorted(names[n] for n in per_node))}, not on one node"
    return ""


# -- reschedules ---------------------------------------------------------------------------------------------


def vnode_need(inst: Instance, preferred: str | None = None) -> capacity.Need:
    v = inst.lease.vnodes[inst.vnode - 1]
    return capacity.Need(
        mem_mib=int(v["mem_mib"]),
        disk_gib=int(v.get("disk_gib", 0)),
        cpu_cores=float(v.get("cpu_cores", 0)),
        capabilities=frozenset(inst.lease.capabilities),
        preferred_node=preferred,
    )


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
    v = inst.lease.vnodes[inst.vnode - 1]
    from leases.slottable import Res

    need_res = Res(
        cpu=round(float(v.get("cpu_cores", 0)) * 100), mem=int(v["mem_mib"]), disk=int(v.get("disk_gib", 0))
    )

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


def propose(inst: Instance, now: datetime, *, cause: str, note: str = "") -> Reschedule | None:
    """A dry-run placement (target and every node's verdict) kept as a pending proposal."""
    need, result, ids = plan_move(inst, now)
    report = placement.record(now, f"reschedule:{inst.iid}", need, result, ids_by_name=ids)
    target = result.nodes[0] if result.outcome == capacity.Outcome.PLACED else None
    try:
        with transaction.atomic():
            proposal = Reschedule.objects.create(
                instance=inst,
                lease=inst.lease,
                cause=cause,
                proposed_node_id=ids.get(target) if target else None,
                report=report,
                blocked_by="" if target else _blocker(result),
                message=f"{note} {result.message}".strip(),
                created_at=now,
            )
    except IntegrityError:
        return None  # a pending proposal for this instance exists already
    events.send_on_commit("reschedule-changed", reschedule=proposal.pk)
    if inst.lease.auto_approve_reschedules and target:
        transaction.on_commit(lambda: _auto_approve(proposal.pk))
    return proposal


def _auto_approve(pk: int) -> None:
    from django.utils import timezone

    try:
        do_approve(None, [pk], now=timezone.now())
    except DomainError:
        log.info("auto-approval left the proposal pending", extra={"reschedule": pk})


def _blocker(result: capacity.Placement) -> str:
    codes = [v.reason_code for v in result.verdicts if not v.fit and v.reason_code]
    for code in ("anti_affinity", "affinity", "reserved", "at_capacity", "no_disk", "missing_capability"):
        if code in codes:
            return code
    return str(result.outcome)


@dataclass
class ApprovalResult:
    id: int
    ok: bool
    status: str
    message: str
    node: str | None = None
    new_instance: str | None = None
    # What happened, for programs: applied | pending (re-planned, nothing fits) | stale (the version the caller saw
    # is old) | conflict (already applied or rejected, or nothing to move) | not_found.
    code: str = ""

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "ok": self.ok,
            "code": self.code,
            "status": self.status,
            "message": self.message,
            "node": self.node,
            "new_instance": self.new_instance,
        }


@dataclass
class _Batch:
    """The writes of a bulk approval, made once at the end: a burst of moves is a few statements, not a dozen each.
    Every check that can refuse an item runs before its writes are queued, so a refused item leaves nothing."""

    now: datetime
    actor: object
    reports: list = field(default_factory=list)  # (proposal, PlacementReport)
    proposals: list = field(default_factory=list)
    new_instances: list = field(default_factory=list)  # (proposal or None, Instance)
    old_instances: list = field(default_factory=list)
    history: list = field(default_factory=list)  # (instance, InstanceEvent)
    audits: list = field(default_factory=list)
    generations: dict = field(default_factory=dict)  # (lease, vnode) -> highest generation so far

    def next_generation(self, lease_id: int, vnode: int) -> int:
        key = (lease_id, vnode)
        self.generations[key] = self.generations.get(key, -1) + 1
        return self.generations[key]

    def flush(self) -> None:
        from fleet.models import PlacementReport
        from slotkeeper.models import AuditEntry

        made = PlacementReport.objects.bulk_create([report for _, report in self.reports])
        for (proposal, _), report in zip(self.reports, made, strict=True):
            proposal.report = report
        Instance.objects.bulk_create([inst for _, inst in self.new_instances])
        for proposal, inst in self.new_instances:
            if proposal is not None:
                proposal.new_instance = inst
        for inst, event in self.history:
            event.instance = inst
        InstanceEvent.objects.bulk_create([event for _, event in self.history])
        if self.old_instances:
            update_many(self.old_instances, ["state", "state_changed_at", "desired_state"])
        if self.proposals:
            fields = [
                "status",
                "version",
                "report",
                "blocked_by",
                "message",
                "decided_at",
                "decided_by",
                "new_instance",
            ]
            update_many(self.proposals, fields)
        AuditEntry.objects.bulk_create(self.audits)
        for proposal in self.proposals:
            events.send_on_commit("reschedule-changed", reschedule=proposal.pk)
        for _, inst in self.new_instances:
            events.send_on_commit("instance-changed", instance=inst.iid, lease=inst.lease_id)

    def event(self, inst: Instance, target: InstanceState, reason: str) -> None:
        self.history.append(
            (inst, InstanceEvent(at=self.now, from_state=inst.state, to_state=target, reason=reason))
        )
        inst.state = target
        inst.state_changed_at = self.now


def do_approve(
    actor, ids: Sequence[int], *, now: datetime, versions: dict[int, int] | None = None
) -> list[ApprovalResult]:
    """Approves proposals in one plan-applier transaction: each is re-planned against everything committed before
    it (including the moves approved earlier in this same call), so a group can never be broken by a burst."""
    from leases import store

    results = []
    with store.planning(now) as plan:
        # Retire what is already over, so only live reservations are compared.
        plan.scheduler.advance(plan.t, plan.excluded)
        fleet = FleetView.read(now)
        proposals = {
            p.pk: p
            for p in Reschedule.objects.select_for_update(of=("self",))
            .select_related("instance__lease", "proposed_node")
            .prefetch_related("instance__lease__groups")
            .filter(pk__in=list(ids))
        }
        # The instances the approvals change, locked in id order like every other writer of instance rows.
        list(
            Instance.objects.select_for_update()
            .filter(pk__in=sorted({p.instance_id for p in proposals.values()}))
            .order_by("id")
            .values_list("id", flat=True)
        )
        lease_ids = {p.lease_id for p in proposals.values()}
        windows = remaining_windows(lease_ids, now)
        batch = _Batch(now=now, actor=actor)
        for lease_id, vnode, top in _generations(lease_ids):
            batch.generations[(lease_id, vnode)] = top
        for pk in ids:
            try:
                proposal = proposals.get(pk)
                if proposal is None:
                    raise NotFound(f"reschedule {pk} does not exist")
                results.append(_approve_one(proposal, plan, (versions or {}).get(pk), fleet, batch, windows))
            except (DomainError, NotFound) as exc:
                status = proposals[pk].status if pk in proposals else "unknown"
                code = (
                    "not_found"
                    if isinstance(exc, NotFound)
                    else "stale"
                    if isinstance(exc, StaleVersion)
                    else "conflict"
                )
                results.append(ApprovalResult(pk, False, status, str(exc), code=code))
                if len(ids) == 1:
                    raise
        batch.flush()
    for result in results:
        metrics.inc(
            "slotkeeper_placements_total", kind="reschedule", outcome="placed" if result.ok else result.status
        )
    return results


def _generations(lease_ids: Iterable[int]) -> list[tuple[int, int, int]]:
    rows = (
        Instance.objects.filter(lease_id__in=list(lease_ids))
        .values("lease_id", "vnode")
        .annotate(top=Max("generation"))
        .values_list("lease_id", "vnode", "top")
    )
    return list(rows)


def _approve_one(
    proposal, plan, version: int | None, fleet: FleetView, batch: _Batch, windows
) -> ApprovalResult:
    from leases import store

    pk, now = proposal.pk, batch.now
    if proposal.status != RescheduleStatus.PENDING:
        raise DomainError(f"reschedule {pk} is already {proposal.status}")
    if version is not None and version != proposal.version:
        raise StaleVersion(
            f"reschedule {pk} changed since you saw it (version {version}, now {proposal.version})"
        )
    inst = proposal.instance
    lease = inst.lease
    who = audit.actor_label(batch.actor)
    if lease.state != LeaseState.ACTIVE or inst.state not in (_I.LOST, *LIVE):
        proposal.status = RescheduleStatus.REJECTED
        proposal.message = (
            f"nothing to move: lease {lease.pk} is {lease.state}, instance {inst.iid} is {inst.state}"
        )
        proposal.decided_at, proposal.decided_by = now, who
        batch.proposals.append(proposal)
        return ApprovalResult(pk, False, proposal.status, proposal.message, code="conflict")
    proposed = proposal.proposed_node.name if proposal.proposed_node_id else None
    need, result, ids = plan_move(
        inst, now, preferred=proposed, table=plan.scheduler.table, fleet=fleet, windows=windows
    )
    report = placement.report_row(
        now, f"reschedule:{inst.iid}", need, result, requested_by=who, ids_by_name=ids
    )
    batch.reports.append((proposal, report))
    batch.proposals.append(proposal)
    if result.outcome != capacity.Outcome.PLACED:
        proposal.version += 1
        proposal.blocked_by = _blocker(result)
        proposal.message = f"still pending: {result.message}"
        return ApprovalResult(pk, False, proposal.status, proposal.message, code="pending")
    target_name = result.nodes[0]
    target_id = ids[target_name]
    if not store.move_vnode(plan, lease.pk, inst.vnode, inst.node_id, target_id):
        batch.reports.pop()
        batch.proposals.pop()
        raise DomainError(f"the slot table has no room for {inst.iid} on {target_name} any more")
    generation = batch.next_generation(lease.pk, inst.vnode)
    new, first = placed_instance(lease.pk, inst.vnode, generation, target_id, now, replaces=inst)
    batch.new_instances.append((proposal, new))
    batch.history.append((new, first))
    fleet.moved(inst, new, need, target_name)
    if inst.state == _I.LOST:
        batch.event(inst, _I.RESCHEDULED, f"replaced by {new.iid} on {target_name}")
    else:
        # A drain moves a live instance: the old one is told to stop once its replacement is placed.
        inst.desired_state = "stopped"
        target = _I.STOPPING if inst.state in (_I.RUNNING, _I.UNHEALTHY, _I.RESTARTING) else _I.REVOKED
        if can_instance(inst.state, target):
            batch.event(inst, target, f"moved to {target_name} as {new.iid}")
    batch.old_instances.append(inst)
    changed = proposed and proposed != target_name
    message = (
        f"moved to {target_name} as {new.iid}; the proposed node {proposed} no longer fits "
        f"({_why(result, proposed)})"
        if changed
        else f"moved to {target_name} as {new.iid}"
    )
    proposal.status = RescheduleStatus.APPLIED
    proposal.message = message
    proposal.blocked_by = ""
    proposal.decided_at, proposal.decided_by = now, who
    proposal.version += 1
    batch.audits.append(
        audit.entry(
            at=now,
            actor=batch.actor,
            action="reschedule.approve",
            target=proposal,
            details={"node": target_name, "message": message},
        )
    )
    return ApprovalResult(pk, True, proposal.status, message, target_name, new.iid, code="applied")


def _why(result: capacity.Placement, node: str | None) -> str:
    verdict = next((v for v in result.verdicts if v.node == node), None)
    if verdict is None or verdict.fit:
        return "a better node was found"
    return f"{verdict.reason_code}: {verdict.reason}"


def do_reject(actor, pk: int, *, now: datetime, reason: str = "") -> Reschedule:
    with transaction.atomic():
        proposal = Reschedule.objects.select_for_update().filter(pk=pk).first()
        if proposal is None:
            raise NotFound(f"reschedule {pk} does not exist")
        if proposal.status != RescheduleStatus.PENDING:
            raise DomainError(f"reschedule {pk} is already {proposal.status}")
        proposal.status = RescheduleStatus.REJECTED
        proposal.decided_at, proposal.decided_by = now, audit.actor_label(actor)
        proposal.message = reason or "rejected by an operator"
        proposal.version += 1
        proposal.save(update_fields=["status", "decided_at", "decided_by", "message", "version"])
        audit.record(at=now, actor=actor, action="reschedule.reject", target=proposal, reason=reason)
        events.send_on_commit("reschedule-changed", reschedule=pk)
    return proposal


def do_resolve_alert(actor, pk: int, *, now: datetime, reason: str = "") -> Alert:
    with transaction.atomic():
        alert = Alert.objects.select_for_update().filter(pk=pk).first()
        if alert is None:
            raise NotFound(f"alert {pk} does not exist")
        if alert.resolved_at is not None:
            raise DomainError(f"alert {pk} was resolved at {alert.resolved_at:%Y-%m-%d %H:%M:%S}")
        alert.resolved_at = now
        alert.save(update_fields=["resolved_at"])
        audit.record(at=now, actor=actor, action="alert.resolve", target=alert, reason=reason)
        events.send_on_commit("alert-raised", alert=alert.pk)
    return alert


# -- drain as a process ----------------------------------------------------------------------------------------


def on_node_draining(node: Node, now: datetime) -> list[Reschedule]:
    """A drain with a deadline: every live instance on the node gets a move proposal (approved by the drain)."""
    proposals = []
    for inst in Instance.objects.select_related("lease", "node").filter(node=node, state__in=LIVE):
        proposal = propose(inst, now, cause="drain", note=f"drain of {node.name}")
        if proposal is not None:
            proposals.append(proposal)
    return proposals


def _in_flight(node: Node) -> int:
    """Moves off the node that are placed but not yet running elsewhere."""
    return (
        Reschedule.objects.filter(
            cause="drain", status=RescheduleStatus.APPLIED, instance__node=node, new_instance__state__in=LIVE
        )
        .exclude(new_instance__state=_I.RUNNING)
        .count()
    )


def drive_drains(now: datetime) -> None:
    """The periodic step of every drain with a deadline: apply up to max_parallel moves, stop what is left at the
    deadline (with an audit row)."""
    for node in Node.objects.filter(status=NodeStatus.DRAINING, drain_deadline__isnull=False):
        pending = Reschedule.objects.filter(
            cause="drain", status=RescheduleStatus.PENDING, instance__node=node
        )
        if now >= node.drain_deadline:
            _finish_drain(node, now, pending)
            continue
        room = node.drain_max_parallel - _in_flight(node)
        ids = list(pending.order_by("pk").values_list("pk", flat=True)[: max(room, 0)])
        if ids:
            do_approve(None, ids, now=now)


def _finish_drain(node: Node, now: datetime, pending) -> None:
    with transaction.atomic():
        left = list(Instance.objects.filter(node=node, state__in=LIVE))
        for inst in left:
            wind_down(inst, now, finished=False, reason=f"drain deadline of {node.name} passed")
        for proposal in pending:
            proposal.status = RescheduleStatus.REJECTED
            proposal.message = "drain deadline passed; the instance was stopped instead"
            proposal.decided_at, proposal.decided_by = now, "system"
            proposal.save(update_fields=["status", "message", "decided_at", "decided_by"])
        Node.objects.filter(pk=node.pk).update(drain_deadline=None)
        audit.record(
            at=now,
            actor=None,
            action="node.drain_deadline",
            target=node,
            reason=f"deadline passed; stopped {len(left)} instance(s) still on it",
            details={"stopped": [i.iid for i in left]},
        )
        events.send_on_commit("node-changed", node=node.pk)


def drain_progress(node: Node) -> dict:
    rows = Reschedule.objects.filter(cause="drain", instance__node=node).select_related(
        "instance", "new_instance"
    )
    live_left = Instance.objects.filter(node=node, state__in=LIVE).count()
    items = []
    for r in rows.order_by("pk"):
        if r.status == RescheduleStatus.PENDING:
            blocker = r.blocked_by or (
                "waiting for its turn (max_parallel)" if node.drain_deadline else "waiting for approval"
            )
        else:
            blocker = ""
        items.append(
            {
                "reschedule": r.pk,
                "instance": r.instance.iid,
                "status": r.status,
                "blocked_by": blocker,
                "message": r.message,
                "new_instance": r.new_instance.iid if r.new_instance_id else None,
            }
        )
    return {
        "node": node.name,
        "status": node.status,
        "deadline": node.drain_deadline,
        "max_parallel": node.drain_max_parallel,
        "instances_left": live_left,
        "in_flight": _in_flight(node),
        "moves": items,
    }


# -- assignments for agents ----------------------------------------------------------------------------------


def assignments(node: Node, now: datetime) -> list[dict]:
    rows = list(
        Instance.objects.select_related("lease")
        .filter(node=node, state__in=ON_NODE)
        .exclude(state=_I.LOST)
        .order_by("lease_id", "vnode")
    )
    group_rows = {}
    lease_ids = {i.lease_id for i in rows}
    for group in Group.objects.filter(leases__in=lease_ids).distinct().prefetch_related("leases"):
        members_here = list(
            Instance.objects.filter(lease__groups=group, node=node, state__in=LIVE).values_list(
                "iid", flat=True
            )
        )
        for lease in group.leases.all():
            group_rows.setdefault(lease.pk, []).append(
                {
                    "name": group.name,
                    "policy": group.policy,
                    "hard": group.hard,
                    "max_per_node": group.max_per_node,
                    "members_here": members_here,
                }
            )
    out = []
    for inst in rows:
        running = inst.desired_state == "running" and inst.state in LIVE
        groups = [
            {**g, "members_here": [m for m in g["members_here"] if m != inst.iid]}
            for g in group_rows.get(inst.lease_id, [])
        ]
        out.append(
            {
                "id": inst.iid,
                "lease": inst.lease_id,
                "vnode": inst.vnode,
                "generation": inst.generation,
                "desired_state": "running" if running else "stopped",
                "driver": inst.lease.driver,
                "spec": inst.lease.spec or {},
                "resources": inst.lease.vnodes[inst.vnode - 1],
                "groups": groups,
            }
        )
    return out
