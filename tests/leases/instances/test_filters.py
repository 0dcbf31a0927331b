"""One FilterSet per list: the console and the API narrow the same way."""

from __future__ import annotations

import pytest
from django.utils import timezone

from leases.instances.filters import AlertFilterSet, InstanceFilterSet, RescheduleFilterSet, filtered
from leases.instances.models import Reschedule
from leases.models import Alert, Instance
from tests.leases.instances.helpers import run_lease

pytestmark = pytest.mark.django_db


def test_instances_filter_by_node_id_or_name_by_lease_and_by_several_states(fleet):
    _lease, [inst] = run_lease(timezone.now())
    qs = Instance.objects.all()
    assert list(filtered(InstanceFilterSet, {"node": str(inst.node_id)}, qs)) == [inst]
    assert list(filtered(InstanceFilterSet, {"node": inst.node.name}, qs)) == [inst]
    assert list(
        filtered(InstanceFilterSet, {"lease": str(inst.lease_id), "state": "running,placed"}, qs)
    ) == [inst]
    assert list(filtered(InstanceFilterSet, {"state": "lost"}, qs)) == []


def test_reschedules_filter_by_status_list_group_and_cause(db):
    qs = Reschedule.objects.all()
    # The query alone says the filters apply (no rows are needed to see the WHERE clause).
    where = str(
        filtered(
            RescheduleFilterSet, {"status": "pending,applied", "group": "web", "cause": "drain"}, qs
        ).query
    )
    assert "status" in where and "cause" in where and "name" in where


def test_alerts_filter_open_ones_by_kind(db):
    from leases.alerts import raise_alert

    open_one = raise_alert("node_dead", "n1 is dead", timezone.now())
    # (Raised again for the same subject an open alert counts instead: a second one is made by hand.)
    done = Alert.objects.create(kind="node_dead", message="n2 is dead", created_at=timezone.now())
    Alert.objects.filter(pk=done.pk).update(resolved_at=timezone.now())
    raise_alert("instance_held", "7-1-0 is held", timezone.now())
    assert list(filtered(AlertFilterSet, {"open": "1", "kind": "node_dead"}, Alert.objects.all())) == [
        open_one
    ]
    assert filtered(AlertFilterSet, {"kind": "node_dead"}, Alert.objects.all()).count() == 2
