"""Counter-offers (issue 48): an advance reservation that does not fit its window is answered 409 with up to three
earliest windows of the same duration where the whole lease would fit now, and the leases in the way; resubmitting
the first window succeeds. A lease no node could ever take gets none (waiting will not help)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from leases.models import Lease
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def ar(name, start, duration_s=3600, cores=4, mem=8192, count=1, **extra):
    return {
        "name": name,
        "type": "advance_reservation",
        "start": start.isoformat(),
        "duration_s": duration_s,
        "nodes": [vm(cores=cores, mem=mem)] * count,
        **extra,
    }


def test_a_reservation_that_does_not_fit_gets_three_windows_and_the_first_one_takes(operator, fleet):
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    # Four whole-node reservations fill the fleet: two over [start, start+1h), two over [start, start+2h).
    held = []
    for i, hours in enumerate((1, 1, 2, 2)):
        response = operator.post("/api/leases/", ar(f"wall-{i}", start, 3600 * hours), format="json")
        assert response.status_code == 201, response.content
        held.append(response.json()["id"])

    response = operator.post("/api/leases/", ar("late", start, 1800, count=2), format="json")
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "fleet_at_capacity"
    offers = body["alternatives"]
    assert len(offers) == 3
    starts = [parse_datetime(o["start"]) for o in offers]
    # The earliest window: when the two one-hour reservations end, on their two nodes; then the next choices,
    # each from the end of the one before.
    assert starts == [start + timedelta(hours=1), start + timedelta(hours=1.5), start + timedelta(hours=2)]
    assert all(
        parse_datetime(o["end"]) - parse_datetime(o["start"]) == timedelta(seconds=1800) for o in offers
    )
    assert len(offers[0]["nodes"]) == 2
    assert {b["id"] for b in body["blocking"]} == set(held)
    assert all(b["name"].startswith("wall-") for b in body["blocking"])

    again = operator.post("/api/leases/", ar("late-again", starts[0], 1800, count=2), format="json")
    assert again.status_code == 201, again.content
    assert again.json()["state"] == "ready"  # booked for its window


def test_a_reservation_no_node_could_ever_take_gets_no_counter_offer(operator, fleet):
    start = timezone.now() + timedelta(hours=1)
    response = operator.post("/api/leases/", ar("tpu", start, capabilities=["accel.tpu"]), format="json")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "no_capable_node"
    assert "alternatives" not in body and "blocking" not in body


def test_an_immediate_lease_gets_no_counter_offer(operator, fleet):
    for i in range(4):
        operator.post(
            "/api/leases/",
            {"name": f"im-{i}", "type": "immediate", "duration_s": 600, "nodes": [vm(cores=4, mem=8192)]},
            format="json",
        )
    response = operator.post(
        "/api/leases/",
        {"name": "one-more", "type": "immediate", "duration_s": 600, "nodes": [vm(cores=4, mem=8192)]},
        format="json",
    )
    assert response.status_code == 409
    assert "alternatives" not in response.json()
    assert Lease.objects.filter(state="rejected").count() == 1


def test_a_what_if_for_a_full_window_offers_the_same_windows(operator, fleet):
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    for i in range(4):
        assert operator.post("/api/leases/", ar(f"wall-{i}", start), format="json").status_code == 201
    body = {"count": 1, "cpu_cores": 4, "mem_mib": 8192, "start": start.isoformat(), "duration_s": 1800}
    response = operator.post("/api/placement/preview", body, format="json")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["outcome"] == "fleet_at_capacity"
    assert [parse_datetime(o["start"]) for o in answer["alternatives"]] == [
        start + timedelta(hours=1),
        start + timedelta(hours=1.5),
        start + timedelta(hours=2),
    ]
    assert len(answer["blocking"]) == 4
    # The first offer, asked again, is placed.
    again = operator.post(
        "/api/placement/preview", {**body, "start": answer["alternatives"][0]["start"]}, format="json"
    )
    assert again.json()["outcome"] == "placed" and "alternatives" not in again.json()


def test_a_lease_arrays_rejected_reservations_get_the_single_requests_offers(operator, fleet, monkeypatch):
    from leases.api import views

    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    walls = [ar(f"wall-{i}", start, 3600 * hours) for i, hours in enumerate((1, 1, 2, 2))]
    late = ar("late", start, 1800, count=2)
    monkeypatch.setattr(views, "BATCH_OFFERS", 2)  # the third rejected reservation gets none: the bound holds
    body = {"leases": [*walls, late, {**late, "name": "late-2"}, {**late, "name": "late-3"}]}
    response = operator.post("/api/leases/batch", body, format="json")
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 201, 201, 201, 409, 409, 409]
    first, second, third = results[4:]
    starts = [parse_datetime(o["start"]) for o in first["alternatives"]]
    assert starts == [start + timedelta(hours=1), start + timedelta(hours=1.5), start + timedelta(hours=2)]
    assert {b["id"] for b in first["blocking"]} == {r["id"] for r in results[:4]}
    assert second["alternatives"] == first["alternatives"], "each is asked as if it came alone"
    assert "alternatives" not in third and third["code"] == "fleet_at_capacity"
    again = operator.post("/api/leases/", ar("late-again", starts[0], 1800, count=2), format="json")
    assert again.status_code == 201, again.content


def test_a_counter_offer_keeps_the_group_away_from_room_held_for_a_lost_member(operator, fleet):
    """Counter-offers read a group's members as a submission reads them, held room included: they read only the
    running members, and offered a window on the node where a lost member's room is held, which the resubmission
    is then refused (the group's rule holds for held room as for placed room)."""
    from leases.instances.actions import nodes as node_actions
    from leases.instances.models import Reschedule
    from leases.models import Instance

    assert (
        operator.post("/api/groups/", {"name": "web", "policy": "anti_affinity"}, format="json").status_code
        == 201
    )
    member = {"name": "member", "type": "immediate", "duration_s": 36000, "nodes": [vm(cores=1, mem=512)],
              "groups": ["web"]}  # fmt: skip
    response = operator.post("/api/leases/", member, format="json")
    assert response.status_code == 201, response.content
    lost = Instance.objects.get(lease_id=response.json()["id"])
    node_actions.do_declare_dead(None, lost.node_id, reason="rack power", now=timezone.now())
    held_on = Reschedule.objects.get(status="pending").proposed_node
    assert held_on is not None
    others = [n for n in fleet if n.pk not in (lost.node_id, held_on.pk)]
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    for i, _ in enumerate(others):  # the two other live nodes are taken whole for an hour
        assert operator.post("/api/leases/", ar(f"wall-{i}", start), format="json").status_code == 201

    response = operator.post(
        "/api/leases/", ar("web-2", start, 1800, cores=2, mem=4096, groups=["web"]), format="json"
    )
    assert response.status_code == 409, response.content
    offers = response.json()["alternatives"]
    assert offers, response.json()
    assert all(held_on.name not in o["nodes"] for o in offers), (held_on.name, offers)
    assert parse_datetime(offers[0]["start"]) == start + timedelta(hours=1)
    taken = operator.post("/api/leases/", ar("web-2b", parse_datetime(offers[0]["start"]), 1800, cores=2,
                                             mem=4096, groups=["web"]), format="json")  # fmt: skip
    assert taken.status_code == 201, taken.content
