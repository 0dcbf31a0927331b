"""Reschedules: approval with versions, and two evacuations of an anti-affinity group."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reschedules
from leases.instances.models import Reschedule
from leases.models import Group, Instance
from leases.slottable import Res  # noqa: F401  (imported for readers: vnode sizes are Res in the slot table)
from slotkeeper.domain import DomainError, StaleVersion
from tests.leases.instances.helpers import healthy, run_lease

pytestmark = pytest.mark.django_db


def test_approving_twice_is_a_conflict_and_a_stale_version_is_refused(fleet):
    now = timezone.now()
    _lease, [inst] = run_lease(now)
    node_actions.do_declare_dead(None, inst.node_id, reason="gone", now=now)
    proposal = Reschedule.objects.get(instance=inst)
    with pytest.raises(StaleVersion):
        reschedules.do_approve(None, [proposal.pk], now=now, versions={proposal.pk: proposal.version + 1})
    reschedules.do_approve(None, [proposal.pk], now=now)
    with pytest.raises(DomainError, match="already applied"):
        reschedules.do_approve(None, [proposal.pk], now=now)


def test_two_evacuations_of_an_anti_affinity_group_never_share_the_survivor(db):
    """Seed 002 (Nova bug 1735407): three nodes, the group's two members on two of them, both nodes die, both moves
    approved together. Exactly one lands on the survivor; the other stays pending with reason anti_affinity."""
    now = timezone.now()
    nodes = []
    for name in ("host1", "host2", "host3"):
        node, _ = fleet_actions.do_register_node(
            None, name=name, cpu_cores=4, mem_total_mib=16384, disk_total_gib=100, capabilities=[], now=now
        )
        nodes.append(healthy(node, now))
    group = Group.objects.create(name="web", policy="anti_affinity", hard=True)
    members = []
    for i in range(2):
        # 8 GiB each: the survivor (16 GiB, less its reserve) could hold both, so only the group can stop it.
        lease, [inst] = run_lease(now, name=f"web-{i}", mem=4096)
        group.leases.add(lease)
        members.append(inst)
    assert members[0].node_id != members[1].node_id
    survivor = next(n for n in nodes if n.pk not in {m.node_id for m in members})
    for m in members:
        node_actions.do_declare_dead(None, m.node_id, reason="rack power", now=now)
    proposals = list(Reschedule.objects.order_by("pk"))
    assert len(proposals) == 2
    results = reschedules.do_approve(None, [p.pk for p in proposals], now=now)
    assert sorted(r.ok for r in results) == [False, True], [r.message for r in results]
    landed = Instance.objects.filter(state="placed", node=survivor)
    assert landed.count() == 1
    pending = Reschedule.objects.get(status="pending")
    assert pending.blocked_by == "anti_affinity"
    verdict = next(v for v in pending.report.rows if v["node"] == survivor.name)
    assert verdict["reason_code"] == "anti_affinity"
    assert f"group web already has instance {landed.get().iid} here" in verdict["reason"]
