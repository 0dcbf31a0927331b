"""The heartbeat's fast path (issue 12, item 4, first part): a node token resolved recently comes from a small
in-process cache, and the heartbeat then writes without reading the node row. Every use is checked against the
row in the same statement, so a token rotated, a node fenced or deleted, or a status moved, whether here or in
another process (written below straight to the database, behind the cache's back), is refused or handled at once.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import nodestate
from fleet.actions import HealthReport
from fleet.models import HealthSample, Node, NodeStatus
from leases.instances.actions import nodes as node_actions
from slotkeeper.auth import NodeToken, NodeTokenCache, node_token_of, node_tokens
from slotkeeper.models import hash_token, new_token
from tests.conftest import client_with_token, healthy

pytestmark = pytest.mark.django_db


@pytest.fixture
def tank(register_node):
    node, agent = register_node("tank", now=timezone.now())
    assert beat(agent, node).status_code == 200  # the first: read in full, brought online, remembered
    return node, agent


def beat(agent, node, **kw):
    return agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(**kw), format="json")


def node_reads(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith("SELECT") and 'FROM "fleet_node"' in q["sql"]]


def test_the_second_heartbeat_reads_neither_the_token_nor_the_node_row(tank):
    node, agent = tank
    with CaptureQueriesContext(connection) as first:
        assert beat(agent, node).status_code == 200
    with CaptureQueriesContext(connection) as second:
        response = beat(agent, node, mem_used_mib=7000)
    assert response.status_code == 200 and response.json()["status"] == "online"
    assert node_reads(second.captured_queries) == []
    assert not any(
        "token_digest" in q["sql"] and q["sql"].startswith("SELECT") for q in second.captured_queries
    )
    assert len(second.captured_queries) <= len(first.captured_queries)
    assert Node.objects.get(pk=node.pk).obs_mem_used_mib == 7000
    assert node_tokens.hits >= 2


def test_a_rotated_token_is_refused_at_once(tank, admin):
    node, agent = tank
    rotated = admin.post(f"/api/nodes/{node.pk}/rotate-token")
    assert rotated.status_code == 200
    assert beat(agent, node).status_code == 401
    assert agent.get(f"/api/nodes/{node.pk}/assignments").status_code == 401
    assert beat(client_with_token(rotated.json()["token"]), node).status_code == 200


def test_a_token_rotated_by_another_process_is_refused_at_once(tank):
    node, agent = tank
    Node.objects.filter(pk=node.pk).update(token_digest=hash_token(new_token("skn")))
    assert beat(agent, node).status_code == 401
    assert len(node_tokens) == 0  # dropped, not tried again


def test_a_token_rotated_by_another_process_is_refused_for_assignments_too(tank):
    node, agent = tank
    Node.objects.filter(pk=node.pk).update(token_digest=hash_token(new_token("skn")))
    assert agent.get(f"/api/nodes/{node.pk}/assignments").status_code == 401


def test_a_fenced_node_is_refused_at_once(tank, admin):
    node, agent = tank
    assert (
        admin.post(f"/api/nodes/{node.pk}/declare-dead", {"reason": "PSU"}, format="json").status_code == 200
    )
    refused = beat(agent, node)
    assert (refused.status_code, refused.json()["code"]) == (409, "fenced")


def test_a_node_fenced_by_another_process_is_refused_at_once(tank):
    node, agent = tank
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(fenced_at=now, fence_reason="PSU", status=NodeStatus.DEAD)
    refused = beat(agent, node)
    assert (refused.status_code, refused.json()["code"]) == (409, "fenced")
    assert Node.objects.get(pk=node.pk).status == NodeStatus.DEAD


def test_a_deleted_node_is_refused_at_once(tank, admin):
    node, agent = tank
    assert admin.delete(f"/api/nodes/{node.pk}/").status_code == 204
    assert beat(agent, node).status_code == 401


def test_a_node_deleted_by_another_process_is_refused_at_once(tank):
    node, agent = tank
    Node.objects.filter(pk=node.pk).delete()
    assert beat(agent, node).status_code == 401


def test_a_node_the_sweep_marked_offline_elsewhere_comes_back_on_its_next_heartbeat(tank):
    # The cache remembers it online; another process's sweep made it offline (it had been silent): the guarded
    # update misses, and the full path brings it back with its audit row.
    node, agent = tank
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.OFFLINE)
    response = beat(agent, node)
    assert (response.status_code, response.json()["status"]) == (200, "online")
    assert Node.objects.get(pk=node.pk).status == NodeStatus.ONLINE


def test_a_node_drained_elsewhere_is_answered_draining(tank, operator):
    node, agent = tank
    assert operator.post(f"/api/nodes/{node.pk}/drain", {"reason": "move"}, format="json").status_code == 200
    assert beat(agent, node).json()["status"] == "draining"
    assert beat(agent, node).json()["status"] == "draining"  # and again, from the refreshed cache


def test_another_nodes_token_is_still_forbidden(tank, register_node):
    _, agent = tank
    other, _ = register_node("morpheus")
    assert beat(agent, other).status_code == 403


def known(node_id: int) -> NodeToken:
    return node_token_of(Node.objects.get(pk=node_id))


def test_the_fast_path_keeps_history_at_most_every_30_s(tank):
    node, _ = tank
    t = Node.objects.get(pk=node.pk).last_sample_at
    before = HealthSample.objects.filter(node_id=node.pk).count()
    report = HealthReport(mem_total_mib=61440, mem_used_mib=6144, disk_free_gib=400.0, cpu_pct=5.0, load1=0.3)
    for seconds in (5, 15, 29):
        assert node_actions.do_heartbeat_known(known(node.pk), report, now=t + timedelta(seconds=seconds))
    assert HealthSample.objects.filter(node_id=node.pk).count() == before
    node_actions.do_heartbeat_known(known(node.pk), report, now=t + timedelta(seconds=30))
    # A process that remembers no sample (another process took it) is stopped by the claim on the row.
    unaware = NodeToken(**{**known(node.pk).__dict__, "last_sample_at": None})
    node_actions.do_heartbeat_known(unaware, report, now=t + timedelta(seconds=45))
    assert HealthSample.objects.filter(node_id=node.pk).count() == before + 1


@pytest.mark.parametrize("remembered", [None, 6000, 6144 - nodestate.BASELINE_STEP_MIB + 1, 6144 + 128, 9000])
def test_the_fast_path_remembers_the_idle_footprint_by_the_same_rule(tank, remembered):
    node, _ = tank
    Node.objects.filter(pk=node.pk).update(idle_baseline_mib=remembered)
    report = HealthReport(mem_total_mib=61440, mem_used_mib=6144, disk_free_gib=400.0, cpu_pct=5.0, load1=0.3)
    node_actions.do_heartbeat_known(known(node.pk), report, now=timezone.now())
    assert Node.objects.get(pk=node.pk).idle_baseline_mib == nodestate.remembered_baseline(remembered, 6144)


def test_the_cache_is_bounded_and_short_lived():
    entry = NodeToken(digest="a", node_id=1, node_name="a", status="online", last_sample_at=None)
    cache = NodeTokenCache(max_size=2, ttl_s=60)
    for digest in "abc":
        cache.put(NodeToken(**{**entry.__dict__, "digest": digest}))
    assert (len(cache), cache.get("a"), cache.get("c") is not None) == (2, None, True)
    cache.forget_node(1)
    assert len(cache) == 0
    expired = NodeTokenCache(max_size=2, ttl_s=0)
    expired.put(entry)
    assert expired.get("a") is None
