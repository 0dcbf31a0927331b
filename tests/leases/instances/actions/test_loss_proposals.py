"""The reschedule proposals of a loss account for each other: each proposal's dry run sees the capacity (and the
group membership) of the proposals made before it, so they spread over nodes that can really hold them, and an
instance that fits nowhere once the earlier proposals are counted says so. Nothing is reserved by a proposal;
approval re-checks everything as before."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reschedules
from leases.instances.models import Reschedule
from leases.models import Group, Instance, Reservation
from tests.leases.conftest import DECLARED_MIB
from tests.leases.instances.helpers import healthy, run_lease

pytestmark = pytest.mark.django_db

SURVIVORS = ("tank", "architect", "morpheus")


def node(name, now, *, mem=DECLARED_MIB, cores=8):
    """A node with `mem` declared (DECLARED_MIB leaves 8 GiB allocatable and free to the placer), heartbeating."""
    made, _ = fleet_actions.do_register_node(
        None, name=name, cpu_cores=cores, mem_total_mib=mem, disk_total_gib=100, capabilities=[], now=now
    )
    return healthy(made, now)


def test_the_proposals_of_one_dead_node_spread_over_nodes_that_can_hold_them(db):
    # Five 6 GiB instances on oracle; tank, architect and morpheus each have room for one of them. Each proposal
    # used to be a dry run of its own, and all five named the same node.
    now = timezone.now()
    oracle = node("oracle", now, mem=DECLARED_MIB * 4)
    lease, lost = run_lease(now, vnodes=5, mem=6144)
    assert {i.node_id for i in lost} == {oracle.pk}
    for name in SURVIVORS:
        node(name, now)
    node_actions.do_declare_dead(None, oracle.pk, reason="PSU failed", now=now)
    proposals = list(Reschedule.objects.filter(lease=lease).order_by("pk"))
    assert len(proposals) == 5
    placed = [p for p in proposals if p.proposed_node_id is not None]
    assert sorted(p.proposed_node.name for p in placed) == sorted(SURVIVORS)
    # The other two fit nowhere once the first three are counted, and say why.
    blocked = [p for p in proposals if p.proposed_node_id is None]
    assert len(blocked) == 2
    assert {p.blocked_by for p in blocked} == {"at_capacity"}
    # Proposing placed no instance, but each proposal holds its target's room in the slot table (issue 45).
    assert not Instance.objects.filter(lease=lease, state="placed").exists()
    holds = Reservation.objects.filter(lease=lease, kind="hold", status="active")
    assert sorted(h.nodes.popitem()[1] for h in holds) == sorted(p.proposed_node_id for p in placed)
    assert sorted(holds.values_list("rid", flat=True)) == sorted(p.hold_rid for p in placed)
    # Approving the proposals that named a node moves each where it was proposed.
    results = reschedules.do_approve(None, [p.pk for p in placed], now=now)
    assert all(r.ok for r in results), [r.message for r in results]
    assert sorted(r.node for r in results) == sorted(SURVIVORS)


def test_the_proposals_of_one_loss_keep_an_anti_affinity_group_apart(db):
    now = timezone.now()
    oracle = node("oracle", now, mem=DECLARED_MIB * 4)
    group = Group.objects.create(name="web", policy="anti_affinity", hard=True)
    for i in range(3):
        lease, _ = run_lease(now, name=f"web-{i}", mem=1024)
        group.leases.add(lease)  # after placement: all three on oracle, the only node then
    survivors = [node(name, now) for name in SURVIVORS[:2]]
    node_actions.do_declare_dead(None, oracle.pk, reason="rack power", now=now)
    proposals = list(Reschedule.objects.order_by("pk"))
    targets = [p.proposed_node_id for p in proposals if p.proposed_node_id is not None]
    # Room for all three on either survivor; the group allows one per node.
    assert sorted(targets) == sorted(n.pk for n in survivors)
    [blocked] = [p for p in proposals if p.proposed_node_id is None]
    assert blocked.blocked_by == "anti_affinity"
    assert "(proposed)" in next(v for v in blocked.report.rows if v["node"] == "tank")["reason"]


def test_a_second_loss_counts_the_proposals_still_pending_from_the_first(db):
    # Two nodes declared dead one after the other (as the sweep does, one transaction per node): the second
    # loss's proposal sees the first's pending proposal on its target.
    now = timezone.now()
    first = node("oracle-a", now)
    run_lease(now, name="a", mem=6144)
    second = node("oracle-b", now)
    run_lease(now, name="b", mem=6144)
    assert Instance.objects.get(lease__name="b").node_id == second.pk
    for name in SURVIVORS[:2]:
        node(name, now)
    node_actions.do_declare_dead(None, first.pk, reason="rack power", now=now)
    node_actions.do_declare_dead(None, second.pk, reason="rack power", now=now)
    targets = list(Reschedule.objects.order_by("pk").values_list("proposed_node__name", flat=True))
    assert sorted(targets) == sorted(SURVIVORS[:2])
