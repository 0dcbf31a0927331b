"""A drain with a deadline as a process."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Node
from leases import instance_rows
from leases.instances import reads
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic
from leases.instances.models import Reschedule
from leases.models import Instance
from tests.leases.instances.helpers import run_lease

pytestmark = pytest.mark.django_db


def test_a_drain_with_a_deadline_moves_instances_a_few_at_a_time_and_stops_the_rest(fleet):
    now = timezone.now()
    leases = [run_lease(now, name=f"d{i}", mem=512)[0] for i in range(3)]
    node = Instance.objects.get(lease=leases[0]).node
    on_node = list(Instance.objects.filter(node=node, state__in=instance_rows.LIVE))
    node_actions.do_drain(
        None, node.pk, reason="kernel", now=now, deadline=now + timedelta(minutes=10), max_parallel=1
    )
    assert Reschedule.objects.filter(cause="drain", status="pending").count() == len(on_node)
    periodic.tick(now + timedelta(seconds=1))
    progress = reads.drain_progress(Node.objects.get(pk=node.pk))
    applied = [m for m in progress["moves"] if m["status"] == "applied"]
    assert len(applied) == min(1, len(on_node))  # max_parallel = 1: one move in flight at a time
    assert progress["in_flight"] == len(applied)
    # The deadline passes: whatever has not moved is stopped, with an audit row.
    periodic.tick(now + timedelta(minutes=11))
    assert not Instance.objects.filter(node=node, state__in=["placed", "running"]).exists()
    from slotkeeper.models import AuditEntry

    assert AuditEntry.objects.filter(action="node.drain_deadline", target_id=str(node.pk)).exists()
