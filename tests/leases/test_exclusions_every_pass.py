"""Every planning pass plans with its own exclusions, whatever runs it. A cancel freed room and the queue ran in its
pass with the exclusions the scheduler last saw: none at all on a scheduler rebuilt after a fleet change, so queued
leases were placed on a node registered without an agent (offline, never heartbeated). Found in the demo."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from leases.models import Lease
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def test_a_cancel_runs_the_queue_without_placing_on_a_node_that_never_sent_a_heartbeat(operator, fleet):
    ids: list[int] = []
    while sum(Lease.objects.get(pk=i).state == "queued" for i in ids) < 2:  # the four nodes full, two queued
        assert len(ids) < 12
        response = operator.post(
            "/api/leases/",
            {"name": "j", "type": "best_effort", "duration_s": 3600, "nodes": [vm(cores=4, mem=4096)]},
            format="json",
        )
        ids.append(response.json()["id"])
    queued = [i for i in ids if Lease.objects.get(pk=i).state == "queued"]
    running = [i for i in ids if i not in queued]
    assert len(queued) == 2
    fleet_actions.do_register_node(
        None, name="ghost", cpu_cores=8, mem_total_mib=32768, disk_total_gib=100, capabilities=[],
        now=timezone.now(),
    )  # fmt: skip
    assert operator.post(f"/api/leases/{running[0]}/cancel/", {}, format="json").status_code == 200
    placed = Lease.objects.get(pk=queued[0])
    assert "ghost" not in placed.message, placed.message
    assert placed.state != "queued", "the freed node took the first queued lease"
