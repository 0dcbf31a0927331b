"""The leases API: submit each type, read, cancel, the slot-table window; roles and bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Count
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.models import Node
from leases.api import serializers as s
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic
from leases.lifecycle import LeaseState
from leases.models import Allocation, Lease, Reservation
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def submit(client, **body):
    payload = {"name": "job", "type": "best_effort", "duration_s": 3600, "nodes": [vm()], **body}
    return client.post("/api/leases/", payload, format="json")


def test_a_best_effort_lease_starts_now_when_there_is_room(operator, fleet):
    response = submit(operator)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "active"
    assert [r["kind"] for r in body["reservations"]] == ["vm"]
    assert [h["to_state"] for h in body["history"]][:1] == ["pending"]
    assert body["placement_reports"][0]["outcome"] == "placed"


def test_an_advance_reservation_gets_its_exact_window(operator, fleet):
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    response = submit(
        operator, type="advance_reservation", start=start.isoformat(), duration_s=1800, nodes=[vm()] * 4
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "ready"  # scheduled, and nothing to prepare (Haizea: SCHEDULED → READY at once)
    vms = [r for r in body["reservations"] if r["kind"] == "vm"]
    assert vms[0]["start"].startswith(start.strftime("%Y-%m-%dT%H:%M:%S"))
    assert len(vms[0]["node_ids"]) >= 1
    assert Allocation.objects.filter(reservation__lease_id=body["id"], live=True).exists()


def test_an_immediate_lease_that_cannot_run_now_is_409_with_every_nodes_verdict(operator, fleet):
    # Fill every node's memory for the next hour, then ask for an immediate lease.
    assert submit(operator, type="immediate", nodes=[vm(mem=8192)] * 4).status_code == 201
    response = submit(operator, type="immediate", nodes=[vm(mem=4096)])
    assert response.status_code == 409
    body = response.json()
    assert Lease.objects.get(pk=body["lease"]).state == "rejected"
    assert {v["node"] for v in body["verdicts"]} == {"n1", "n2", "n3", "n4"}
    assert all(not v["fit"] and v["reason"] for v in body["verdicts"])


def test_an_advance_reservation_on_a_draining_node_is_not_placed_there(operator, fleet):
    operator.post(f"/api/nodes/{fleet[0].pk}/drain", {"reason": "maintenance"}, format="json")
    start = (timezone.now() + timedelta(hours=1)).isoformat()
    response = submit(operator, type="advance_reservation", start=start, nodes=[vm(mem=8192)] * 4)
    assert response.status_code == 409
    verdict = next(v for v in response.json()["verdicts"] if v["node"] == "n1")
    assert "draining" in (verdict["reason_code"] or "") + (verdict["reason"] or "")


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("start", {"type": "advance_reservation", "start": "2001-01-01T00:00:00Z"}),
        ("start", {"type": "advance_reservation"}),
        ("start", {"type": "best_effort", "start": "2099-01-01T00:00:00Z"}),
        ("duration_s", {"duration_s": 0}),
        ("duration_s", {"duration_s": -5}),
        ("nodes", {"nodes": []}),
        ("nodes", {"nodes": [{"cpu_cores": 1, "mem_mib": 999999}]}),
        ("type", {"type": "urgent"}),
        ("name", {"name": ""}),
    ],
)
def test_bad_requests_are_400_naming_the_field_and_store_nothing(operator, fleet, field, body):
    response = submit(operator, **body)
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Lease.objects.exists()


def test_a_too_large_vm_names_the_largest_node(operator, fleet):
    response = submit(operator, nodes=[vm(), vm(mem=10_000)])
    assert response.status_code == 400
    assert "largest node (n1, 8192 MiB allocatable)" in response.json()["nodes"]["1"]


def test_a_plain_request_is_checked_without_building_its_serializer_and_a_refusal_is_worded_by_it(
    operator, fleet, monkeypatch
):
    """leases/request_rules.py decides the plain shape; the serializer only words what is refused (here by the
    fleet: a VM larger than every node, a group that does not exist) or what that shape leaves undecided."""
    built = []
    init = s.LeaseCreateSerializer.__init__

    def counting(self, *args, **kwargs):
        built.append(kwargs.get("data"))
        init(self, *args, **kwargs)

    monkeypatch.setattr(s.LeaseCreateSerializer, "__init__", counting)
    start = (timezone.now() + timedelta(hours=3)).isoformat()
    assert submit(operator).status_code == 201
    assert submit(operator, type="advance_reservation", start=start, capabilities=[]).status_code == 201
    assert built == []
    response = submit(operator, nodes=[vm(), vm(mem=10_000)])
    assert response.status_code == 400
    assert response.json() == {
        "nodes": {"1": "mem_mib 10000 exceeds the largest node (n1, 8192 MiB allocatable)"}
    }
    response = submit(operator, groups=["nowhere"])
    assert response.status_code == 400 and response.json() == {"groups": ["Unknown group(s): nowhere."]}
    assert submit(operator, restart_policy={"max_restarts": 2}).status_code == 201  # not the plain shape
    assert len(built) == 3
    assert Lease.objects.count() == 3


def test_a_dead_nodes_size_does_not_count_and_a_live_one_does_at_once(operator, fleet, register_node):
    """The size check reads the live fleet's shapes every request (a compiled statement, no cache): a node
    registered counts at the next request, a dead one no longer does."""
    assert submit(operator, nodes=[vm(mem=20_000)]).status_code == 400
    big, _ = register_node(name="big", mem_total_mib=40_000, cpu_cores=8)
    assert submit(operator, nodes=[vm(mem=20_000)]).status_code == 201
    Node.objects.filter(pk=big.pk).update(status="dead")
    response = submit(operator, nodes=[vm(mem=20_000)])
    assert response.status_code == 400 and "largest node (n1," in response.json()["nodes"]["0"]


def test_viewers_read_but_cannot_submit_or_cancel(viewer, operator, fleet):
    assert submit(viewer).status_code == 403
    lease_id = submit(operator).json()["id"]
    assert viewer.get(f"/api/leases/{lease_id}/").status_code == 200
    assert viewer.post(f"/api/leases/{lease_id}/cancel", {}, format="json").status_code == 403


def test_cancel_ends_a_lease_and_a_second_cancel_is_a_conflict(operator, fleet):
    lease_id = submit(operator).json()["id"]
    response = operator.post(f"/api/leases/{lease_id}/cancel", {"reason": "no longer needed"}, format="json")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert not Allocation.objects.filter(
        reservation__lease_id=lease_id, live=True, end__gt=timezone.now()
    ).exists()
    again = operator.post(f"/api/leases/{lease_id}/cancel", {}, format="json")
    assert again.status_code == 409


def test_a_cancelled_lease_says_so_and_why_instead_of_where_it_runs(operator, fleet):
    # Found by an outsider: the lease's page went on saying "lease 16 runs ... on gpu-01" after its cancel.
    body = submit(operator).json()
    assert " on n" in body["message"]
    response = operator.post(
        f"/api/leases/{body['id']}/cancel", {"reason": "no longer needed"}, format="json"
    )
    message = response.json()["message"]
    assert message.startswith(f"lease {body['id']} cancelled at ") and message.endswith(
        " by otto: no longer needed"
    )
    assert Lease.objects.get(pk=body["id"]).message == message
    # The history's "why" (the lease page's column, the API's history): each decision on the step it ended in.
    history = operator.get(f"/api/leases/{body['id']}/").json()["history"]
    assert history[-1]["to_state"] == "cancelled" and history[-1]["message"] == message
    assert history[-2]["message"] == body["message"]  # the step the placement ended in: where it runs


def test_unknown_leases_are_404(viewer, operator):
    assert viewer.get("/api/leases/999/").status_code == 404
    assert operator.post("/api/leases/999/cancel", {}, format="json").status_code == 404


def test_the_slot_window_lists_reservations_overlapping_it(viewer, operator, fleet):
    lease_id = submit(operator, duration_s=600).json()["id"]
    now = timezone.now()
    response = viewer.get(
        "/api/slots/",
        {"start": (now - timedelta(minutes=5)).isoformat(), "end": (now + timedelta(minutes=5)).isoformat()},
    )
    assert response.status_code == 200
    assert [r["lease"] for r in response.json()["reservations"]] == [lease_id]
    later = viewer.get("/api/slots/", {"start": (now + timedelta(hours=2)).isoformat()})
    assert later.json()["reservations"] == []
    assert (
        viewer.get(
            "/api/slots/", {"start": now.isoformat(), "end": (now - timedelta(hours=1)).isoformat()}
        ).status_code
        == 400
    )
    assert viewer.get("/api/slots/", {"start": "yesterday"}).status_code == 400


def test_a_queued_lease_starts_when_the_blocking_one_ends(operator, fleet):

    first = submit(operator, type="immediate", duration_s=600, nodes=[vm(mem=8192)] * 4).json()
    second = submit(operator, duration_s=600, nodes=[vm(mem=8192)]).json()
    # Aggressive backfilling gives the first queued lease a future reservation right after the blocker.
    assert second["state"] == "ready"
    later = timezone.now() + timedelta(seconds=601)
    for node in fleet:
        node_actions.do_heartbeat(node, fleet_actions.HealthReport(8192, 1000, 90.0, 1.0, 0.1), now=later)
    periodic.tick(later)
    assert Lease.objects.get(pk=first["id"]).state == "done"
    assert Lease.objects.get(pk=second["id"]).state == "active"
    assert Reservation.objects.filter(lease_id=second["id"], status="active").count() == 1


def test_a_future_reservation_on_a_node_that_became_unusable_is_re_placed_when_it_comes_due(operator, fleet):
    from slotkeeper.models import AuditEntry

    blocker = submit(operator, type="immediate", duration_s=600, nodes=[vm(mem=8192)] * 4).json()
    waiting = submit(operator, duration_s=600, nodes=[vm(mem=8192)]).json()
    assert waiting["state"] == "ready"  # a future reservation right after the blocker
    [future] = [r for r in waiting["reservations"] if r["kind"] == "vm"]
    [planned_node] = future["node_ids"]
    later = timezone.now() + timedelta(seconds=601)
    for node in fleet:
        node_actions.do_heartbeat(node, fleet_actions.HealthReport(8192, 1000, 90.0, 1.0, 0.1), now=later)
    node_actions.do_drain(None, planned_node, reason="disk failing", now=later)
    periodic.tick(later)
    lease = Lease.objects.get(pk=waiting["id"])
    assert lease.state == "active"
    [running] = Reservation.objects.filter(lease=lease, status="active")
    assert planned_node not in running.nodes.values()
    assert "node 1 draining" in lease.message or f"node {planned_node} draining" in lease.message
    assert AuditEntry.objects.filter(action="lease.replace", target_id=str(lease.pk)).exists()
    assert Lease.objects.get(pk=blocker["id"]).state == "done"


def test_the_overcommit_query_counts_allocations_that_start_together_once(operator, fleet):
    from tests.leases.invariants import overcommitted_instants

    # Three reservations starting at one instant put three allocations on one node (6 GiB of 8): legal, but the old
    # self-join summed the node's use three times over and reported it as overcommitted.
    for node in fleet[1:]:  # one usable node, so all three land on it
        node_actions.do_drain(None, node.pk, reason="test", now=timezone.now())
    start = (timezone.now() + timedelta(hours=1)).isoformat()
    for _ in range(3):
        response = submit(operator, type="advance_reservation", start=start, nodes=[vm(cores=1, mem=2048)])
        assert response.status_code == 201
    per_node = Allocation.objects.filter(live=True).values("node_id").annotate(n=Count("id"))
    assert max(row["n"] for row in per_node) == 3
    assert overcommitted_instants() == []


# Hostile input the outside tester's schemathesis run found: each was a 500 or was accepted as nonsense. Every one
# must be a 400 naming the field, with nothing stored.
@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("nodes", {"nodes": [{"mem_mib": 1024, "gpus": 8}]}),  # "gpus" vanished and the lease ran without
        ("gpus", {"gpus": 8}),
        ("preemptible", {"preemptible": "yes"}),
        ("migratable", {"migratable": 1}),
        ("auto_approve_reschedules", {"auto_approve_reschedules": "true"}),
        ("restart_policy", {"restart_policy": {"retries": 3}}),
        ("spec", {"spec": {"env": {"BLOB": "x" * 5000}}}),
        ("spec", {"spec": {"env": {f"V{i}": "x" for i in range(201)}}}),
        ("spec", {"spec": {"env": {"NOT A NAME": "x"}}}),
        ("spec", {"spec": {"cwd": "/" + "x" * 5000}}),
        ("spec", {"spec": {"sim": {"blob": "x" * 5000}}}),
        ("spec", {"spec": {"sim": {"key\u0000": 1}}}),  # jsonb refuses NUL: a 500 on PostgreSQL
        ("spec", {"spec": {"gpus": 1}}),
        (
            "start",
            {"type": "advance_reservation", "start": "9999-12-31T00:00:00Z"},
        ),  # end past year 9999: 500
        ("start", {"type": "advance_reservation", "start": "2999-01-01T00:00:00Z"}),
        ("real_duration_s", {"real_duration_s": 1e308}),
        # Accepted and shown reversed on the console (a right-to-left override), or a name over two lines.
        ("name", {"name": "\u202eevil"}),
        ("name", {"name": "job\u2066x\u2069"}),
        ("name", {"name": "two\nlines"}),
        ("name", {"name": "bell\x07"}),
    ],
)
def test_hostile_requests_are_400_naming_the_field_and_store_nothing(operator, fleet, field, body):
    response = submit(operator, **body)
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Lease.objects.exists()


@pytest.mark.parametrize(
    ("field", "params"),
    [
        ("start", {"start": "9999-12-31T20:00:00Z"}),  # the default end (start + 25 h) overflowed: 500
        ("node", {"node": str(10**30)}),
    ],
)
def test_a_hostile_slot_window_is_a_400_naming_the_parameter(viewer, field, params):
    response = viewer.get("/api/slots/", params)
    assert response.status_code == 400, response.content
    assert field in response.json()


def test_the_slot_window_answers_the_object_the_schema_documents(viewer):
    import yaml
    from django.conf import settings

    schema = yaml.safe_load((settings.BASE_DIR / "docs" / "openapi.yaml").read_text())
    documented = schema["paths"]["/api/slots/"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ]
    assert documented == {"$ref": "#/components/schemas/SlotWindowResponse"}
    assert set(viewer.get("/api/slots/").json()) == {"start", "end", "reservations"}


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("max_per_node", {"max_per_node": 0}),  # a CHECK constraint refused it: 500
        ("max_per_node", {"max_per_node": 2**31}),
        ("hard", {"hard": "yes"}),
        ("members", {"members": [1]}),
    ],
)
def test_a_hostile_group_is_a_400_and_creates_nothing(operator, field, body):
    from leases.models import Group

    response = operator.post(
        "/api/groups/", {"name": "web", "policy": "anti_affinity", **body}, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Group.objects.exists()


def test_the_schema_documents_max_per_node_as_the_range_it_accepts():
    import yaml
    from django.conf import settings

    schema = yaml.safe_load((settings.BASE_DIR / "docs" / "openapi.yaml").read_text())
    documented = schema["components"]["schemas"]["GroupRequest"]["properties"]["max_per_node"]
    assert (documented["minimum"], documented["maximum"]) == (1, 2**31 - 1)


def test_a_lease_filter_that_only_looks_like_a_number_is_a_400(viewer):
    # "²".isdigit() is True and int("²") raises: it was a 500.
    assert viewer.get("/api/instances/", {"lease": "²"}).status_code == 400
    assert viewer.get("/api/instances/", {"node": "²"}).status_code == 200  # a node name, matching none


def test_a_queued_lease_carries_its_estimated_start_and_a_lease_that_cannot_fit_says_why(
    operator, viewer, fleet
):
    # Four nodes of 8 GiB: the blocker holds all four for 600 s; `next` gets aggressive backfilling's one future
    # reservation right after it (node 1); `wide` needs all four nodes, so it waits for `next` to end too; `short`
    # backfills into the 600 s the other three nodes are free before `wide` starts.
    blocker = submit(operator, type="immediate", duration_s=600, nodes=[vm(mem=8192)] * 4).json()
    nxt = submit(operator, duration_s=600, nodes=[vm(mem=8192)]).json()
    wide = submit(operator, duration_s=300, nodes=[vm(mem=8192)] * 4).json()
    short = submit(operator, duration_s=100, nodes=[vm(mem=8192)]).json()
    # A best-effort lease no node could ever run is refused, not queued forever (issue 44).
    gpu = submit(operator, duration_s=100, nodes=[vm()], capabilities=["gpu"])
    assert gpu.status_code == 409 and gpu.json()["code"] == "no_capable_node"
    assert "gpu" in gpu.json()["detail"] and gpu.json()["state"] == "rejected"
    assert (nxt["state"], wide["state"], short["state"]) == ("ready", "queued", "queued")
    end = Reservation.objects.get(lease_id=blocker["id"], kind="vm").end
    got = {lid: viewer.get(f"/api/leases/{lid}/").json() for lid in (wide["id"], short["id"])}
    when = {lid: (body["estimated_start"], body["estimated_end"]) for lid, body in got.items()}
    iso = lambda t: t.isoformat().replace("+00:00", "Z")  # noqa: E731
    assert when[wide["id"]] == (iso(end + timedelta(seconds=600)), iso(end + timedelta(seconds=900)))
    assert when[short["id"]] == (iso(end), iso(end + timedelta(seconds=100)))
    assert got[wide["id"]]["estimate_note"] == ""
    # A lease that is not queued has no estimate; the list carries the same fields.
    assert viewer.get(f"/api/leases/{nxt['id']}/").json()["estimated_start"] is None
    listed = {row["id"]: row for row in viewer.get("/api/leases/").json()["results"]}
    assert listed[short["id"]]["estimated_start"] == iso(end)
    # Cancelling the blocker moves every estimate: the queue's next pass reserves `wide` and `short` for real,
    # and their estimates go.
    operator.post(f"/api/leases/{blocker['id']}/cancel")
    after = Lease.objects.get(pk=short["id"])
    assert after.state != "queued" and after.estimated_start is None


def submit_minimal(client, prefer="return=minimal", **body):
    payload = {"name": "job", "type": "best_effort", "duration_s": 3600, "nodes": [vm()], **body}
    return client.post("/api/leases/", payload, format="json", headers={"Prefer": prefer})


def test_a_lease_request_preferring_a_minimal_answer_gets_the_report_without_its_verdicts(
    operator, viewer, fleet
):
    response = submit_minimal(operator)
    assert response.status_code == 201, response.content
    assert response.headers["Preference-Applied"] == "return=minimal"
    assert "Prefer" in response.headers["Vary"]
    body = response.json()
    assert set(body) == set(s.LeaseMinimalSerializer().fields)
    assert body["state"] == "active"
    report = body["placement_report"]
    assert "verdicts" not in report and "reservations" not in body
    assert report["outcome"] == "placed" and report["chosen"] and report["counts"]["evaluated"] == 4
    # The link reads the whole report: the same decision, every node's verdict in it.
    full = viewer.get(report["url"]).json()
    assert full["id"] == report["id"] and full["subject"] == f"lease:{body['id']}"
    assert len(full["verdicts"]) == 4 and full["summary"] == report["summary"]
    # The full answer of the same lease carries that report, verdicts and all.
    detail = operator.get(f"/api/leases/{body['id']}/").json()
    assert detail["placement_reports"][0]["id"] == report["id"]
    assert {k: detail[k] for k in LEASE_FIELDS} == {k: body[k] for k in LEASE_FIELDS}


LEASE_FIELDS = ("id", "name", "type", "state", "submitted_at", "nodes", "message", "groups")


def test_a_rejected_request_preferring_a_minimal_answer_is_a_409_with_the_reports_summary(operator, fleet):
    assert submit(operator, type="immediate", nodes=[vm(mem=8192)] * 4).status_code == 201
    response = submit_minimal(operator, prefer='respond-async, RETURN="minimal"; x=1', type="immediate")
    assert response.status_code == 409
    assert response.headers["Preference-Applied"] == "return=minimal"
    body = response.json()
    assert set(body) == {"detail", "code", "lease", "state", "report"}
    assert body["state"] == "rejected" and body["report"]["outcome"] == "rejected"
    assert body["code"] == "fleet_at_capacity"
    assert body["report"]["counts"]["evaluated"] == 4 and body["report"]["counts"]["fit"] == 0
    assert body["report"]["url"] == f"/api/placement/reports/{body['report']['id']}/"


@pytest.mark.parametrize(
    "prefer", ["", "return=representation", "minimal", "return=minimalist", "handling=lenient"]
)
def test_without_a_minimal_preference_the_answer_is_whole(operator, fleet, prefer):
    response = submit_minimal(operator, prefer=prefer)
    assert response.status_code == 201
    assert "Preference-Applied" not in response.headers
    body = response.json()
    assert body["reservations"] and body["history"]
    assert len(body["placement_reports"][0]["verdicts"]) == 4


def test_a_name_in_any_script_with_emoji_is_taken(operator, fleet):
    """Only control characters and text-direction controls are refused: a name in Arabic, with a combining mark or
    an emoji joined by a zero-width joiner, is a name."""
    for name in ("تقرير-ليلي", "café-render", "family-👨\u200d👩\u200d👧"):
        response = submit(operator, name=name)
        assert response.status_code == 201, (name, response.content)
        assert response.json()["name"] == name


def test_the_lease_list_filters_by_state_and_type_and_names_a_value_it_does_not_know(operator, fleet):
    """`?state=zzz` was an empty 200 (the node list answers its filters' bad values 400)."""
    submit(operator, name="running")
    assert [x["name"] for x in operator.get("/api/leases/?state=active,queued").json()["results"]] == [
        "running"
    ]
    assert operator.get("/api/leases/?state=done").json()["results"] == []
    assert len(operator.get("/api/leases/?type=best_effort").json()["results"]) == 1
    response = operator.get("/api/leases/?state=active,zzz&type=spot")
    assert response.status_code == 400
    body = response.json()
    assert body["state"] == [
        'Not a lease state: "zzz"; one or more of ' + ", ".join(str(v) for v in LeaseState) + "."
    ]
    assert body["type"][0].startswith('Not a lease type: "spot"; one or more of best_effort,')


def test_one_backoff_bound_sent_alone_moves_the_others_default_out_of_its_way(operator, fleet):
    """`backoff_max_s: 0.5` alone was a 400 ("Must be at least backoff_initial_s", the 1 s default nobody sent)."""
    response = submit(operator, restart_policy={"backoff_max_s": 0.5})
    assert response.status_code == 201, response.content
    assert Lease.objects.get().restart_policy == {"backoff_max_s": 0.5, "backoff_initial_s": 0.5}
    response = submit(operator, name="slow-start", restart_policy={"backoff_initial_s": 60})
    assert response.status_code == 201, response.content
    assert Lease.objects.get(name="slow-start").restart_policy == {
        "backoff_initial_s": 60,
        "backoff_max_s": 60,
    }
    both = submit(operator, name="both", restart_policy={"backoff_initial_s": 60, "backoff_max_s": 30})
    assert both.status_code == 400 and "backoff_max_s" in both.json()["restart_policy"]
