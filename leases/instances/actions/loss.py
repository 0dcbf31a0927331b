"""Node loss: every live instance on a node declared dead is lost, and each is held, failed, or proposed for a
reschedule under the lease's reschedule policy (leases/instances/rules.py). Runs inside the transaction that
declared the nodes dead (leases/instances/actions/nodes.py composes the two), after the plan lock and the node row.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from fleet.models import Node
from leases.alerts import raise_alert
from leases.instance_rows import LIVE, step
from leases.instances.actions.reschedules import propose
from leases.instances.models import Reschedule, RescheduleStatus
from leases.instances.placing import FleetView
from leases.instances.rules import ReschedulePolicy, decide_on_loss
from leases.lifecycle import InstanceState
from leases.models import Instance
from leases.planning.passes import planning
from leases.planning.plan import Planning

_I = InstanceState


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
    # Every instance is lost first, then each is decided: the proposals' dry runs then see the dead nodes' group
    # members as gone, and share one view of the fleet that counts the proposals made before each (a burst of
    # proposals to the one node that can take only one of them was approved into a full node).
    lost = [
        inst
        for inst in Instance.objects.select_related("lease", "node")
        .prefetch_related("lease__groups")
        .filter(node_id__in=list(node_ids), state__in=LIVE)
        .order_by("id")
        if step(inst, _I.LOST, now, f"node {inst.node.name} died: {reason}".rstrip(": "))
    ]
    if not lost:
        return proposals
    # One planning pass for every decision of this loss: the proposals' holds are written into the slot table as
    # they are made, so each counts the ones before it, and a failed instance's room is freed at once.
    with planning(now) as plan:
        fleet = FleetView.for_proposals(now, plan.nodes)
        for inst in lost:
            proposal = _decide(plan, inst, now, fleet)
            if proposal is not None:
                proposals.append(proposal)
        if plan.make_way:
            plan.scheduler.run_queue(plan.t)  # the leases that made way, planned again after the holds
    return proposals


def _decide(plan: Planning, inst: Instance, now: datetime, fleet: FleetView) -> Reschedule | None:
    """What becomes of one lost instance under its lease's reschedule policy: held on its node until it returns,
    failed (its room freed), or proposed for a move (its new room held)."""
    lease = inst.lease
    decision = decide_on_loss(
        ReschedulePolicy(max_reschedules=lease.max_reschedules, auto_approve=lease.auto_approve_reschedules),
        migratable=lease.migratable,
        capabilities=lease.capabilities,
        reschedules_so_far=reschedules_so_far(lease.pk, inst.vnode),
    )
    if decision.action == "hold":
        raise_alert("instance_held", f"instance {inst.iid} is held: {decision.reason}", now, instance=inst)
        return None
    if decision.action == "fail":
        step(inst, _I.FAILED, now, decision.reason)
        plan.scheduler.detach(inst.lease_id, inst.vnode, inst.node_id, plan.t)
        raise_alert(
            "reschedule_budget_spent",
            f"instance {inst.iid} failed: {decision.reason}",
            now,
            instance=inst,
        )
        return None
    return propose(plan, inst, now, cause="node_dead", note=decision.reason, fleet=fleet)
