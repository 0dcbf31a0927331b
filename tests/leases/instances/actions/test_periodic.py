"""The composed periodic step: the sweep loses what ran on the nodes it found dead, in the same pass."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Node
from leases.instances.actions import periodic
from leases.models import Alert
from tests.leases.instances.helpers import healthy, report_all, run_lease

pytestmark = pytest.mark.django_db


def test_the_periodic_sweep_declares_a_silent_node_dead_and_loses_its_instances(fleet):
    now = timezone.now()
    _lease, [inst] = run_lease(now)
    report_all(now)
    silent = inst.node
    for seconds in range(5, 100, 5):
        for node in Node.objects.exclude(pk=silent.pk):
            healthy(node, now + timedelta(seconds=seconds))
        result = periodic.sweep(now + timedelta(seconds=seconds))
        if result.dead:
            break
    assert result.dead == [silent.name]
    inst.refresh_from_db()
    assert inst.state == "lost"
    assert Alert.objects.filter(kind="node_dead", node=silent).exists()
