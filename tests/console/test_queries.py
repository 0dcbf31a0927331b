"""Query counts pinned for the two pages that grow with the fleet: the board and the slot table must cost the same
handful of queries at 200 nodes × 24 h as at three nodes (an N+1 here turned a page into 2,000 round trips)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.models import Node, NodeStatus
from leases.models import Allocation, Lease, Reservation

NODES = 200
LEASES = 1500  # two allocations each: 3,000 allocations over the 24 h window


@pytest.fixture
def big_fleet(db):
    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(
            name=f"node-{i:03d}",
            cpu_cores=32,
            mem_total_mib=131072,
            disk_total_gib=1000,
            status=NodeStatus.DRAINING if i % 50 == 0 else NodeStatus.ONLINE,
            drain_reason="disk swap" if i % 50 == 0 else "",
            last_heartbeat_at=now,
            obs_mem_total_mib=131072,
            obs_mem_used_mib=20000,
            token_digest=f"{i:064d}",
        )
        for i in range(NODES)
    )
    leases = Lease.objects.bulk_create(
        Lease(
            name=f"job-{i}",
            type="best_effort",
            state="active",
            submitted_at=now,
            duration_s=3600,
            vnodes=[{"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 0}] * 2,
        )
        for i in range(LEASES)
    )
    reservations = []
    for i, lease in enumerate(leases):
        start = now - timedelta(hours=4) + timedelta(minutes=(i * 7) % (24 * 60))
        a, b = nodes[i % NODES], nodes[(i * 7 + 1) % NODES]
        reservations.append(
            Reservation(
                rid=i + 1,
                lease=lease,
                kind="vm",
                start=start,
                end=start + timedelta(hours=1),
                status="active" if start <= now else "scheduled",
                nodes={"1": a.pk, "2": b.pk},
            )
        )
    reservations = Reservation.objects.bulk_create(reservations)
    Allocation.objects.bulk_create(
        Allocation(reservation=r, node_id=node_id, start=r.start, end=r.end, cpu=100, mem_mib=1024)
        for r in reservations
        for node_id in r.nodes.values()
    )
    return nodes


@pytest.mark.parametrize("htmx", [False, True])
@pytest.mark.parametrize("query", [{}, {"per": "200"}, {"sort": "-committed", "q": "node-1"}])
def test_the_fleet_board_at_200_nodes_takes_at_most_10_queries(
    vera, big_fleet, django_assert_max_num_queries, htmx, query
):
    headers = {"HX-Request": "true"} if htmx else {}
    with django_assert_max_num_queries(10):
        response = vera.get(reverse("fleet-board"), query, headers=headers)
    # A page of rows: 100 unless the URL says otherwise (node-1xx are 100 of the 200).
    assert response.content.decode().count("data-node=") == int(query.get("per", 100))
    assert 'data-total="all">all 200<' in response.content.decode()


def test_a_live_patch_of_the_board_at_200_nodes_takes_at_most_10_queries(
    vera, big_fleet, django_assert_max_num_queries
):
    with django_assert_max_num_queries(10):
        response = vera.get(reverse("fleet-board-patch"), {"have": "", "sv": "", "pv": ""})
    assert response.content.decode().count("data-node=") == 100


@pytest.mark.parametrize("htmx", [False, True])
def test_the_slot_table_at_200_nodes_by_24_hours_takes_at_most_10_queries(
    vera, big_fleet, django_assert_max_num_queries, htmx
):
    # The page shows the first page of rows; a live refresh re-renders every page the browser loaded (here all
    # four, all 200 rows): the same handful of queries either way.
    headers = {"HX-Request": "true"} if htmx else {}
    params = {"zoom": "24h", **({"pages": "4"} if htmx else {})}
    with django_assert_max_num_queries(10):
        response = vera.get(reverse("slot-table"), params, headers=headers)
    body = response.content.decode()
    rows = NODES if htmx else 50
    assert body.count('<g class="row') == rows
    if htmx:
        assert body.count('class="bar-link"') > 2000, "the window must really hold thousands of bars"


def test_a_row_page_of_the_slot_table_at_200_nodes_takes_at_most_10_queries(
    vera, big_fleet, django_assert_max_num_queries
):
    with django_assert_max_num_queries(10):
        response = vera.get(
            reverse("slot-rows"), {"zoom": "24h", "page": "3"}, headers={"HX-Request": "true"}
        )
    body = response.content.decode()
    assert body.count('<g class="row') == 50
    assert 'id="slot-page-3"' in body and "slot-more" not in body, "the last page says no more follow"


@pytest.mark.parametrize("htmx", [False, True])
@pytest.mark.parametrize("query", [{}, {"page": "8"}, {"state": "active", "page": "15"}, {"page": "99"}])
def test_the_lease_list_at_1500_leases_takes_at_most_10_queries(
    vera, big_fleet, django_assert_max_num_queries, htmx, query
):
    # A page of 100 leases and one COUNT, whichever page (it showed the newest 200 of any number, and no pager).
    headers = {"HX-Request": "true"} if htmx else {}
    with django_assert_max_num_queries(10):
        response = vera.get(reverse("lease-list"), query, headers=headers)
    body = response.content.decode()
    assert body.count("<tr data-lease=") == (0 if query.get("page") == "99" else 100)
    assert "of 1500" in body or "There is no page 99: 1500 leases" in body
