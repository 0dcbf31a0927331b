"""Reads handed down as plain values: the placer's claims per node, and what a node's agent should run."""

from __future__ import annotations

import pytest
from django.utils import timezone

from leases.instances import reads
from tests.leases.instances.helpers import report_all, run_lease

pytestmark = pytest.mark.django_db


def test_claims_are_pending_until_the_agent_reports_the_instance_running(fleet):
    now = timezone.now()
    _lease, [inst] = run_lease(now, mem=2048)
    running, pending = reads.claims([inst.node_id])[inst.node_id]
    assert (running, [c.id for c in pending], pending[0].mem_mib) == ((), [inst.iid], 2048)
    report_all(now)
    running, pending = reads.claims()[inst.node_id]
    assert ([c.id for c in running], pending) == ([inst.iid], ())


def test_assignments_name_the_node_its_status_and_its_instances(fleet):
    _lease, [inst] = run_lease(timezone.now())
    answer = reads.assignments_for(inst.node, timezone.now())
    assert (answer["node"], answer["status"]) == (inst.node_id, "online")
    assert [a["id"] for a in answer["instances"]] == [inst.iid]
