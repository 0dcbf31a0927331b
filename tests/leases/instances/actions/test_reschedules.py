"""Reschedules: approval with versions, evacuations of an anti-affinity group, and bulk approvals that account for
each other (capacity and groups) within one batch."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.nodestate import BASELINE_FLOOR_MIB, HOST_RESERVE_MIB
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reschedules
from leases.instances.models import Reschedule
from leases.models import Allocation, Group, Instance
from leases.slottable import Res  # noqa: F401  (imported for readers: vnode sizes are Res in the slot table)
from slotkeeper.domain import DomainError, StaleVersion
from tests.leases.instances.helpers import healthy, run_lease
from tests.leases.invariants import overcommitted_instants

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


def make_node(name, now, *, allocatable_mib, cores=4):
    node, _ = fleet_actions.do_register_node(
        None,
        name=name,
        cpu_cores=cores,
        mem_total_mib=allocatable_mib + HOST_RESERVE_MIB + BASELINE_FLOOR_MIB,
        disk_total_gib=100,
        capabilities=[],
        now=now,
    )
    return healthy(node, now)


def lose_five_on_one_node(now):
    """Five 3 GiB leases on host1, then two survivors: host2 holds three more, host3 one. host1 dies: the proposals
    name host2 three times and host3 once, and the fifth no node."""
    dying = make_node("host1", now, allocatable_mib=18432, cores=8)
    for i in range(5):
        run_lease(now, name=f"job-{i}", mem=3072)
    host2 = make_node("host2", now, allocatable_mib=10240)
    host3 = make_node("host3", now, allocatable_mib=4096)
    node_actions.do_declare_dead(None, dying.pk, reason="rack power", now=now)
    proposals = list(Reschedule.objects.order_by("pk"))
    assert len(proposals) == 5
    return proposals, host2, host3


def test_approvals_in_one_batch_account_for_each_other_and_the_one_that_no_longer_fits_stays_pending(db):
    now = timezone.now()
    proposals, host2, host3 = lose_five_on_one_node(now)
    results = reschedules.do_approve(None, [p.pk for p in proposals], now=now)
    assert [r.code for r in results] == ["applied"] * 4 + ["pending"], [r.message for r in results]
    # host2 took the three it holds; the fourth went to host3, saying why the proposed node was passed over.
    assert [r.node for r in results[:4]] == ["host2", "host2", "host2", "host3"]
    assert Instance.objects.filter(state="placed", node=host2).count() == 3
    assert Instance.objects.filter(state="placed", node=host3).count() == 1
    assert overcommitted_instants() == []
    left = Reschedule.objects.get(pk=proposals[4].pk)
    assert left.status == "pending" and left.blocked_by in ("at_capacity", "reserved")
    assert left.message.startswith("still pending: fleet at capacity: needs 1 × (1 core, 3 GiB"), left.message
    assert left.report.outcome == "fleet_at_capacity" and left.report.chosen == []
    assert {row["node"]: row["fit"] for row in left.report.rows} == {
        "host1": False,
        "host2": False,
        "host3": False,
    }


def test_each_applied_approval_stores_the_schedulers_verdict_over_the_vnodes_remaining_time(db):
    now = timezone.now()
    proposals, host2, _ = lose_five_on_one_node(now)
    reschedules.do_approve(None, [proposals[0].pk], now=now)
    proposal = Reschedule.objects.select_related("report", "new_instance").get(pk=proposals[0].pk)
    report = proposal.report
    assert report.subject == f"reschedule:{proposal.instance.iid}"
    assert report.chosen == ["host2"] and report.verdicts["chosen"] == [host2.pk]
    # Over the rest of the lease's reservation, not a placer snapshot of this instant.
    reservation = Allocation.objects.get(reservation__lease=proposal.lease, live=True)
    assert (report.verdicts["start"], report.verdicts["end"]) == (
        now.timestamp(),
        reservation.end.timestamp(),
    )
    assert reservation.node_id == host2.pk
    rows = {row["node"]: row for row in report.rows}
    assert rows["host1"]["reason_code"] == "dead"
    assert rows["host2"]["fit"] and rows["host2"]["chosen"]


def test_an_anti_affinity_group_holds_when_its_whole_evacuation_is_approved_in_one_batch(db):
    """Three members of a hard anti-affinity group on three nodes that die together; four survivors. One batch:
    three different survivors."""
    now = timezone.now()
    doomed = [make_node(f"old{i}", now, allocatable_mib=4096) for i in range(3)]
    group = Group.objects.create(name="db", policy="anti_affinity", hard=True)
    for i in range(3):
        lease, [_inst] = run_lease(now, name=f"db-{i}", mem=3072)
        group.leases.add(lease)
    assert len({i.node_id for i in Instance.objects.all()}) == 3
    survivors = [make_node(f"new{i}", now, allocatable_mib=16384) for i in range(4)]
    for node in doomed:
        node_actions.do_declare_dead(None, node.pk, reason="rack power", now=now)
    proposals = list(Reschedule.objects.order_by("pk"))
    results = reschedules.do_approve(None, [p.pk for p in proposals], now=now)
    assert all(r.ok for r in results), [r.message for r in results]
    placed = list(Instance.objects.filter(state="placed").values_list("node_id", flat=True))
    assert len(placed) == 3 and len(set(placed)) == 3 and set(placed) <= {n.pk for n in survivors}


def test_a_batch_placed_by_the_scheduler_keeps_filling_nodes_after_each_move(db):
    """The proposed node is gone, so every approval of the batch is mapped by the scheduler, which keeps per-node
    answers (room counts, fits, host scores) between placements. A move must drop them for the nodes it touched:
    before, the third approval was mapped onto a node the first two had just filled, and left pending while
    another node had room (a bulk approval stalled at 1,020 of 1,600 in bench_recovery)."""
    now = timezone.now()
    dying = make_node("host1", now, allocatable_mib=18432, cores=8)
    for i in range(5):
        run_lease(now, name=f"job-{i}", mem=3072)
    proposed = make_node("host2", now, allocatable_mib=65536, cores=32)
    host3 = make_node("host3", now, allocatable_mib=6144)  # holds two
    host4 = make_node("host4", now, allocatable_mib=9216)  # holds three
    node_actions.do_declare_dead(None, dying.pk, reason="rack power", now=now)
    proposals = list(Reschedule.objects.order_by("pk"))
    assert {p.proposed_node_id for p in proposals} == {proposed.pk}
    node_actions.do_declare_dead(None, proposed.pk, reason="it went too", now=now)
    results = reschedules.do_approve(None, [p.pk for p in proposals], now=now)
    assert all(r.ok for r in results), [r.message for r in results]
    assert Instance.objects.filter(state="placed", node=host3).count() == 2
    assert Instance.objects.filter(state="placed", node=host4).count() == 3
    assert "the proposed node host2 no longer fits (dead:" in results[0].message
    assert overcommitted_instants() == []


def test_a_proposal_whose_lease_ended_is_withdrawn_by_the_next_tick(fleet):
    """Found by an outsider: a lease ended with its lost instance's proposal still pending, waiting for an approval
    that could only fail; the console counted it among the pending."""
    from leases import actions as lease_actions
    from leases.instances.actions import periodic
    from slotkeeper.models import AuditEntry

    now = timezone.now()
    lease, [inst] = run_lease(now)
    node_actions.do_declare_dead(None, inst.node_id, reason="gone", now=now)
    proposal = Reschedule.objects.get(instance=inst, status="pending")
    lease_actions.do_cancel_lease(None, lease.pk, now=now, reason="no longer needed")
    periodic.tick(now)
    proposal.refresh_from_db()
    assert (proposal.status, proposal.decided_by) == ("rejected", "system")
    assert proposal.message == f"withdrawn: lease {lease.pk} is cancelled, nothing left to move"
    assert AuditEntry.objects.filter(action="reschedule.withdraw", target_id=str(proposal.pk)).count() == 1
    periodic.tick(now)  # once only
    assert AuditEntry.objects.filter(action="reschedule.withdraw").count() == 1


def test_approving_a_proposal_whose_lease_ended_is_not_recorded_as_the_approver_s_rejection(fleet):
    from leases import actions as lease_actions

    now = timezone.now()
    lease, [inst] = run_lease(now)
    node_actions.do_declare_dead(None, inst.node_id, reason="gone", now=now)
    proposal = Reschedule.objects.get(instance=inst, status="pending")
    lease_actions.do_cancel_lease(None, lease.pk, now=now, reason="no longer needed")
    [result] = reschedules.do_approve(None, [proposal.pk], now=now)
    assert (result.ok, result.code) == (False, "conflict")
    proposal.refresh_from_db()
    assert (proposal.status, proposal.decided_by) == ("rejected", "system")
    assert proposal.message.startswith("withdrawn when system approved it, nothing to move: lease")
