"""Reads of the instances package, apart from its writes: the placer's claims, what a node's agent should run,
and a drain's progress. The layers above call these and hand the results down as plain values (the placer
takes claims, the agent API answers with assignments); nothing below calls up into them.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from fleet.capacity import Claim
from fleet.models import Node
from leases import vnodes
from leases.instance_rows import LIVE, ON_NODE
from leases.instances.models import Reschedule, RescheduleStatus
from leases.lifecycle import InstanceState
from leases.models import Group, Instance

_I = InstanceState
Claims = dict[int, tuple[tuple[Claim, ...], tuple[Claim, ...]]]


def claims(node_ids: Collection[int] | None = None) -> Claims:
    """Commitments for the placer, by identity, per node: an instance the agent runs is running; one placed but
    not yet started is pending (seed 001: the two are unioned by id, so a booted instance is never counted
    twice). Every node when `node_ids` is None."""
    out: dict[int, tuple[list[Claim], list[Claim]]] = {}
    rows = Instance.objects.filter(state__in=LIVE)
    if node_ids is not None:
        rows = rows.filter(node_id__in=list(node_ids))
    for iid, node_id, vnode, state, specs in rows.values_list(
        "iid", "node_id", "vnode", "state", "lease__vnodes"
    ):
        running, pending = out.setdefault(node_id, ([], []))
        (running if state == "running" else pending).append(vnodes.as_claim(iid, specs[vnode - 1]))
    return {k: (tuple(r), tuple(p)) for k, (r, p) in out.items()}


def placed_ids(node: Node) -> set[str]:
    """The instances the server has placed on the node and not yet seen gone."""
    return set(Instance.objects.filter(node=node, state__in=LIVE).values_list("iid", flat=True))


def assignments_for(node: Node, now: datetime) -> dict:
    """What a node's agent should be running: its instances, each with its desired state and generation."""
    return {"node": node.pk, "status": node.status, "instances": assignments(node, now)}


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


def in_flight(node: Node) -> int:
    """Moves off the node that are placed but not yet running elsewhere."""
    return (
        Reschedule.objects.filter(
            cause="drain", status=RescheduleStatus.APPLIED, instance__node=node, new_instance__state__in=LIVE
        )
        .exclude(new_instance__state=_I.RUNNING)
        .count()
    )


def drain_progress(node: Node) -> dict:
    """What a drain is doing, in one consistent set of words from its first second: each move's phase (room held
    on its target and waiting its turn, no room yet, moving, moved, not moved) and the counts of each, so that the
    figures and the rows never contradict each other (the list said "0 in flight" while every row said placed)."""
    rows = Reschedule.objects.filter(cause="drain", instance__node=node).select_related(
        "instance", "new_instance__node", "proposed_node"
    )
    live_left = Instance.objects.filter(node=node, state__in=LIVE).count()
    items = []
    counts = {"waiting": 0, "blocked": 0, "moving": 0, "moved": 0, "not_moved": 0}
    for r in rows.order_by("pk"):
        target = r.proposed_node.name if r.proposed_node_id else None
        blocker = ""
        if r.status == RescheduleStatus.PENDING and target:
            phase, said = (
                "waiting",
                f"room held on {target}; "
                + ("waiting for its turn (max_parallel)" if node.drain_deadline else "waiting for approval"),
            )
        elif r.status == RescheduleStatus.PENDING:
            phase, blocker = "blocked", r.blocked_by or "fleet_at_capacity"
            said = "no room on any node yet; tried again as room frees"
        elif (
            r.status == RescheduleStatus.APPLIED and r.new_instance_id and r.new_instance.state == _I.RUNNING
        ):
            phase, said = (
                "moved",
                f"moved: running on {r.new_instance.node.name}" if r.new_instance.node_id else "moved",
            )
        elif r.status == RescheduleStatus.APPLIED and r.new_instance_id and r.new_instance.state in LIVE:
            phase, said = "moving", "moving: placed on its new node, not running there yet"
        elif r.status == RescheduleStatus.APPLIED:
            phase, said = "moved", "moved"
        else:
            phase, said = "not_moved", f"not moved: {r.message}" if r.message else "not moved"
        counts[phase] += 1
        items.append(
            {
                "reschedule": r.pk,
                "instance": r.instance.iid,
                "status": r.status,
                "phase": phase,
                "said": said,
                "target": target,
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
        "in_flight": counts["moving"],
        "counts": counts,
        "moves": items,
    }
