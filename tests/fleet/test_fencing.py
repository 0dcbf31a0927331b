"""Nodes that die stay dead: declare-dead fences a node until an admin re-admits it, and a node holding reservations
cannot be deleted from under the scheduler."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Node
from leases import actions as lease_actions
from leases.instances.actions import nodes as node_actions
from leases.models import Instance
from slotkeeper.models import AuditEntry
from tests.conftest import healthy

pytestmark = pytest.mark.django_db


def beat(client, node, **overrides):
    return client.post(f"/api/nodes/{node.pk}/heartbeat", healthy(**overrides), format="json")


@pytest.fixture
def tank(register_node):
    node, agent = register_node("tank")
    assert beat(agent, node).status_code == 200
    return node, agent


def test_a_node_declared_dead_is_fenced_and_its_heartbeats_are_refused(tank, admin):
    node, agent = tank
    response = admin.post(
        f"/api/nodes/{node.pk}/declare-dead", {"reason": "motherboard failed"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["fenced"] is True
    # The agent still runs and heartbeats: it is told it is fenced, and the node stays dead (it came back online
    # four seconds later before).
    for _ in range(3):
        refused = beat(agent, node)
        assert refused.status_code == 409
        assert refused.json()["code"] == "fenced"
        assert "motherboard failed" in refused.json()["detail"]
    answer = agent.get(f"/api/nodes/{node.pk}/assignments")
    assert (answer.status_code, answer.json()["code"]) == (409, "fenced")
    row = Node.objects.get(pk=node.pk)
    assert (row.status, row.fence_reason) == ("dead", "motherboard failed")
    assert row.last_fenced_heartbeat_at is not None


def test_only_an_admin_readmits_with_a_reason_and_the_node_then_returns(tank, admin, operator):
    node, agent = tank
    admin.post(f"/api/nodes/{node.pk}/declare-dead", {"reason": "PSU"}, format="json")
    assert (
        operator.post(f"/api/nodes/{node.pk}/readmit", {"reason": "fixed"}, format="json").status_code == 403
    )
    missing = admin.post(f"/api/nodes/{node.pk}/readmit", {}, format="json")
    assert missing.status_code == 400 and "reason" in missing.json()
    assert Node.objects.get(pk=node.pk).fenced_at is not None
    readmitted = admin.post(f"/api/nodes/{node.pk}/readmit", {"reason": "PSU replaced"}, format="json")
    assert readmitted.status_code == 200
    assert (readmitted.json()["status"], readmitted.json()["fenced"]) == ("offline", False)
    assert beat(agent, node).status_code == 200
    assert Node.objects.get(pk=node.pk).status == "online"
    assert AuditEntry.objects.filter(action="node.readmit", reason="PSU replaced").exists()
    again = admin.post(f"/api/nodes/{node.pk}/readmit", {"reason": "again"}, format="json")
    assert again.status_code == 409


def test_readmitting_an_unknown_node_is_404(admin):
    assert admin.post("/api/nodes/999999/readmit", {"reason": "x"}, format="json").status_code == 404


def test_a_node_the_sweep_found_dead_is_not_fenced_and_returns_by_itself(tank, t0):
    node, agent = tank
    now = timezone.now()
    for seconds in range(0, 95, 5):
        node_actions.sweep(now + timedelta(seconds=seconds))
    row = Node.objects.get(pk=node.pk)
    assert (row.status, row.fenced_at) == ("dead", None)
    assert beat(agent, node).status_code == 200
    assert Node.objects.get(pk=node.pk).status == "online"


def test_declaring_dead_a_node_the_sweep_already_found_dead_fences_it(tank):
    node, agent = tank
    now = timezone.now()
    for seconds in range(0, 95, 5):
        node_actions.sweep(now + timedelta(seconds=seconds))
    node_actions.do_declare_dead(None, node.pk, reason="it smokes", now=now + timedelta(seconds=100))
    assert beat(agent, node).status_code == 409


def test_a_node_that_holds_reservations_cannot_be_deleted(admin, register_node):
    node, agent = register_node("holder", cpu_cores=4, mem_total_mib=16384)
    assert beat(agent, node, mem_total_mib=16384).status_code == 200
    spec = lease_actions.LeaseSpec(
        name="ar",
        type="advance_reservation",
        duration_s=600,
        vnodes=[{"cpu_cores": 1, "mem_mib": 512}],
        start=timezone.now() + timedelta(hours=2),
    )
    lease = lease_actions.do_submit_lease(None, spec, now=timezone.now()).lease
    assert lease.state == "ready"
    response = admin.delete(f"/api/nodes/{node.pk}/")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "has_reservations" and body["leases"] == [lease.pk]
    assert "drain" in body["detail"]
    assert Node.objects.filter(pk=node.pk).exists()
    # Once the reservation is gone (cancelled), the node can go.
    lease_actions.do_cancel_lease(None, lease.pk, now=timezone.now())
    assert admin.delete(f"/api/nodes/{node.pk}/").status_code == 204
    # And the scheduler is unharmed: the next submission is decided, not a KeyError.
    other, other_agent = register_node("other", cpu_cores=4, mem_total_mib=16384)
    beat(other_agent, other, mem_total_mib=16384)
    again = lease_actions.do_submit_lease(None, spec, now=timezone.now())
    assert again.lease.state == "ready"
    assert not Instance.objects.filter(node_id=node.pk).exists()
