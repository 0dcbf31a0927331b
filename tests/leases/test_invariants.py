"""The overcommit invariant itself (tests/leases/invariants.py): a group commit starts many reservations at one
instant, and the query must count each allocation once there, or every batched test fails on a correct plan."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from leases.models import Allocation, Lease, Reservation
from tests.leases.invariants import overcommitted_instants


def allocate(node, start, rid: int, cores: int, mem: int) -> None:
    lease = Lease.objects.create(
        name=f"l{rid}", type="best_effort", state="active", submitted_at=start, duration_s=3600, vnodes=[]
    )
    end = start + timedelta(hours=1)
    r = Reservation.objects.create(
        rid=rid, lease=lease, kind="vm", start=start, end=end, status="active", nodes={"0": node.pk}
    )
    Allocation.objects.create(reservation=r, node=node, start=start, end=end, cpu=cores * 100, mem_mib=mem)


def test_allocations_that_start_together_and_fill_a_node_exactly_are_not_an_overcommit(fleet):
    # n1 has 4 cores and 8 GiB allocatable. Two allocations starting at one instant fill it exactly; joining each
    # to the other summed both twice (8 cores, 16 GiB) and reported this instant overcommitted.
    now = timezone.now()
    allocate(fleet[0], now, 1, cores=2, mem=4096)
    allocate(fleet[0], now, 2, cores=2, mem=4096)
    assert overcommitted_instants() == []


def test_a_third_allocation_at_that_instant_is_an_overcommit(fleet):
    now = timezone.now()
    for rid in (1, 2, 3):
        allocate(fleet[0], now, rid, cores=2, mem=2048)
    rows = overcommitted_instants()
    assert len(rows) == 1
    node_id, _, cpu, mem, cap_cpu, _ = rows[0]
    assert (node_id, cpu, mem, cap_cpu) == (fleet[0].pk, 600, 6144, 400)
