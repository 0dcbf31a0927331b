"""The node list's filters (fleet/filters.py, with the sort by committed capacity one layer up): the API's node list
and the fleet board share them, so a status, a search or a sort means the same in both, and a bad one is a 400 that
names it in both."""

from __future__ import annotations

import pytest

from fleet.models import Node, NodeStatus


@pytest.fixture
def three(register_node):
    tank, _ = register_node(name="tank", capabilities=["gpu"])
    architect, _ = register_node(name="architect")
    morpheus, _ = register_node(name="morpheus")
    Node.objects.filter(pk=morpheus.pk).update(status=NodeStatus.DEAD)
    return tank, architect, morpheus


def listed(viewer, **query) -> list[str]:
    response = viewer.get("/api/nodes/", query)
    assert response.status_code == 200, response.content
    return [n["name"] for n in response.json()["results"]]


def test_the_api_lists_by_status_search_and_sort_as_the_board_does(viewer, three):
    assert listed(viewer) == ["architect", "morpheus", "tank"]
    assert listed(viewer, sort="-name") == ["tank", "morpheus", "architect"]
    assert listed(viewer, status="dead") == ["morpheus"]
    assert listed(viewer, status="offline,dead") == ["architect", "morpheus", "tank"]
    # A search finds a capability as the board's does, not only a name.
    assert listed(viewer, q="GPU") == ["tank"]
    assert listed(viewer, q="ARCH") == ["architect"]
    assert listed(viewer, sort="-status") == ["morpheus", "architect", "tank"]


def test_the_api_sorts_by_what_the_slot_table_holds_now(viewer, three):
    from datetime import timedelta

    from django.utils import timezone

    from leases.models import Allocation, Lease, Reservation

    now = timezone.now()
    architect = three[1]
    lease = Lease.objects.create(name="r", type="immediate", state="active", submitted_at=now, duration_s=3600,
                                 vnodes=[{"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 0}])  # fmt: skip
    res = Reservation.objects.create(rid=1, lease=lease, kind="vm", start=now - timedelta(minutes=1),
                                     end=now + timedelta(hours=1), status="active", nodes={"1": architect.pk})  # fmt: skip
    Allocation.objects.create(
        reservation=res, node=architect, start=res.start, end=res.end, cpu=100, mem_mib=1024
    )
    assert listed(viewer, sort="-committed")[0] == "architect"


@pytest.mark.parametrize(
    ("query", "field", "said"),
    [
        ({"status": "busy"}, "status", '"busy" is not a status'),
        ({"sort": "price"}, "sort", 'Cannot sort by "price"'),
        ({"q": "x" * 101}, "q", "at most 100 characters"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it_not_an_empty_list(viewer, three, query, field, said):
    response = viewer.get("/api/nodes/", query)
    assert response.status_code == 400
    assert said in response.json()[field][0]


def test_filters_do_not_narrow_a_single_node(viewer, three):
    # The filters are the list's: a node is found by its id whatever else the query says.
    assert viewer.get(f"/api/nodes/{three[2].pk}/", {"status": "online"}).status_code == 200


def test_a_status_repeated_lists_every_one_as_a_comma_list_does(viewer, three):
    """`?status=online&status=dead` read the last value alone."""
    assert listed(viewer, status=["offline", "dead"]) == listed(viewer, status="offline,dead")
    assert listed(viewer, status=["dead"]) == ["morpheus"]
    assert viewer.get("/api/nodes/", {"status": ["dead", "asleep"]}).status_code == 400
