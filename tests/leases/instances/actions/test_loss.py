"""Node loss: lost instances are proposed for a reschedule, held, or failed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.models import Node
from leases import actions
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reschedules
from leases.instances.models import Reschedule
from leases.models import Alert, Instance
from tests.leases.conftest import vm
from tests.leases.instances.helpers import healthy, report_all, run_lease

pytestmark = pytest.mark.django_db


def test_a_dead_node_loses_its_instances_and_an_approved_reschedule_moves_them(fleet):
    now = timezone.now()
    lease, [inst] = run_lease(now)
    report_all(now)
    dead = inst.node
    node_actions.do_declare_dead(None, dead.pk, reason="PSU failed", now=now)
    inst.refresh_from_db()
    assert inst.state == "lost"
    proposal = Reschedule.objects.get(instance=inst)
    assert proposal.status == "pending"
    assert proposal.proposed_node_id not in (None, dead.pk)
    assert len(proposal.report.rows) == 4
    assert next(v for v in proposal.report.rows if v["node"] == dead.name)["reason_code"] == "dead"

    [result] = reschedules.do_approve(None, [proposal.pk], now=now + timedelta(seconds=1))
    assert result.ok, result.message
    inst.refresh_from_db()
    new = Instance.objects.get(iid=result.new_instance)
    assert (inst.state, new.state, new.generation, new.replaces_id) == ("rescheduled", "placed", 1, inst.pk)
    assert new.node.name == result.node != dead.name
    # The slot table followed the vnode.
    vm_res = lease.reservations.get(kind="vm")
    assert list(vm_res.nodes.values()) == [new.node_id]
    assert set(vm_res.allocations.values_list("node_id", flat=True)) == {new.node_id}
    # Declared dead, the node is fenced: its heartbeats are refused until an admin re-admits it. Then it comes
    # back; its agent no longer runs the old instance, which is then unloaded.
    with pytest.raises(fleet_actions.Fenced):
        healthy(dead, now + timedelta(seconds=20), [])
    fleet_actions.do_readmit(None, dead.pk, reason="PSU replaced", now=now + timedelta(seconds=25))
    healthy(dead, now + timedelta(seconds=30), [])
    inst.refresh_from_db()
    assert inst.state == "unloaded"


def test_an_instance_needing_node_hardware_is_held_with_an_alert(fleet):
    now = timezone.now()
    Node.objects.update(capabilities=["sensor.camera0"])
    spec = actions.LeaseSpec(
        name="cam", type="immediate", duration_s=600, vnodes=[vm()], capabilities=("sensor.camera0",)
    )
    lease = actions.do_submit_lease(None, spec, now=now).lease
    inst = Instance.objects.get(lease=lease)
    node_actions.do_declare_dead(None, inst.node_id, reason="power", now=now)
    inst.refresh_from_db()
    assert inst.state == "lost"
    assert not Reschedule.objects.exists()
    assert "sensor.camera0" in Alert.objects.get(kind="instance_held").message


def test_a_lease_that_is_not_migratable_is_held_and_a_spent_budget_fails(fleet):
    now = timezone.now()
    _, [held] = run_lease(now, name="pinned", migratable=False)
    _, [spent] = run_lease(now, name="spent", max_reschedules=0)
    for node_id in {held.node_id, spent.node_id}:
        node_actions.do_declare_dead(None, node_id, reason="gone", now=now)
    held.refresh_from_db()
    spent.refresh_from_db()
    assert held.state == "lost"
    assert spent.state == "failed"
    assert Alert.objects.filter(kind="instance_held", instance=held).exists()
    assert Alert.objects.filter(kind="reschedule_budget_spent", instance=spent).exists()
