"""A lease request's "exceeds the largest node" check reads the live fleet's shapes from what this process kept
(fleet/live_shapes.py): a node this process writes is seen at once, one written elsewhere within SHAPES_TTL_S.
Transactional tests: only reads in autocommit, as a request's are, are kept."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet import live_shapes
from fleet.models import Node
from tests.leases.conftest import DECLARED_MIB, vm

pytestmark = pytest.mark.django_db(transaction=True)

BIG = {"nodes": [vm(mem=10_000)]}  # more than the fleet's 8 GiB allocatable


def submit(client, **body):
    payload = {"name": "job", "type": "best_effort", "duration_s": 3600, "nodes": [vm()], **body}
    return client.post("/api/leases/", payload, format="json")


@pytest.fixture(autouse=True)
def fresh():
    live_shapes._drop()
    yield
    live_shapes._drop()


def test_a_node_grown_behind_this_process_s_back_is_seen_within_the_ttl(operator, fleet, monkeypatch):
    monkeypatch.setattr(live_shapes, "SHAPES_TTL_S", 0.3)
    assert submit(operator, **BIG).status_code == 400
    # As another process would write it: no signal reaches this one.
    Node.objects.filter(name="n1").update(mem_total_mib=DECLARED_MIB + 4096)
    refused = submit(operator, **BIG)
    assert refused.status_code == 400, "the shapes were read again: nothing was kept"
    assert "8192 MiB allocatable" in refused.json()["nodes"]["0"]
    time.sleep(0.35)
    assert submit(operator, **BIG).status_code == 201


def test_a_node_this_process_changes_is_seen_by_the_next_request(operator, fleet):
    assert submit(operator, **BIG).status_code == 400
    fleet_actions.do_update_node(
        None, fleet[0].pk, {"mem_total_mib": DECLARED_MIB + 4096}, now=timezone.now()
    )
    assert submit(operator, **BIG).status_code == 201
    # The only node that took it dies: the next request is refused at once, with no wait for the TTL.
    fleet_actions.do_declare_dead(None, fleet[0].pk, reason="test", now=timezone.now())
    assert submit(operator, **BIG).status_code == 400


def test_a_node_registered_or_deleted_here_is_seen_at_once(operator, fleet, register_node):
    assert submit(operator, **BIG).status_code == 400
    big, _ = register_node(name="big", cpu_cores=8, mem_total_mib=DECLARED_MIB + 8192)
    assert submit(operator, **BIG).status_code == 201  # queued for the new node, which has not reported yet
    fleet_actions.do_delete_node(None, big.pk, now=timezone.now())
    response = submit(operator, **BIG)
    assert response.status_code == 400 and "8192 MiB allocatable" in response.json()["nodes"]["0"]


def test_a_read_inside_a_transaction_is_not_kept():
    from django.db import transaction

    with transaction.atomic():
        Node.objects.create(name="ghost", cpu_cores=2, mem_total_mib=DECLARED_MIB, disk_total_gib=10)
        assert len(live_shapes.live_shapes()) == 1
        transaction.set_rollback(True)
    assert live_shapes.live_shapes() == ()
