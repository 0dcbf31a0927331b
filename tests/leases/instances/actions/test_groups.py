"""Group actions: every change is one transaction with its audit row, and a hard rule the members already break
is named the same way the placer would refuse it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from leases import actions
from leases.instances.actions import groups
from leases.models import Group
from slotkeeper.models import AuditEntry
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def run(name):
    spec = actions.LeaseSpec(name=name, type="immediate", duration_s=3600, vnodes=[vm()])
    return actions.do_submit_lease(None, spec, now=timezone.now()).lease


def test_create_update_and_delete_each_write_their_audit_row(fleet):
    now = timezone.now()
    lease = run("a")
    group = groups.do_create_group(None, now=now, leases=[lease], name="web", policy="anti_affinity")
    assert list(group.leases.all()) == [lease]
    groups.do_update_group(None, group, now=now, max_per_node=2, leases=[])
    group.refresh_from_db()
    assert (group.max_per_node, group.leases.count()) == (2, 0)
    groups.do_delete_group(None, group, now=now)
    assert not Group.objects.filter(name="web").exists()
    assert sorted(AuditEntry.objects.filter(target_type="group").values_list("action", flat=True)) == [
        "group.create",
        "group.delete",
        "group.update",
    ]


def test_a_second_group_of_the_same_name_is_a_domain_error(fleet):
    groups.do_create_group(None, now=timezone.now(), name="web", policy="affinity")
    with pytest.raises(groups.DomainError, match="already exists"):
        groups.do_create_group(None, now=timezone.now(), name="web", policy="affinity")


def test_members_already_on_two_nodes_break_affinity_and_crowded_members_break_anti_affinity(fleet):
    a, b = run("a"), run("b")
    nodes = {i.node_id for lease in (a, b) for i in lease.instances.all()}
    if len(nodes) == 2:
        assert "not on one node" in groups.violation("affinity", 1, [a.pk, b.pk])
        assert groups.violation("anti_affinity", 1, [a.pk, b.pk]) == ""
    else:
        assert "at most 1 per node" in groups.violation("anti_affinity", 1, [a.pk, b.pk])
    assert groups.violation("anti_affinity", 2, [a.pk, b.pk]) == ""
