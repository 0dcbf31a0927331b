"""A drain with a deadline as a process: its instances are proposed for moves when it starts, the periodic step
applies at most `max_parallel` at a time, and whatever is left at the deadline is stopped (with an audit row).
The drain itself (the node's status) is fleet's; leases/instances/actions/nodes.py composes the two.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from fleet.models import Node, NodeStatus
from leases.instance_rows import LIVE, wind_down
from leases.instances.actions.reschedules import do_approve, propose
from leases.instances.models import Reschedule, RescheduleStatus
from leases.instances.placing import FleetView
from leases.instances.reads import in_flight
from leases.models import Instance
from leases.planning.passes import planning
from slotkeeper import audit, events


def propose_moves(node: Node, now: datetime) -> list[Reschedule]:
    """A drain with a deadline: every live instance on the node gets a move proposal (approved by the drain), its
    room on the target held, all in one planning pass (each counts the holds of the ones before it)."""
    proposals = []
    insts = list(
        Instance.objects.select_related("lease", "node")
        .prefetch_related("lease__groups")
        .filter(node=node, state__in=LIVE)
        .order_by("id")
    )
    if not insts:
        return proposals
    with planning(now) as plan:
        fleet = FleetView.for_proposals(now, plan.nodes)
        for inst in insts:
            proposal = propose(plan, inst, now, cause="drain", note=f"drain of {node.name}:", fleet=fleet)
            if proposal is not None:
                proposals.append(proposal)
        if plan.make_way:
            plan.scheduler.run_queue(plan.t)  # the leases that made way, planned again after the holds
    return proposals


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
        room = node.drain_max_parallel - in_flight(node)
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
