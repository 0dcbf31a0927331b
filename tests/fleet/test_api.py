"""The fleet API, endpoint by endpoint and role by role."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from fleet.models import HealthSample, Node, PlacementReport
from slotkeeper.models import AuditEntry
from tests.conftest import healthy

pytestmark = pytest.mark.django_db

NEW_NODE = {
    "name": "architect",
    "cpu_cores": 16,
    "mem_total_mib": 65536,
    "disk_total_gib": 900,
    "capabilities": ["backend:claude"],
}


def beat(client, node, **overrides):
    return client.post(f"/api/nodes/{node.pk}/heartbeat", healthy(**overrides), format="json")


class TestRegister:
    def test_anonymous_is_told_to_authenticate(self, anonymous):
        assert anonymous.post("/api/nodes/", NEW_NODE, format="json").status_code == 401

    def test_a_viewer_cannot_register(self, viewer):
        assert viewer.post("/api/nodes/", NEW_NODE, format="json").status_code == 403
        assert not Node.objects.exists()

    @pytest.mark.parametrize("persona", ["operator", "admin"])
    def test_operators_and_admins_register_and_see_the_token_once(self, persona, request):
        client = request.getfixturevalue(persona)
        response = client.post("/api/nodes/", NEW_NODE, format="json")
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["token"].startswith("skn_")
        node = Node.objects.get(pk=body["id"])
        assert body["token"] not in node.token_digest  # only the digest is stored
        detail = client.get(f"/api/nodes/{node.pk}/").json()
        assert "token" not in detail
        assert AuditEntry.objects.filter(action="node.register", target_id=str(node.pk)).exists()

    def test_a_duplicate_name_is_a_conflict(self, operator, register_node):
        register_node(name="architect")
        response = operator.post("/api/nodes/", NEW_NODE, format="json")
        assert response.status_code == 409
        assert "already exists" in response.json()["detail"]

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("cpu_cores", "16"),
            ("cpu_cores", 0),
            ("mem_total_mib", -1),
            ("disk_total_gib", 1.5),
            ("name", "a b"),
            ("capabilities", ["Not Valid!"]),
            ("capabilities", "backend:claude"),
        ],
    )
    def test_bad_fields_are_named_and_nothing_is_created(self, operator, field, value):
        response = operator.post("/api/nodes/", {**NEW_NODE, field: value}, format="json")
        assert response.status_code == 400
        assert field in response.json()
        assert not Node.objects.exists()


class TestReadUpdateDelete:
    def test_viewers_list_and_read_nodes(self, viewer, register_node):
        node, _ = register_node()
        assert [n["name"] for n in viewer.get("/api/nodes/").json()["results"]] == ["tank"]
        assert viewer.get(f"/api/nodes/{node.pk}/").json()["status"] == "offline"

    def test_an_agent_token_cannot_read_the_fleet(self, register_node):
        _node, agent = register_node()
        assert agent.get("/api/nodes/").status_code == 403

    def test_an_unknown_node_is_404(self, viewer):
        assert viewer.get("/api/nodes/999/").status_code == 404
        assert viewer.get("/api/nodes/abc/").status_code == 404

    def test_only_admins_update(self, operator, admin, register_node):
        node, _ = register_node()
        assert operator.patch(f"/api/nodes/{node.pk}/", {"cpu_cores": 32}, format="json").status_code == 403
        response = admin.patch(f"/api/nodes/{node.pk}/", {"cpu_cores": 32}, format="json")
        assert response.status_code == 200
        assert Node.objects.get(pk=node.pk).cpu_cores == 32
        assert admin.patch(f"/api/nodes/{node.pk}/", {"cpu_cores": -2}, format="json").status_code == 400

    def test_delete_is_refused_while_instances_run(self, admin, register_node):
        node, agent = register_node()
        assert beat(agent, node, instances=["7-1-0"]).status_code == 200
        response = admin.delete(f"/api/nodes/{node.pk}/")
        assert response.status_code == 409
        assert "still runs 1 instance" in response.json()["detail"]
        assert beat(agent, node, instances=[]).status_code == 200
        assert admin.delete(f"/api/nodes/{node.pk}/").status_code == 204
        assert not Node.objects.filter(pk=node.pk).exists()

    def test_operators_cannot_delete(self, operator, register_node):
        node, _ = register_node()
        assert operator.delete(f"/api/nodes/{node.pk}/").status_code == 403


class TestHeartbeat:
    def test_a_node_reports_for_itself_and_comes_online(self, register_node):
        node, agent = register_node()
        response = beat(agent, node, mem_used_mib=7000, instances=[{"id": "7-1-0", "status": "running"}])
        assert response.status_code == 200, response.content
        assert response.json()["status"] == "online"
        node.refresh_from_db()
        assert (node.status, node.obs_mem_used_mib) == ("online", 7000)
        assert node.reported_instances[0]["id"] == "7-1-0"
        assert HealthSample.objects.filter(node=node).count() == 1

    def test_an_idle_heartbeat_is_remembered_as_the_baseline(self, register_node):
        node, agent = register_node()
        beat(agent, node, mem_used_mib=4314)
        node.refresh_from_db()
        assert node.idle_baseline_mib == 4314
        beat(agent, node, mem_used_mib=9000, instances=["7-1-0"])
        node.refresh_from_db()
        assert node.idle_baseline_mib == 4314  # a busy reading is not the host's own footprint

    def test_another_nodes_token_is_forbidden(self, register_node):
        _tank, tank_agent = register_node("tank")
        morpheus, _ = register_node("morpheus")
        assert beat(tank_agent, morpheus).status_code == 403
        morpheus.refresh_from_db()
        assert morpheus.last_heartbeat_at is None

    def test_an_unknown_node_is_404(self, register_node):
        _node, agent = register_node()
        assert agent.post("/api/nodes/999/heartbeat", healthy(), format="json").status_code == 404

    @pytest.mark.parametrize("persona", ["anonymous", "viewer", "admin"])
    def test_people_cannot_send_heartbeats(self, persona, request, register_node):
        node, _ = register_node()
        client = request.getfixturevalue(persona)
        assert beat(client, node).status_code in {401, 403}

    @pytest.mark.parametrize(
        ("field", "overrides"),
        [
            ("mem_used_mib", {"mem_used_mib": 70000}),
            ("mem_used_mib", {"mem_used_mib": -5}),
            ("cpu_pct", {"cpu_pct": "high"}),
            ("disk_free_gib", {"disk_free_gib": -1.0}),
            ("mem_total_mib", {"mem_total_mib": "61440"}),
            ("load1", {"load1": None}),
            ("instances", {"instances": [42]}),
        ],
    )
    def test_impossible_numbers_are_refused_by_field_and_nothing_is_stored(
        self, register_node, field, overrides
    ):
        node, agent = register_node()
        response = beat(agent, node, **overrides)
        assert response.status_code == 400
        assert field in response.json()
        node.refresh_from_db()
        assert node.last_heartbeat_at is None
        assert not HealthSample.objects.exists()

    def test_nan_is_refused(self, register_node):
        node, agent = register_node()
        body = json.dumps(healthy()).replace('"cpu_pct": 5.0', '"cpu_pct": NaN')
        response = agent.post(f"/api/nodes/{node.pk}/heartbeat", body, content_type="application/json")
        assert response.status_code == 400
        assert not HealthSample.objects.exists()

    def test_a_heartbeat_never_takes_a_node_out_of_draining(self, operator, register_node):
        node, agent = register_node()
        beat(agent, node)
        operator.post(f"/api/nodes/{node.pk}/drain", {"reason": "disk swap"}, format="json")
        assert beat(agent, node).json()["status"] == "draining"

    def test_assignments_are_for_the_own_node_only(self, register_node):
        tank, tank_agent = register_node("tank")
        morpheus, _ = register_node("morpheus")
        assert tank_agent.get(f"/api/nodes/{tank.pk}/assignments").json()["node"] == tank.pk
        assert tank_agent.get(f"/api/nodes/{morpheus.pk}/assignments").status_code == 403


class TestDrain:
    def test_a_viewer_cannot_drain(self, viewer, register_node):
        node, _ = register_node()
        assert viewer.post(f"/api/nodes/{node.pk}/drain", {"reason": "x"}, format="json").status_code == 403

    def test_a_drain_needs_a_reason(self, operator, register_node):
        node, _ = register_node()
        response = operator.post(f"/api/nodes/{node.pk}/drain", {"reason": "  "}, format="json")
        assert response.status_code == 400
        assert "reason" in response.json()
        assert Node.objects.get(pk=node.pk).status == "offline"

    def test_drain_and_undrain_are_audited_with_who_and_why(self, operator, register_node):
        node, agent = register_node()
        beat(agent, node)
        response = operator.post(f"/api/nodes/{node.pk}/drain", {"reason": "kernel upgrade"}, format="json")
        assert response.status_code == 200
        assert (response.json()["status"], response.json()["drained_by"]) == ("draining", "otto")
        assert (
            operator.post(f"/api/nodes/{node.pk}/drain", {"reason": "again"}, format="json").status_code
            == 409
        )
        response = operator.post(f"/api/nodes/{node.pk}/undrain", {"reason": "done"}, format="json")
        assert response.json()["status"] == "online"
        entries = list(
            AuditEntry.objects.filter(target_id=str(node.pk))
            .order_by("at", "id")
            .values_list("action", "actor_label", "reason")
        )
        assert ("node.drain", "otto", "kernel upgrade") in entries
        assert ("node.undrain", "otto", "done") in entries

    def test_undrain_of_a_node_that_is_not_draining_is_a_conflict(self, operator, register_node):
        node, _ = register_node()
        assert operator.post(f"/api/nodes/{node.pk}/undrain", {}, format="json").status_code == 409


class TestDeclareDead:
    def test_only_admins_declare_a_node_dead(self, operator, admin, register_node):
        node, agent = register_node()
        beat(agent, node)
        assert (
            operator.post(f"/api/nodes/{node.pk}/declare-dead", {"reason": "PSU"}, format="json").status_code
            == 403
        )
        assert admin.post(f"/api/nodes/{node.pk}/declare-dead", {}, format="json").status_code == 400
        response = admin.post(f"/api/nodes/{node.pk}/declare-dead", {"reason": "PSU failed"}, format="json")
        assert response.status_code == 200
        assert response.json()["status"] == "dead"
        assert AuditEntry.objects.filter(action="node.declare_dead", reason="PSU failed").exists()
        assert (
            admin.post(f"/api/nodes/{node.pk}/declare-dead", {"reason": "again"}, format="json").status_code
            == 409
        )


class TestPreview:
    def fleet(self, register_node):
        nodes = {}
        for name, mem, used in [("tank", 61440, 6144), ("architect", 65536, 5000), ("morpheus", 31757, 4314)]:
            node, agent = register_node(name=name, mem_total_mib=mem)
            beat(agent, node, mem_total_mib=mem, mem_used_mib=used)
            nodes[name] = node
        return nodes

    def test_a_viewer_cannot_preview(self, viewer):
        assert viewer.post("/api/placement/preview", {"mem_mib": 8192}, format="json").status_code == 403

    def test_a_draining_node_is_unfit_with_reason_draining(self, operator, register_node):
        nodes = self.fleet(register_node)
        operator.post(f"/api/nodes/{nodes['architect'].pk}/drain", {"reason": "rack move"}, format="json")
        response = operator.post("/api/placement/preview", {"mem_mib": 8192, "disk_gib": 10}, format="json")
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["outcome"] == "placed"
        assert "architect" not in body["nodes"]
        verdict = next(v for v in body["verdicts"] if v["node"] == "architect")
        assert (verdict["fit"], verdict["reason_code"]) == (False, "draining")
        assert len(body["verdicts"]) == 3
        report = PlacementReport.objects.get(pk=body["report"])
        assert report.verdict_for("architect")["reason_code"] == "draining"

    def test_a_request_larger_than_any_node_names_the_largest(self, operator, register_node):
        self.fleet(register_node)
        response = operator.post("/api/placement/preview", {"mem_mib": 500_000}, format="json")
        body = response.json()
        assert body["outcome"] == "no_capable_node"
        # architect is the largest: 65536 MiB less its 4096 MiB reserve and 5000 MiB idle baseline.
        assert "the largest, architect, allocates at most 56,440 MiB" in body["message"]

    def test_a_missing_capability_is_no_capable_node(self, operator, register_node):
        self.fleet(register_node)
        body = operator.post(
            "/api/placement/preview", {"mem_mib": 1024, "capabilities": ["accel.gpu"]}, format="json"
        ).json()
        assert body["outcome"] == "no_capable_node"
        assert {v["reason_code"] for v in body["verdicts"]} == {"missing_capability"}

    @pytest.mark.parametrize("body", [{}, {"mem_mib": 0}, {"mem_mib": "8g"}, {"mem_mib": 8192, "count": 0}])
    def test_bad_previews_are_400(self, operator, body):
        response = operator.post("/api/placement/preview", body, format="json")
        assert response.status_code == 400

    def test_reports_are_readable_by_viewers(self, operator, viewer, register_node):
        self.fleet(register_node)
        report_id = operator.post("/api/placement/preview", {"mem_mib": 8192}, format="json").json()["report"]
        body = viewer.get(f"/api/placement/reports/{report_id}/").json()
        assert len(body["verdicts"]) == 3


class TestSchema:
    def test_the_schema_needs_a_login(self, anonymous, viewer):
        assert anonymous.get("/api/schema/").status_code == 401
        assert viewer.get("/api/schema/").status_code == 200


def test_a_heartbeat_is_stamped_with_the_servers_clock_and_stale_health_is_unfit(register_node, operator):
    node, agent = register_node()
    beat(agent, node)
    node.refresh_from_db()
    assert (timezone.now() - node.last_heartbeat_at).total_seconds() < 5
    # 31 s later the same node's health is stale: the preview must refuse it with its own reason.
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timezone.timedelta(seconds=31))
    body = operator.post("/api/placement/preview", {"mem_mib": 1024}, format="json").json()
    assert body["outcome"] == "fleet_unreadable"
    assert body["verdicts"][0]["reason_code"] == "no_recent_health"
