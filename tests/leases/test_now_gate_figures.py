"""The now-gate's figures (leases/planning/prepare.py `observed_extra`, docs/capacity.md): per usable node, the
memory it is seen to use beyond its remembered baseline and what the plan holds there now, and the disk it is
short of what the plan thinks is free."""

from __future__ import annotations

from fleet import capacity
from fleet.nodestate import NodeState
from leases.planning import prepare, records
from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.slottable import Res


def node(node_id, *, used=None, baseline=None, disk_free=None):
    return NodeState(
        node_id, f"n{node_id}", "online", frozenset(), 8, 32768, 500, 1.0,
        observed_mem_total_mib=32768, observed_mem_used_mib=used, disk_free_gib=disk_free,
        idle_baseline_mib=baseline,
    )  # fmt: skip


def test_each_node_is_charged_what_it_is_seen_to_use_beyond_its_baseline_and_its_plan():
    nodes = [
        node(
            1, used=9000, baseline=3000, disk_free=400.0
        ),  # 6,000 MiB beyond its baseline, plan holds 4,096 (and 20 GiB)
        node(
            2, used=9000, baseline=1000, disk_free=None
        ),  # the floor (2,048), not its reading, is its baseline
        node(3, used=None, disk_free=10.0),  # memory unreadable: not charged at all
        node(
            4, used=3000, baseline=3000, disk_free=100.0
        ),  # disk: the plan thinks 480 - 20 free, it has 100 - 20
        node(5, used=99999, disk_free=1.0),  # excluded: never charged
        node(6, used=2048, baseline=2048, disk_free=500.0),  # as planned
    ]
    s = Scheduler({n.id: records.node_capacity(n) for n in nodes}, SchedulerConfig())
    s.submit(LeaseRequest(1, "immediate", 0, None, 3600, (Res(cpu=100, mem=4096, disk=20),)), 0)
    assert (
        s.leases[1].current_vm().nodes == {1: 1} or next(iter(s.leases[1].current_vm().nodes.values())) == 1
    )
    extra, columns = prepare.observed_extra(nodes, s, 10, {5: "draining: maintenance"})
    allocatable_disk = capacity.node_limits(nodes[0]).disk_gib  # 480
    assert extra == {
        1: Res(mem=9000 - 3000 - 4096, disk=allocatable_disk - 20 - (400 - capacity.DISK_RESERVE_GIB)),
        2: Res(mem=9000 - capacity.BASELINE_FLOOR_MIB, disk=0),
        4: Res(mem=0, disk=allocatable_disk - 0 - (100 - capacity.DISK_RESERVE_GIB)),
    }
    rows = s.table.arrays().pos
    assert columns[rows[1]].tolist() == [0, 9000 - 3000 - 4096, 80]
    assert columns[rows[4]].tolist() == [0, 0, allocatable_disk - 80]
    assert columns[rows[5]].tolist() == columns[rows[6]].tolist() == [0, 0, 0]


def test_figures_that_did_not_move_are_the_same_objects_and_the_scheduler_keeps_what_it_derived_from_them():
    """A fleet whose readings did not change since the last pass: observed_extra hands back the very Res objects
    it gave then, so Scheduler.observe finds them unchanged by identity and keeps its now-gate mapping (and what
    explain derived from it) instead of comparing a dataclass per node."""
    nodes = [node(i, used=9000 + i, baseline=3000, disk_free=400.0) for i in range(1, 50)]
    s = Scheduler({n.id: records.node_capacity(n) for n in nodes}, SchedulerConfig())
    first, columns = prepare.observed_extra(nodes, s, 10, {})
    again, _ = prepare.observed_extra(nodes, s, 10, {})
    assert first == again and all(again[n] is first[n] for n in first)
    s.observe(first, columns)
    kept = s._now_extra
    s.observe(again, columns)
    assert s._now_extra is kept
    s.observe({**again, 1: Res(mem=1)}, columns)  # a reading moved: the new figures are taken
    assert s._now_extra is not kept and s._now_extra[1] == Res(mem=1)
    s.observe({1: Res(), 2: Res(disk=3)}, columns)  # a zero figure charges nothing and is not kept
    assert s._now_extra == {2: Res(disk=3)}
