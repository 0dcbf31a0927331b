"""The lazy host order (HostOrder: idle nodes first, from the slot table's columns, the rest scored only when
needed) is exactly the sorted order it replaces, and a whole replay gives the same schedule with it."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace

import pytest

from leases.haizea_config import read_config
from leases.replay import replay, setup
from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.scheduling import mapper
from leases.scheduling.mapper import HostOrder
from leases.slottable import Res
from leases.traces import read_trace
from tests.leases.test_explain_vectorised import random_plan
from tests.leases.test_replay import CONFIG_A, TRACES

VMS = [Res(50, 512, 5), Res(100, 1024, 10), Res(400, 4096, 40)]


@pytest.mark.parametrize("seed", range(10))
def test_the_lazy_order_equals_the_full_sort_on_random_plans(seed):
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([12, 40]))
    nodes = list(s.table.nodes)
    s._use_exclusions({n: "draining" for n in rng.sample(nodes, 2)})
    lazy_seen = 0
    for k in range(25):
        req = LeaseRequest(
            20_000 + k,
            "best_effort",
            3000,
            None,
            rng.choice([60.0, 600.0, 5000.0]),
            tuple(rng.choice(VMS) for _ in range(rng.randint(1, 3))),
            barred=tuple((n, "missing_capability: x") for n in rng.sample(nodes, rng.randint(0, 2))),
        )
        start = rng.choice([0.0, 1000.0, 2999.5, 3000.0, 4200.0, 10.0**6])
        duration = req.duration
        lazy = list(HostOrder(s, req, start, duration))
        full = s._sorted_hosts(s.table, req, start, duration, None)
        assert lazy == full, (seed, k, start, duration)
        lazy_seen += bool(lazy)
    assert lazy_seen > 10, "most requests have somewhere to go"


def test_a_partly_consumed_order_carries_on_where_it_stopped_and_reads_again_from_the_start():
    s = Scheduler({n: Res(100, 1024, 10, 0, 0) for n in range(1, 7)}, SchedulerConfig())
    s.submit(LeaseRequest(1, "best_effort", 0, None, 600, (Res(50, 512),)), 0)  # node 1 half busy
    req = LeaseRequest(2, "best_effort", 0, None, 600, (Res(50, 512),))
    order = HostOrder(s, req, 0, 600)
    it = iter(order)
    first = [next(it), next(it)]
    assert first == [2, 3], "the idle nodes lead, in node order"
    assert list(order) == [2, 3, 4, 5, 6, 1] == s._sorted_hosts(s.table, req, 0, 600, None)


def schedule_digest(result) -> str:
    rows = sorted(
        (lid, r.kind, r.start, r.end, sorted(r.nodes.items()))
        for lid, rec in result.scheduler.leases.items()
        for r in rec.reservations
        if r.status != "cancelled"
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


@pytest.mark.parametrize("trace_path", TRACES[:6], ids=lambda p: p.name)
def test_a_replay_gives_the_same_schedule_with_the_lazy_order_on_every_fleet_size(trace_path, monkeypatch):
    trace = read_trace(trace_path)
    capacities, config = setup(trace, read_config(CONFIG_A))
    eager = replay(trace, capacities, config, check=True)
    monkeypatch.setattr(mapper, "LAZY_NODES", 0)
    lazy = replay(trace, capacities, replace(config), check=True)
    assert schedule_digest(lazy) == schedule_digest(eager)


def test_a_random_busy_fleet_replays_identically_with_the_lazy_order(monkeypatch):
    """Many nodes, overlapping work of every kind, preemption and suspension: the two orders schedule alike."""

    def run() -> str:
        s = random_plan(random.Random(21), 30)
        return hashlib.sha256(
            json.dumps(
                sorted(
                    (lid, r.kind, r.start, r.end, sorted(r.nodes.items()))
                    for lid, rec in s.leases.items()
                    for r in rec.reservations
                    if r.status != "cancelled"
                )
            ).encode()
        ).hexdigest()

    eager = run()
    monkeypatch.setattr(mapper, "LAZY_NODES", 0)
    assert run() == eager


def test_a_report_ranks_the_nodes_the_mapper_handed_out_and_the_idle_ones_not_those_it_never_reached(
    monkeypatch,
):
    monkeypatch.setattr(mapper, "LAZY_NODES", 0)
    s = Scheduler({n: Res(100, 1024, 10, 0, 0) for n in range(1, 7)}, SchedulerConfig())
    s.submit(LeaseRequest(1, "best_effort", 0, None, 600, (Res(50, 512),)), 0)  # node 1 half busy
    s.submit(LeaseRequest(2, "immediate", 0, None, 300, (Res(50, 512),)), 0)
    rec = s.leases[2]
    vm = rec.current_vm()
    assert sorted(set(vm.nodes.values())) == [2], "the first idle node"
    verdicts = {
        v.node: v for v in s.explain(rec.request, vm.start, vm.end, chosen=s.alloc_of(rec, vm)).verdicts
    }
    assert [(n, verdicts[n].rank) for n in range(2, 7)] == [(2, 1), (3, 2), (4, 3), (5, 4), (6, 5)]
    assert verdicts[2].chosen and verdicts[1].holds == 1, "node 1 could hold it too"
    assert verdicts[1].rank is None, "but the mapper never reached it, so it has no rank"


def test_a_batch_sharing_its_now_on_a_fleet_with_no_idle_node_plans_as_the_full_sort_does(monkeypatch):
    """Group commit's shape: many submissions at one `now` with no idle node, so every mapping attempt goes past
    the idle lead into the scored rest, after each placement changed the nodes it touched."""

    def plan(lazy: bool) -> list:
        monkeypatch.setattr(mapper, "LAZY_NODES", 0 if lazy else 1 << 30)
        rng = random.Random(4)
        s = Scheduler({n: Res(800, 8192, 80, 0, 0) for n in range(1, 13)}, SchedulerConfig())
        for n in range(1, 13):  # every node busy with something, ending at different times
            s.submit(LeaseRequest(n, "best_effort", 0, None, 600 * n, (Res(100, 1024),)), 0)
        for i in range(60):
            vnodes = tuple(rng.choice(VMS) for _ in range(rng.randint(1, 2)))
            s.submit(LeaseRequest(100 + i, "best_effort", 100, None, 1800, vnodes), 100, defer=True)
        s.submit(LeaseRequest(999, "best_effort", 100, None, 1800, (VMS[0],)), 100)
        return sorted(
            (lid, r.kind, r.start, r.end, sorted(r.nodes.items()))
            for lid, rec in s.leases.items()
            for r in rec.reservations
            if r.status != "cancelled"
        )

    assert plan(lazy=True) == plan(lazy=False)
