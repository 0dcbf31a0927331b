"""Group rules across a lease's own VMs, and the now-gate (docs/capacity.md).

A multi-VM lease in a hard anti-affinity group spreads its own VMs (at most max_per_node on a node, counting the
group's members already there); a soft rule is a node tried last. Work starting now must also fit what a node is
observed to use beyond its plan; future reservations are not held to today's observation.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleet import affinity
from fleet.models import Node
from leases import actions as lease_actions
from leases.models import Group, Lease
from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.slottable import Res

SMALL = Res(cpu=100, mem=1024)


def four_nodes() -> Scheduler:
    return Scheduler({n: Res(cpu=800, mem=16384) for n in range(1, 5)}, SchedulerConfig(), strict=True)


def nodes_of(sched: Scheduler, lid: int) -> list[int]:
    return sorted(sched.leases[lid].current_vm().nodes.values())


def test_without_a_rule_the_greedy_mapper_packs_a_leases_vms_on_one_node():
    sched = four_nodes()
    sched.submit(LeaseRequest(1, "immediate", 0, None, 60, (SMALL,) * 3, preemptible=False), 0)
    assert len(set(nodes_of(sched, 1))) == 1


def test_a_hard_anti_affinity_spread_puts_each_of_a_leases_vms_on_its_own_node():
    sched = four_nodes()
    sched.submit(LeaseRequest(1, "immediate", 0, None, 60, (SMALL,) * 3, preemptible=False, spread=1), 0)
    assert len(set(nodes_of(sched, 1))) == 3


def test_members_already_on_a_node_count_against_max_per_node_and_a_full_spread_is_rejected():
    sched = four_nodes()
    req = LeaseRequest(
        1, "immediate", 0, None, 60, (SMALL,) * 3, preemptible=False, spread=1, taken=((1, 1), (2, 1))
    )
    decision = sched.submit(req, 0)
    assert not decision.accepted  # only nodes 3 and 4 may take one each: three VMs cannot be spread
    ok = LeaseRequest(
        2, "immediate", 0, None, 60, (SMALL,) * 2, preemptible=False, spread=1, taken=((1, 1), (2, 1))
    )
    assert sched.submit(ok, 0).accepted
    assert nodes_of(sched, 2) == [3, 4]


def test_a_soft_rule_is_a_preference_the_mapper_tries_last():
    sched = four_nodes()
    req = LeaseRequest(1, "immediate", 0, None, 60, (SMALL,), preemptible=False, avoid=frozenset({1, 2, 3}))
    sched.submit(req, 0)
    assert nodes_of(sched, 1) == [4]


def test_spread_combines_every_hard_rule_and_ignores_soft_ones_for_the_limit():
    web = affinity.GroupMembers(
        affinity.GroupRule("web", "anti_affinity", True, 2), {1: ["a", "b"], 2: ["c"]}
    )
    db = affinity.GroupMembers(affinity.GroupRule("db", "anti_affinity", True, 3), {2: ["d", "e"]})
    soft = affinity.GroupMembers(affinity.GroupRule("cache", "anti_affinity", False, 1), {3: ["f"]})
    got = affinity.spread([web, db, soft], [1, 2, 3, 4])
    assert got.limit == 2
    assert dict(got.taken) == {
        1: 2,
        2: 1,
    }  # node 1 full for web; node 2 has room for one (web 1 of 2, db 2 of 3)
    assert got.avoid == frozenset({3})


def test_the_now_gate_holds_back_work_starting_now_but_not_a_later_reservation():
    sched = Scheduler({1: Res(cpu=400, mem=8192)}, SchedulerConfig(), strict=True)
    sched.observe({1: Res(mem=6144)})  # the host uses 6 GiB more than its plan and baseline say
    now_ = sched.submit(
        LeaseRequest(1, "immediate", 0, None, 60, (Res(cpu=100, mem=4096),), preemptible=False), 0
    )
    assert not now_.accepted
    later = LeaseRequest(2, "advance_reservation", 0, 3600, 60, (Res(cpu=100, mem=4096),), preemptible=False)
    assert sched.submit(later, 0).accepted


def test_a_lease_in_a_hard_group_spreads_its_own_vms_through_the_api(operator, fleet):
    Group.objects.create(name="web", policy="anti_affinity", hard=True, max_per_node=1)
    vm = {"cpu_cores": 1, "mem_mib": 1024}
    body = {"name": "web", "type": "immediate", "duration_s": 600, "nodes": [vm] * 3, "groups": ["web"]}
    response = operator.post("/api/leases/", body, format="json")
    assert response.status_code == 201, response.content
    lease = Lease.objects.get(pk=response.json()["id"])
    placed = lease.reservations.get(kind="vm").nodes
    assert len(set(placed.values())) == 3
    # A fourth and fifth member: only one node is left without a member.
    body["nodes"] = [vm] * 2
    assert operator.post("/api/leases/", body, format="json").status_code == 409


def test_a_node_observed_busier_than_its_plan_takes_no_immediate_lease_but_keeps_a_future_reservation(
    operator, fleet
):
    now = timezone.now()
    # Every host now uses 7 GiB beyond its remembered baseline (as a busy node reports it: the baseline is only
    # re-measured when the node is idle), with nothing planned: 1 GiB of the 8 allocatable is usable now.
    Node.objects.update(obs_mem_used_mib=2048 + 7168)
    vm = {"cpu_cores": 1, "mem_mib": 4096}
    immediate = {"name": "im", "type": "immediate", "duration_s": 600, "nodes": [vm]}
    assert operator.post("/api/leases/", immediate, format="json").status_code == 409
    start = (now + timedelta(hours=2)).replace(microsecond=0).isoformat()
    ar = {"name": "ar", "type": "advance_reservation", "duration_s": 600, "nodes": [vm], "start": start}
    assert operator.post("/api/leases/", ar, format="json").status_code == 201
    small = {
        "name": "small",
        "type": "immediate",
        "duration_s": 600,
        "nodes": [{"cpu_cores": 1, "mem_mib": 512}],
    }
    assert operator.post("/api/leases/", small, format="json").status_code == 201
    lease_actions.advance(now)
