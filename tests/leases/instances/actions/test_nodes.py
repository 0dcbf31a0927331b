"""Node operations composed with instances: the sweep's dead node returns and is told to stop what moved."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Node
from leases.instances import reads
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reschedules
from leases.instances.models import Reschedule
from leases.models import Instance
from tests.leases.instances.helpers import healthy, report_all, run_lease

pytestmark = pytest.mark.django_db


def test_a_node_the_sweep_found_dead_returns_and_is_told_to_stop_what_was_moved_meanwhile(fleet):
    # Not fenced (nobody declared it dead): it may come back by itself, but the instance that was rescheduled
    # while it was away must not run twice. Its agent still reports it running; the assignment says stop.
    now = timezone.now()
    _lease, [inst] = run_lease(now)
    report_all(now)
    away = inst.node
    for seconds in range(5, 100, 5):
        for node in Node.objects.exclude(pk=away.pk):
            healthy(node, now + timedelta(seconds=seconds))
        node_actions.sweep(now + timedelta(seconds=seconds))
    assert Node.objects.get(pk=away.pk).status == "dead"
    inst.refresh_from_db()
    assert inst.state == "lost"
    proposal = Reschedule.objects.get(instance=inst)
    [result] = reschedules.do_approve(None, [proposal.pk], now=now + timedelta(seconds=100))
    assert result.ok, result.message
    back = healthy(away, now + timedelta(seconds=101), [{"id": inst.iid, "status": "running"}])
    assert back.status == "online"
    [told] = [a for a in reads.assignments(back, now + timedelta(seconds=101)) if a["id"] == inst.iid]
    assert told["desired_state"] == "stopped"
    inst.refresh_from_db()
    assert inst.state == "rescheduled"
    # Once the agent has stopped it, it is unloaded; the new instance runs elsewhere.
    healthy(away, now + timedelta(seconds=106), [])
    inst.refresh_from_db()
    assert inst.state == "unloaded"
    assert Instance.objects.get(iid=result.new_instance).node_id != away.pk
