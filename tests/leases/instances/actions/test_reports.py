"""What the agent reports, ingested by the heartbeat: running confirms, a missed report makes it unhealthy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from leases.instances import reads
from leases.instances.models import RestartRecord
from leases.models import Instance
from tests.leases.instances.helpers import report_all, run_lease

pytestmark = pytest.mark.django_db


def test_an_active_lease_has_one_placed_instance_per_vnode_and_the_agent_confirms_it(fleet):
    now = timezone.now()
    lease, instances = run_lease(now, vnodes=2)
    assert [(i.iid, i.state) for i in instances] == [
        (f"{lease.pk}-1-0", "placed"),
        (f"{lease.pk}-2-0", "placed"),
    ]
    node = instances[0].node
    assigned = reads.assignments(node, now)
    assert {a["id"] for a in assigned} >= {instances[0].iid}
    assert all(a["desired_state"] == "running" for a in assigned)
    report_all(now)
    assert set(Instance.objects.filter(lease=lease).values_list("state", flat=True)) == {"running"}


def test_a_missed_report_makes_a_running_instance_unhealthy_and_restarts_it(fleet):
    now = timezone.now()
    _lease, [inst] = run_lease(now)
    report_all(now)
    report_all(now + timedelta(seconds=5), **{inst.iid: "absent"})
    inst.refresh_from_db()
    assert inst.state == "restarting"
    assert inst.generation == 1
    assert RestartRecord.objects.get(instance=inst).reason == "missing from the agent's report"
