"""A node's capacity shrinks under existing reservations (a new host baseline, a resized node): the scheduler is
reloaded with the smaller capacity, running work stays where it is, and plans that no longer fit are made again.

Pure tests of `Scheduler.restore` / `settle`, then the live path through the plan applier (docs/capacity.md).
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleet import actions as fleet_actions
from fleet import placement
from fleet.nodestate import (
    BASELINE_FLOOR_MIB,
    BASELINE_STEP_MIB,
    HOST_RESERVE_MIB,
    allocatable,
    remembered_baseline,
)
from leases import actions as lease_actions
from leases.instances.actions import nodes as node_actions
from leases.lifecycle import LeaseState
from leases.models import Lease
from leases.planning import records
from leases.scheduler import LeaseRecord, LeaseRequest, ReservationRecord, Scheduler, SchedulerConfig
from leases.slottable import Res
from slotkeeper.models import AuditEntry
from tests.leases.conftest import DECLARED_MIB
from tests.leases.invariants import overcommitted_instants

VM4 = Res(cpu=100, mem=4096)


def test_allocatable_is_declared_less_reserves_and_the_baseline_never_below_the_floor_or_zero():
    assert allocatable(8, 32768, 500, None) == (32768 - HOST_RESERVE_MIB - BASELINE_FLOOR_MIB, 480, 8)
    assert allocatable(8, 32768, 500, 6000).mem_mib == 32768 - HOST_RESERVE_MIB - 6000
    assert allocatable(8, 32768, 500, 1000).mem_mib == 32768 - HOST_RESERVE_MIB - BASELINE_FLOOR_MIB
    assert allocatable(1, 4096, 10, None) == (0, 0, 1)  # smaller than the reserves: nothing, not negative


def test_a_remembered_baseline_ignores_jitter_and_follows_a_real_change():
    assert remembered_baseline(None, 4314) == 4314
    assert remembered_baseline(4314, 4314 + BASELINE_STEP_MIB - 1) == 4314
    assert remembered_baseline(4314, 4314 - BASELINE_STEP_MIB + 1) == 4314
    assert remembered_baseline(4314, 4314 + BASELINE_STEP_MIB) == 4314 + BASELINE_STEP_MIB
    assert remembered_baseline(6000, 3000) == 3000


def record(lid: int, kind: str, state: LeaseState, start: float, end: float, node: int, status: str):
    request = LeaseRequest(
        lid, kind, 0.0, start if kind == "advance_reservation" else None, end - start, (VM4,)
    )
    vm = ReservationRecord(lid * 10, lid, "vm", start, end, {1: node}, status=status)
    return LeaseRecord(request=request, state=state, reservations=[vm])


def shrunk(mem: int) -> Scheduler:
    """Node 1 now holds only `mem`; node 2 is large and empty."""
    return Scheduler({1: Res(cpu=400, mem=mem), 2: Res(cpu=400, mem=16384)}, SchedulerConfig(), strict=True)


def test_running_work_stays_on_a_node_that_shrank_under_it_and_the_node_takes_nothing_new():
    sched = shrunk(2048)
    sched.restore(record(1, "best_effort", LeaseState.ACTIVE, 0, 1000, node=1, status="active"))
    sched.settle(10)
    assert sched.take_displaced() == []
    assert sched.leases[1].state == LeaseState.ACTIVE
    assert sched.table.used_at(1, 10).mem == 4096  # more than the node's 2048 now: flagged, never killed
    sched.submit(LeaseRequest(2, "immediate", 10, None, 100, (Res(cpu=100, mem=512),), preemptible=False), 10)
    assert set(sched.leases[2].current_vm().nodes.values()) == {2}


def test_an_unstarted_best_effort_plan_that_no_longer_fits_goes_back_to_the_queue_and_is_placed_again():
    sched = shrunk(2048)
    sched.restore(record(1, "best_effort", LeaseState.READY, 100, 1000, node=1, status="scheduled"))
    sched.settle(10)
    assert sched.take_displaced() == [(1, 1, "queued again")]
    assert sched.leases[1].state == LeaseState.QUEUED
    assert sched.leases[1].reservations[0].status == "cancelled"
    sched.advance(10)
    assert sched.leases[1].state in (LeaseState.READY, LeaseState.ACTIVE)
    assert set(sched.leases[1].current_vm().nodes.values()) == {2}


def test_an_advance_reservation_that_no_longer_fits_keeps_its_window_on_another_node():
    sched = shrunk(2048)
    sched.restore(record(1, "advance_reservation", LeaseState.READY, 500, 900, node=1, status="scheduled"))
    sched.settle(10)
    assert sched.take_displaced() == [(1, 1, "moved")]
    vm = sched.leases[1].current_vm()
    assert (vm.start, vm.end, set(vm.nodes.values())) == (500, 900, {2})
    assert sched.leases[1].state == LeaseState.READY


def test_an_advance_reservation_no_node_can_hold_any_more_fails_with_the_reason():
    sched = Scheduler({1: Res(cpu=400, mem=2048)}, SchedulerConfig())
    sched.restore(record(1, "advance_reservation", LeaseState.READY, 500, 900, node=1, status="scheduled"))
    sched.settle(10)
    assert sched.take_displaced() == [(1, 1, "failed")]
    assert sched.leases[1].state == LeaseState.FAILED
    assert "no longer fits node 1" in sched.take_isolated()[0][1]


def heartbeat(node, *, used: int, now):
    report = fleet_actions.HealthReport(
        mem_total_mib=DECLARED_MIB, mem_used_mib=used, disk_free_gib=90.0, cpu_pct=1.0, load1=0.1
    )
    return node_actions.do_heartbeat(node, report, now=now)


def test_a_baseline_that_grows_moves_a_future_reservation_off_the_node_with_the_reason_on_the_lease(fleet):
    now = timezone.now()
    spec = lease_actions.LeaseSpec(
        name="ar",
        type="advance_reservation",
        duration_s=600,
        vnodes=[{"cpu_cores": 1, "mem_mib": 8192}],
        start=now + timedelta(hours=1),
    )
    lease = lease_actions.do_submit_lease(None, spec, now=now).lease
    first = lease.reservations.get(kind="vm").nodes["1"]
    holder = next(n for n in fleet if n.pk == first)
    # The idle host now uses 6 GiB of its own: 2 GiB less allocatable than the 8 GiB VM it was promised.
    heartbeat(holder, used=BASELINE_FLOOR_MIB + 2048, now=now)
    lease_actions.advance(now + timedelta(seconds=1))
    lease.refresh_from_db()
    vm = lease.reservations.get(kind="vm", status="scheduled")
    assert vm.nodes["1"] != first
    assert lease.state == "ready"
    assert f"no longer fit {holder.name}" in lease.message
    assert AuditEntry.objects.filter(action="lease.replace", target_id=str(lease.pk)).exists()
    assert overcommitted_instants() == []
    assert records.node_capacity(placement.states_from_rows(now)[fleet.index(holder)]).mem == 8192 - 2048


def figures(client, node_id: int) -> dict:
    body = client.get(f"/api/nodes/{node_id}/").json()
    return {k: body[k] for k in ("allocatable", "committed", "free_now", "over_allocatable")}


def test_the_node_api_shows_allocatable_committed_and_free_now_and_flags_a_node_over_allocatable(
    viewer, operator, admin, fleet
):
    response = operator.post(
        "/api/leases/",
        {"name": "im", "type": "immediate", "duration_s": 600, "nodes": [{"cpu_cores": 3, "mem_mib": 6144}]},
        format="json",
    )
    assert response.status_code == 201, response.content
    lease = Lease.objects.get(pk=response.json()["id"])
    node_id = lease.reservations.get(kind="vm").nodes["1"]
    assert figures(viewer, node_id) == {
        "allocatable": {"cpu_cores": 4.0, "mem_mib": 8192, "disk_gib": 80},
        "committed": {"cpu_cores": 3.0, "mem_mib": 6144, "disk_gib": 0},
        "free_now": {"cpu_cores": 1.0, "mem_mib": 2048, "disk_gib": 80},
        "over_allocatable": False,
    }
    listed = {n["id"]: n for n in viewer.get("/api/nodes/?page_size=100").json()["results"]}
    assert listed[node_id]["committed"]["mem_mib"] == 6144
    other = next(n.pk for n in fleet if n.pk != node_id)
    assert listed[other]["committed"] == {"cpu_cores": 0.0, "mem_mib": 0, "disk_gib": 0}
    # The node is resized under its running VM: the VM keeps running, and the node is flagged.
    smaller = DECLARED_MIB - 4096
    assert admin.patch(f"/api/nodes/{node_id}/", {"mem_total_mib": smaller}, format="json").status_code == 200
    now = figures(viewer, node_id)
    assert now["allocatable"]["mem_mib"] == 4096 and now["free_now"]["mem_mib"] == -2048
    assert now["over_allocatable"] is True
    lease_actions.advance(timezone.now())
    lease.refresh_from_db()
    assert lease.state == "active"
