"""The instances / reschedules / groups / alerts API, role by role, with its conflicts."""

from __future__ import annotations

import pytest
from django.utils import timezone

from leases.instances.actions import nodes as node_actions
from leases.instances.models import Reschedule
from leases.models import Group, Instance
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def immediate(client, name="job", **extra):
    body = {"name": name, "type": "immediate", "duration_s": 3600, "nodes": [vm()], **extra}
    response = client.post("/api/leases/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def lose(lease_id):
    inst = Instance.objects.get(lease_id=lease_id)
    node_actions.do_declare_dead(None, inst.node_id, reason="gone", now=timezone.now())
    return inst


def test_instances_are_listed_by_lease_and_read_with_their_history(viewer, operator, fleet):
    lease = immediate(operator)
    body = viewer.get("/api/instances/", {"lease": lease["id"]}).json()
    [row] = body["results"]
    assert (row["iid"], row["state"]) == (f"{lease['id']}-1-0", "placed")
    detail = viewer.get(f"/api/instances/{row['iid']}/").json()
    assert detail["history"][0]["to_state"] == "placed"
    assert detail["restarts"] == []
    assert viewer.get("/api/instances/", {"lease": "x"}).status_code == 400
    assert viewer.get("/api/instances/9-9-9/").status_code == 404


def test_an_illegal_transition_is_409_naming_both_states(operator, viewer, fleet):
    lease = immediate(operator)
    iid = f"{lease['id']}-1-0"
    assert (
        viewer.post(f"/api/instances/{iid}/transition", {"state": "stopping"}, format="json").status_code
        == 403
    )
    response = operator.post(f"/api/instances/{iid}/transition", {"state": "finished"}, format="json")
    assert response.status_code == 409
    assert "cannot go from placed to finished" in response.json()["detail"]
    assert Instance.objects.get(iid=iid).state == "placed"
    response = operator.post(
        f"/api/instances/{iid}/transition", {"state": "revoked", "reason": "test"}, format="json"
    )
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["desired_state"]) == ("revoked", "stopped")


def test_pending_reschedules_are_approved_one_at_a_time_with_a_version(operator, viewer, fleet):
    lease = immediate(operator)
    inst = lose(lease["id"])
    [pending] = viewer.get("/api/reschedules/", {"status": "pending"}).json()["results"]
    assert pending["instance"] == inst.iid
    assert len(pending["verdicts"]) == 4
    assert viewer.post(f"/api/reschedules/{pending['id']}/approve", {}, format="json").status_code == 403
    stale = operator.post(
        f"/api/reschedules/{pending['id']}/approve", {"version": pending["version"] + 5}, format="json"
    )
    assert stale.status_code == 412
    ok = operator.post(
        f"/api/reschedules/{pending['id']}/approve", {"version": pending["version"]}, format="json"
    )
    assert ok.status_code == 200
    assert ok.json()["ok"] is True
    again = operator.post(f"/api/reschedules/{pending['id']}/approve", {}, format="json")
    assert again.status_code == 409
    assert operator.post("/api/reschedules/999/approve", {}, format="json").status_code == 404


def test_bulk_approval_by_ids_gives_a_result_per_item(operator, fleet):
    a = immediate(operator, "a", nodes=[vm(mem=1024)])
    b = immediate(operator, "b", nodes=[vm(mem=1024)])
    lose(a["id"])
    if Instance.objects.get(lease_id=b["id"]).state != "lost":
        lose(b["id"])
    ids = list(Reschedule.objects.filter(status="pending").values_list("pk", flat=True))
    response = operator.post("/api/reschedules/approve", {"ids": [*ids, 12345]}, format="json")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["id"] for r in results] == [*ids, 12345]
    assert all(r["ok"] for r in results[:-1]), results
    assert results[-1]["ok"] is False and "does not exist" in results[-1]["message"]
    assert [r["code"] for r in results] == ["applied"] * len(ids) + ["not_found"]
    assert operator.post("/api/reschedules/approve", {}, format="json").status_code == 400


def test_reject_and_approval_by_group(operator, fleet):
    Group.objects.create(name="web", policy="anti_affinity", hard=False)
    lease = immediate(operator, "w", groups=["web"])
    lose(lease["id"])
    response = operator.post("/api/reschedules/approve", {"group": "web"}, format="json")
    assert [r["ok"] for r in response.json()["results"]] == [True]
    assert operator.post("/api/reschedules/approve", {"group": "nope"}, format="json").status_code == 404
    other = immediate(operator, "x")
    lose(other["id"])
    pending = Reschedule.objects.get(status="pending")
    rejected = operator.post(f"/api/reschedules/{pending.pk}/reject", {"reason": "leave it"}, format="json")
    assert rejected.json()["status"] == "rejected"
    assert operator.post(f"/api/reschedules/{pending.pk}/approve", {}, format="json").status_code == 409


def test_groups_crud_and_a_policy_the_members_already_violate_is_400(operator, viewer, fleet):
    a = immediate(operator, "a", nodes=[vm(mem=2048)])
    b = immediate(operator, "b", nodes=[vm(mem=2048)])
    same_node = (
        Instance.objects.get(lease_id=a["id"]).node_id == Instance.objects.get(lease_id=b["id"]).node_id
    )
    assert viewer.post("/api/groups/", {"name": "g", "policy": "affinity"}, format="json").status_code == 403
    response = operator.post(
        "/api/groups/",
        {"name": "db", "policy": "anti_affinity", "hard": True, "leases": [a["id"], b["id"]]},
        format="json",
    )
    if same_node:
        assert response.status_code == 400
        assert "already violate" in response.json()["policy"][0]
    else:
        response = operator.post(
            "/api/groups/",
            {"name": "db2", "policy": "affinity", "hard": True, "leases": [a["id"], b["id"]]},
            format="json",
        )
        assert response.status_code == 400
        assert "not on one node" in response.json()["policy"][0]
    ok = operator.post(
        "/api/groups/", {"name": "free", "policy": "anti_affinity", "max_per_node": 2}, format="json"
    )
    assert ok.status_code == 201
    assert viewer.get("/api/groups/free/").json()["max_per_node"] == 2
    assert operator.patch("/api/groups/free/", {"hard": False}, format="json").status_code == 200
    assert operator.delete("/api/groups/free/").status_code == 204
    assert viewer.get("/api/groups/free/").status_code == 404


def test_alerts_list_held_instances(operator, viewer, fleet):
    lease = immediate(operator, migratable=False)
    lose(lease["id"])
    alerts = viewer.get("/api/alerts/").json()["results"]
    assert sorted(a["kind"] for a in alerts) == ["instance_held", "node_dead"]


def test_assignments_carry_what_the_agent_needs_for_the_late_group_check(operator, fleet):
    Group.objects.create(name="web", policy="anti_affinity", hard=True, max_per_node=1)
    lease = immediate(operator, groups=["web"], driver="process", spec={"command": ["sleep", "30"]})
    inst = Instance.objects.get(lease_id=lease["id"])
    node = inst.node
    token_client = None
    from slotkeeper.models import hash_token, new_token

    raw = new_token("skn")
    node.token_digest = hash_token(raw)
    node.save(update_fields=["token_digest"])
    from tests.conftest import client_with_token

    token_client = client_with_token(raw)
    body = token_client.get(f"/api/nodes/{node.pk}/assignments").json()
    [entry] = body["instances"]
    assert entry["id"] == inst.iid
    assert (entry["driver"], entry["spec"]["command"], entry["desired_state"]) == (
        "process",
        ["sleep", "30"],
        "running",
    )
    assert entry["groups"] == [
        {"name": "web", "policy": "anti_affinity", "hard": True, "max_per_node": 1, "members_here": []}
    ]


def test_the_admin_action_approves_through_the_same_path(client, fleet, operator):
    from django.contrib.auth import get_user_model

    lease = immediate(operator)
    lose(lease["id"])
    proposal = Reschedule.objects.get(status="pending")
    boss = get_user_model().objects.create_superuser("boss", password="pw-for-tests-only")
    client.force_login(boss)
    response = client.post(
        "/admin/leases/reschedule/",
        {"action": "approve_reschedules", "_selected_action": [proposal.pk]},
        follow=True,
    )
    assert response.status_code == 200
    proposal.refresh_from_db()
    assert proposal.status == "applied"
    assert proposal.decided_by == "boss"


def test_an_operator_resolves_an_alert_once(operator, viewer, fleet):
    lease = immediate(operator, migratable=False)
    lose(lease["id"])
    [alert] = viewer.get("/api/alerts/", {"open": "1", "kind": "instance_held"}).json()["results"]
    assert viewer.post(f"/api/alerts/{alert['id']}/resolve", {}, format="json").status_code == 403
    done = operator.post(f"/api/alerts/{alert['id']}/resolve", {"reason": "node is back"}, format="json")
    assert done.status_code == 200 and done.json()["resolved_at"]
    assert operator.post(f"/api/alerts/{alert['id']}/resolve", {}, format="json").status_code == 409
    assert viewer.get("/api/alerts/", {"open": "1", "kind": "instance_held"}).json()["results"] == []
    assert operator.post("/api/alerts/999/resolve", {}, format="json").status_code == 404


def test_a_dead_node_raises_an_alert_and_a_rejected_lease_does_not(operator, viewer, fleet):
    # A rejection is the client's 409, an audit row and a metric: an alert is for an operator's task (issue 45).
    assert immediate(operator, nodes=[vm(mem=8192)] * 4)  # fills the fleet
    rejected = operator.post(
        "/api/leases/",
        {"name": "late", "type": "immediate", "duration_s": 60, "nodes": [vm(mem=4096)]},
        format="json",
    )
    assert rejected.status_code == 409
    node_actions.do_declare_dead(None, fleet[0].pk, reason="PSU", now=timezone.now())
    kinds = {a["kind"]: a for a in viewer.get("/api/alerts/").json()["results"]}
    assert set(kinds) == {"node_dead"}
    assert kinds["node_dead"]["node"] == fleet[0].name and "PSU" in kinds["node_dead"]["message"]


def test_a_process_spec_reaches_the_agent_as_sent_every_character_kept(operator, fleet):
    """The agent runs the command as this argv (fleet/agent/drivers.py): DRF's trimming ran `["printf", "%s\\n"]`
    as `["printf", "%s"]`, an argument " a " as "a", dropped an environment value's spaces, and refused `""`."""
    from slotkeeper.models import hash_token, new_token
    from tests.conftest import client_with_token

    spec = {
        "command": ["printf", "%s\n", " a ", ""],
        "env": {"GREETING": "  hello  ", "EMPTY": ""},
        "cwd": "/tmp/a b",
    }
    lease = immediate(operator, driver="process", spec=spec)
    assert lease["spec"] == spec
    inst = Instance.objects.get(lease_id=lease["id"])
    raw = new_token("skn")
    inst.node.token_digest = hash_token(raw)
    inst.node.save(update_fields=["token_digest"])
    [entry] = client_with_token(raw).get(f"/api/nodes/{inst.node_id}/assignments").json()["instances"]
    assert (entry["spec"]["command"], entry["spec"]["env"], entry["spec"]["cwd"]) == (
        spec["command"],
        spec["env"],
        spec["cwd"],
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [({"command": [" ", "x"]}, "command"), ({"command": ["true"], "cwd": "  "}, "cwd")],
)
def test_a_blank_program_or_working_directory_is_a_400(operator, fleet, spec, field):
    body = {
        "name": "job",
        "type": "immediate",
        "duration_s": 3600,
        "nodes": [vm()],
        "driver": "process",
        "spec": spec,
    }
    response = operator.post("/api/leases/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["spec"]
    assert not Instance.objects.exists()
