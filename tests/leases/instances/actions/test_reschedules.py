"""Instances on nodes: placement from leases, agent reports, bounded restarts, node loss, approved reschedules,
groups that hold (seed 002)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.models import Node
from leases import actions, instance_rows
from leases.instances import reads
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic, reschedules
from leases.instances.models import Reschedule, RestartRecord
from leases.models import Alert, Group, Instance
from leases.slottable import Res  # noqa: F401  (imported for readers: vnode sizes are Res in the slot table)
from slotkeeper.domain import DomainError, StaleVersion
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def healthy(node, now, instances=()):
    node = Node.objects.get(pk=node.pk)
    report = fleet_actions.HealthReport(node.mem_total_mib, 1000, 90.0, 1.0, 0.1, tuple(instances))
    return node_actions.do_heartbeat(node, report, now=now)


def run_lease(now, *, vnodes=1, mem=1024, name="job", **policy) -> tuple:
    spec = actions.LeaseSpec(name=name, type="immediate", duration_s=3600, vnodes=[vm(mem=mem)] * vnodes)
    result = actions.do_submit_lease(None, spec, now=now)
    lease = result.lease
    if policy:
        for key, value in policy.items():
            setattr(lease, key, value)
        lease.save(update_fields=list(policy))
    return lease, list(Instance.objects.filter(lease=lease).order_by("vnode"))


def report_all(now, **status_by_iid):
    """Every node's agent reports what it runs: all placed instances running unless told otherwise."""
    for node in Node.objects.exclude(status="dead"):
        reports = []
        for inst in Instance.objects.filter(node=node, state__in=instance_rows.LIVE, desired_state="running"):
            status = status_by_iid.get(inst.iid, "running")
            if status != "absent":
                reports.append(
                    {"id": inst.iid, "status": status, "exit_code": 3 if status == "exited" else None}
                )
        healthy(node, now, reports)


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


def test_a_crash_looping_instance_is_restarted_with_backoff_then_failed(fleet):
    now = timezone.now()
    _lease, [inst] = run_lease(now)
    report_all(now)
    t = now
    for _ in range(8):
        inst.refresh_from_db()
        if inst.state == "failed":
            break
        t += timedelta(seconds=0.5)
        periodic.tick(t)  # due restarts go
        inst.refresh_from_db()
        report_all(t, **{inst.iid: "exited"})
    inst.refresh_from_db()
    assert inst.state == "failed"
    history = list(RestartRecord.objects.filter(instance=inst).values_list("attempt", "decision"))
    # Attempt 1 goes at once, attempt 2 waits 1 s, attempt 3 waits 2 s; the fourth failure finds 3 restarts in the
    # window and the policy exhausted.
    assert [d for _, d in history if d == "restart"] == ["restart"] * 3
    assert history[-1][1] == "exhausted"
    assert any(d == "wait" for _, d in history)
    assert inst.generation == 3  # one new generation per restart: the agent never reruns a generation
    assert Alert.objects.filter(kind="restarts_exhausted", instance=inst).exists()
    waits = RestartRecord.objects.filter(instance=inst, decision="wait").order_by("at")
    assert all(w.next_eligible_at is not None for w in waits)


def test_a_missed_report_makes_a_running_instance_unhealthy_and_restarts_it(fleet):
    now = timezone.now()
    _lease, [inst] = run_lease(now)
    report_all(now)
    report_all(now + timedelta(seconds=5), **{inst.iid: "absent"})
    inst.refresh_from_db()
    assert inst.state == "restarting"
    assert inst.generation == 1
    assert RestartRecord.objects.get(instance=inst).reason == "missing from the agent's report"


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
    assert len(proposal.report.verdicts) == 4
    assert next(v for v in proposal.report.verdicts if v["node"] == dead.name)["reason_code"] == "dead"

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
    verdict = next(v for v in pending.report.verdicts if v["node"] == survivor.name)
    assert verdict["reason_code"] == "anti_affinity"
    assert f"group web already has instance {landed.get().iid} here" in verdict["reason"]


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
