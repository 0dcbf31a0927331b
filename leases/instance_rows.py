"""A lease's instance rows: one per vnode while the lease is active, on the node its VM reservation names.

The plan applier (leases/planning/applying.py, `apply`) calls `sync_many` in its own transaction, so a lease's
instances always follow its reservations. Every state change goes through the pure machine in leases/lifecycle.py
(`step`): an illegal step is refused and logged, never applied. Everything else that happens to an instance (agent
reports, restarts, node loss, reschedules, drains) belongs to the instances package above (leases/instances/),
which uses these helpers; nothing here imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.db.models import Max

from leases.lifecycle import LIVE_INSTANCE_STATES, InstanceState, LeaseState, can_instance, instance_id
from leases.models import Instance, InstanceEvent
from slotkeeper import events, outbox
from slotkeeper.bulk import Row, insert_many

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
    outbox.append(
        f"instance.{target}", now, lease=inst.lease_id, instance=inst.iid, node=inst.node_id,
        data={"from": str(inst.state), "to": str(target), "reason": reason[:2000]},
    )  # fmt: skip
    inst.state = target
    inst.state_changed_at = now
    if save:
        inst.save(update_fields=["state", "state_changed_at"])
    events.send_on_commit("instance-changed", instance=inst.iid, lease=inst.lease_id)
    return True


def next_generation(lease_id: int, vnode: int) -> int:
    top = Instance.objects.filter(lease_id=lease_id, vnode=vnode).aggregate(g=Max("generation"))["g"]
    return 0 if top is None else top + 1


def placed_instance(
    lease_id: int, vnode: int, generation: int, node_id: int, now: datetime, *, replaces=None
) -> tuple[Instance, Row]:
    """A new instance placed on a node, and its first history row (an InstanceEvent as a bulk.Row, its instance
    set by the caller once the instance has its key), both unsaved: how every instance starts, whether one is
    created at a time (a lease starting) or many in one write (a bulk approval, a burst's pass)."""
    inst = Instance(**_instance_fields(lease_id, vnode, generation, node_id, now), replaces=replaces)
    return inst, Row(**_first_event(now))


def _instance_fields(lease_id: int, vnode: int, generation: int, node_id: int, now: datetime) -> dict:
    return {
        "iid": instance_id(lease_id, vnode, generation),
        "lease_id": lease_id,
        "vnode": vnode,
        "generation": generation,
        "node_id": node_id,
        "state": _I.PLACED.value,
        "desired_state": "running",
        "created_at": now,
        "state_changed_at": now,
    }


def _first_event(now: datetime) -> dict:
    return {"at": now, "from_state": _I.REQUESTED.value, "to_state": _I.PLACED.value, "reason": "placed"}


def create_instance(lease_id: int, vnode: int, node_id: int, now: datetime, *, replaces=None) -> Instance:
    inst, first = placed_instance(
        lease_id, vnode, next_generation(lease_id, vnode), node_id, now, replaces=replaces
    )
    inst.save()
    first.instance_id = inst.pk
    insert_many([first], model=InstanceEvent)
    outbox.append_many([placed_event(inst, now)])
    events.send_on_commit("instance-changed", instance=inst.iid, lease=lease_id)
    return inst


def placed_event(inst, now: datetime) -> Row:
    """The event feed's row for a new instance placed on its node (slotkeeper/outbox.py)."""
    return outbox.event(
        "instance.placed", now, lease=inst.lease_id, instance=inst.iid, node=inst.node_id,
        data={"from": _I.REQUESTED.value, "to": _I.PLACED.value, "vnode": inst.vnode, "generation": inst.generation},
    )  # fmt: skip


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


def sync_many(
    leases: list[tuple[int, LeaseState, dict[int, int] | None, list[Instance]]], now: datetime
) -> None:
    """`sync_lease_instances` for many leases (lease id, state, VM nodes, present instances) in one pass. A lease
    that starts with no instance standing for any vnode (placed for the first time, the common case in a burst)
    gets all its instances and their first history rows in two bulk INSERTs for the whole pass, not two per VM;
    every other lease takes the one-at-a-time path, which handles moves and wind-downs."""
    fresh: list[tuple[int, int, int]] = []
    for lease_id, state, vm_nodes, present in leases:
        if state == LeaseState.ACTIVE and vm_nodes and not present:
            fresh.extend((lease_id, vnode, node_id) for vnode, node_id in sorted(vm_nodes.items()))
        else:
            sync_lease_instances(lease_id, state, vm_nodes, now, present=present)
    if not fresh:
        return
    # A vnode that ran before (a lease resumed after a suspension) continues its generations.
    top = {
        (row["lease_id"], row["vnode"]): row["g"]
        for row in Instance.objects.filter(lease_id__in={lease_id for lease_id, _, _ in fresh})
        .values("lease_id", "vnode")
        .annotate(g=Max("generation"))
    }
    # Rows of what placed_instance builds, not model instances: only inserted, thousands in a burst's pass.
    created = insert_many(
        [
            Row(**_instance_fields(lease_id, vnode, top.get((lease_id, vnode), -1) + 1, node_id, now))
            for lease_id, vnode, node_id in fresh
        ],
        model=Instance,
    )
    firsts = [Row(instance_id=inst.pk, **_first_event(now)) for inst in created]
    insert_many(firsts, model=InstanceEvent)
    outbox.append_many(placed_event(inst, now) for inst in created)
    for inst in created:
        events.send_on_commit("instance-changed", instance=inst.iid, lease=inst.lease_id)


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
