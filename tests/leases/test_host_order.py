"""The lazy host order (HostOrder: idle nodes first, from the slot table's columns, the rest scored only when
needed) is exactly the sorted order it replaces, and a whole replay gives the same schedule with it."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import replace

import pytest

from leases.haizea_config import read_config
from leases.replay import replay, setup
from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.scheduling import mapper
from leases.scheduling.mapper import HostOrder
from leases.slottable import Res, SlotTable
from leases.traces import read_trace
from tests.leases.test_explain_vectorised import random_plan
from tests.leases.test_replay import CONFIG_A, TRACES

VMS = [Res(50, 512, 5), Res(100, 1024, 10), Res(400, 4096, 40)]


def summary_span_reference(table: SlotTable, node: int, t: float) -> tuple[int, float, float]:
    """mapper.summary_span as first written (the state summed again at every point): the oracle of the sweep."""
    rows = [(r.start, r.end, r.lease_id, r.alloc[node]) for r in table.reservations(start=t, node=node)]

    def state_at(x: float) -> tuple[Res, frozenset[int]]:
        used = Res()
        leases: set[int] = set()
        for a, b, lid, use in rows:
            if a <= x < b:
                used = used + use
                leases.add(lid)
        return used, frozenset(leases)

    now = state_at(t)
    points = sorted({p for a, b, _, _ in rows for p in (a, b) if p > t})
    change = next((x for x in points if state_at(x) != now), math.inf)
    return len(now[1]), change, points[0] if points else math.inf


@pytest.mark.parametrize("seed", range(10))
def test_the_lazy_order_equals_the_full_sort_on_random_plans(seed):
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([12, 40]))
    nodes = list(s.table.nodes)
    s.use_exclusions({n: "draining" for n in rng.sample(nodes, 2)})
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


def test_a_dry_run_that_would_place_ranks_the_same_nodes_as_the_report_of_the_lease_placed(monkeypatch):
    """A preview's verdicts are its dry run's (`proposed`); they rank what the placed lease's report ranks, not
    every node the mapper never reached."""
    monkeypatch.setattr(mapper, "LAZY_NODES", 0)
    s = Scheduler({n: Res(100, 1024, 10, 0, 0) for n in range(1, 7)}, SchedulerConfig())
    s.submit(LeaseRequest(1, "best_effort", 0, None, 600, (Res(50, 512),)), 0)  # node 1 half busy
    probe = LeaseRequest(-1, "immediate", 0, None, 300, (Res(50, 512),))
    picked = s.propose(probe, 0, 300, {})
    dry = {v.node: v for v in s.explain(probe, 0, 300, proposed=picked).verdicts}
    s.submit(LeaseRequest(2, "immediate", 0, None, 300, (Res(50, 512),)), 0)
    rec = s.leases[2]
    vm = rec.current_vm()
    placed = {
        v.node: v for v in s.explain(rec.request, vm.start, vm.end, chosen=s.alloc_of(rec, vm)).verdicts
    }
    assert picked == [2] and dry[2].chosen and placed[2].chosen
    assert {n: v.rank for n, v in dry.items()} == {n: v.rank for n, v in placed.items()}
    assert dry[1].holds == 1 and dry[1].rank is None, "node 1 could hold it, but the mapper never reached it"


def test_a_batch_sharing_its_now_on_a_fleet_with_no_idle_node_plans_as_the_full_sort_does(monkeypatch):
    """Group commit's shape: many submissions at one `now` with no idle node, so every mapping attempt goes past
    the idle lead into the scored rest, after each placement changed the nodes it touched."""

    def plan(lazy: bool) -> list:
        monkeypatch.setattr(mapper, "LAZY_NODES", 0 if lazy else 1 << 30)
        return busy_batch(random.Random(4), 12, lambda n: (600 * n, Res(100, 1024)), 60, 2)

    assert plan(lazy=True) == plan(lazy=False)


def busy_batch(rng: random.Random, nodes: int, busy, batch: int, most_vms: int) -> list:
    """The plan (sorted live reservations) of a fleet whose every node is busy with one lease (`busy(n)`: its
    duration and size, so they end at different times), then `batch` submissions sharing one `now`."""
    s = Scheduler({n: Res(800, 8192, 80, 0, 0) for n in range(1, nodes + 1)}, SchedulerConfig())
    for n in range(1, nodes + 1):
        duration, size = busy(n)
        s.submit(LeaseRequest(n, "best_effort", 0, None, duration, (size,)), 0)
    for i in range(batch):
        vnodes = tuple(rng.choice(VMS) for _ in range(rng.randint(1, most_vms)))
        s.submit(LeaseRequest(100 + i, "best_effort", 100, None, 1800, vnodes), 100, defer=True)
    s.submit(LeaseRequest(999, "best_effort", 100, None, 1800, (VMS[0],)), 100)  # runs the queue once
    return sorted(
        (lid, r.kind, r.start, r.end, sorted(r.nodes.items()))
        for lid, rec in s.leases.items()
        for r in rec.reservations
        if r.status != "cancelled"
    )


@pytest.mark.parametrize("seed", [4, 9])
def test_a_busy_batch_plans_the_same_whether_the_rest_of_the_order_comes_from_the_columns_or_from_scoring(
    seed, monkeypatch
):
    """HostOrder._rest orders the nodes with room by the kept score columns (Summaries); with the columns never
    kept, it scores each node as _sorted_hosts does. A busy batch sharing its `now` plans the same either way, and
    as the full sort."""

    def plan(lazy: bool, columns: bool) -> list:
        with monkeypatch.context() as m:
            m.setattr(mapper, "LAZY_NODES", 0 if lazy else 1 << 30)
            if not columns:
                m.setattr(mapper.Mapper, "_summary_columns", lambda self, start: None)
            return busy_batch(
                random.Random(seed), 24, lambda n: (300 * n, Res(100 * (n % 4 + 1), 1024)), 120, 3
            )

    from_columns = plan(lazy=True, columns=True)
    assert from_columns == plan(lazy=True, columns=False) == plan(lazy=False, columns=False)
    assert len({lid for lid, *_ in from_columns}) > 24, (
        "the batch placed leases past the busy nodes' first ones"
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_rest_of_a_lazy_order_is_the_sorted_order_with_exclusions_barred_nodes_and_ties(
    seed, monkeypatch
):
    """The columns' order of the nodes with room, less the idle lead and the barred nodes, is _sorted_hosts'
    order scored node by node, ties in node order, while the plan changes between asks."""
    monkeypatch.setattr(mapper, "LAZY_NODES", 0)
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([12, 40]))
    nodes = list(s.table.nodes)
    s.use_exclusions({n: "draining" for n in rng.sample(nodes, 2)})
    used = 0
    for k in range(40):
        start = rng.choice([3000.0, 3000.0, 3600.5])
        req = LeaseRequest(
            50_000 + k,
            "best_effort",
            start,
            None,
            rng.choice([60.0, 600.0, 5000.0]),
            tuple(rng.choice(VMS) for _ in range(rng.randint(1, 3))),
            barred=tuple((n, "missing_capability: x") for n in rng.sample(nodes, rng.randint(0, 3))),
        )
        got = list(HostOrder(s, req, start, req.duration))
        used += start in s._summaries
        with monkeypatch.context() as m:
            m.setattr(mapper.Mapper, "_summary_columns", lambda self, start: None)
            want = s._sorted_hosts(s.table, req, start, req.duration, None)
        assert got == want, (seed, k)
        if rng.random() < 0.6:
            s.submit(replace(req, id=60_000 + k, barred=()), start)
        else:
            placed = [lid for lid, rec in s.leases.items() if rec.state == "scheduled"]
            if placed:
                s.cancel(rng.choice(placed), start)
    assert used > 20, "the columns were used for most orders"


@pytest.mark.parametrize("seed", range(8))
def test_the_score_columns_order_nodes_as_scoring_each_node_does_while_the_plan_changes(seed, monkeypatch):
    """Mapper.Summaries: the kept columns give the very order the per-node score gives, at a start asked for
    again and again while leases are placed (the columns must follow every write), with and without `avoid`."""
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([12, 40]))
    nodes = list(s.table.nodes)
    s.use_exclusions({n: "draining" for n in rng.sample(nodes, 2)})
    built = 0
    for k in range(40):
        start = rng.choice([3000.0, 3000.0, 3000.0, 3600.5])  # one shared `now`, as a batch of approvals has
        req = LeaseRequest(
            30_000 + k,
            "immediate",
            start,
            start,
            rng.choice([0.0, 60.0, 600.0, 5000.0]),
            tuple(rng.choice(VMS) for _ in range(rng.randint(1, 3))),
            avoid=frozenset(rng.sample(nodes, rng.randint(0, 4))),
            barred=tuple((n, "missing_capability: x") for n in rng.sample(nodes, rng.randint(0, 2))),
        )
        got = s._sorted_hosts(s.table, req, start, req.duration, None)
        built += start in s._summaries
        with monkeypatch.context() as m:
            m.setattr(mapper.Mapper, "_summary_columns", lambda self, start: None)
            want = s._sorted_hosts(s.table, req, start, req.duration, None)
        assert got == want, (seed, k)
        # Change the plan where the columns are kept: a lease placed now, or one taken out of the plan.
        if rng.random() < 0.6:
            s.submit(replace(req, id=40_000 + k, avoid=frozenset(), barred=()), start)
        else:
            placed = [lid for lid, rec in s.leases.items() if rec.state == "scheduled"]
            if placed:
                s.cancel(rng.choice(placed), start)
    assert built > 20, "the columns were used for most orders"


@pytest.mark.parametrize("seed", range(10))
def test_the_swept_summary_is_the_summary_summed_at_every_point(seed):
    """mapper.summary_span (a sweep over starts and ends) answers what summing the state at every point answers,
    at instants on, between and after reservation edges, back-to-back reservations of one lease included."""
    rng = random.Random(seed)
    s = random_plan(rng, 12)
    edges = sorted({x for r in s.table.reservations() for x in (r.start, r.end)})
    instants = [0.0, *edges, *(x - 0.5 for x in edges), *(x + 0.5 for x in edges)]
    for node in s.table.nodes:
        for t in instants:
            assert mapper.summary_span(s.table, node, t) == summary_span_reference(s.table, node, t)


def test_the_idle_nodes_leading_the_order_are_those_large_enough_in_every_dimension():
    # Nodes 1-2 small, 3-4 large; node 4 without network. The idle nodes lead only where the smallest vnode fits
    # when empty: in cpu, memory and disk (tested over the whole fleet at once) and in the network dimensions.
    sizes = {1: Res(100, 1024, 10, 100, 100), 2: Res(100, 1024, 10, 100, 100)}
    sizes |= {3: Res(800, 16384, 80, 100, 100), 4: Res(800, 16384, 80, 0, 0)}
    s = Scheduler(sizes, SchedulerConfig())
    for k, (vm, leading) in enumerate(
        [
            (Res(50, 512, 5), [1, 2, 3, 4]),
            (Res(400, 512, 5), [3, 4]),
            (Res(50, 2048, 5), [3, 4]),
            (Res(50, 512, 20), [3, 4]),
            (Res(50, 512, 5, 50, 0), [1, 2, 3]),
            (Res(400, 512, 5, 0, 50), [3]),
            (Res(900, 512, 5), []),
        ]
    ):
        req = LeaseRequest(10 + k, "best_effort", 0, None, 600, (vm,))  # the mapper memoises per lease id
        order = HostOrder(s, req, 0, 600)
        assert order.tried() == leading, vm
        assert list(HostOrder(s, req, 0, 600)) == s._sorted_hosts(s.table, req, 0, 600, None), vm


@pytest.mark.parametrize("seed", range(8))
def test_the_first_busy_instant_kept_per_start_says_which_nodes_are_idle_as_the_peak_does(seed):
    """NodeArrays.busy_from: a node is idle over [t, end) exactly when its first busy instant from t is at least
    `end`, for every end, at instants on and between reservation edges, while leases are placed and cancelled
    (the kept columns are rewritten only for the rows a write changes)."""
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([12, 40]))
    edges = sorted({x for r in s.table.reservations() for x in (r.start, r.end)})
    instants = [0.0, 3000.0, *rng.sample(edges, 4), *(x + 0.5 for x in rng.sample(edges, 3))]
    for k in range(30):
        arrays = s.table.arrays()
        for t in rng.sample(instants, 5):
            busy = arrays.busy_from(t)
            assert not busy.flags.writeable
            for end in (t + 0.5, t + 60, t + 600, t + 5000, t + 1e6):
                want = ~arrays.peak_over(t, end).any(axis=1)
                assert ((busy >= end) == want).all(), (seed, k, t, end)
        if rng.random() < 0.6:
            vnodes = tuple(rng.choice(VMS) for _ in range(rng.randint(1, 3)))
            s.submit(LeaseRequest(50_000 + k, "best_effort", 3000, None, 600, vnodes), 3000)
        else:
            placed = [lid for lid, rec in s.leases.items() if rec.state in ("scheduled", "ready", "active")]
            if placed:
                s.cancel(rng.choice(placed), 3000)


@pytest.mark.parametrize("seed", range(10))
def test_a_start_asked_for_the_first_time_is_ordered_as_scoring_every_node_orders_it(seed, monkeypatch):
    """HostOrder's rest at a start no score columns are kept for yet (an advance reservation's own start) is
    exactly the per-node score's order, ties in node order, however much of it is taken."""
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([12, 40]))
    nodes = list(s.table.nodes)
    s.use_exclusions({n: "draining" for n in rng.sample(nodes, 2)})
    edges = sorted({x for r in s.table.reservations() for x in (r.start, r.end)})
    for k in range(30):
        start = rng.choice([*edges, *(x + 0.5 for x in edges), 3000.0 + k])  # most asked for the first time
        req = LeaseRequest(
            60_000 + k,
            "advance_reservation",
            0,
            start,
            rng.choice([60.0, 600.0, 5000.0]),
            tuple(rng.choice(VMS) for _ in range(rng.randint(1, 3))),
            barred=tuple((n, "missing_capability: x") for n in rng.sample(nodes, rng.randint(0, 2))),
        )
        s._summaries.clear()
        s._asked_at.clear()
        taken = rng.choice([1, 3, len(nodes)])
        lazy = list(itertools.islice(HostOrder(s, req, start, req.duration), taken))
        with monkeypatch.context() as m:
            m.setattr(mapper.Mapper, "_summary_columns", lambda self, start: None)
            full = s._sorted_hosts(s.table, req, start, req.duration, None)
        assert lazy == full[:taken], (seed, k, start)


def test_the_idle_nodes_kept_between_writes_follow_a_write_and_a_change_of_exclusions():
    s = Scheduler({n: Res(100, 1024, 10, 0, 0) for n in range(1, 7)}, SchedulerConfig())
    req = LeaseRequest(1, "best_effort", 0, None, 600, (Res(50, 512),))
    assert HostOrder(s, req, 0, 600).tried() == [1, 2, 3, 4, 5, 6]
    cordoned = {2: "draining: an operator cordoned this node"}
    s.use_exclusions(cordoned)
    assert HostOrder(s, req, 0, 600).tried() == [1, 3, 4, 5, 6]
    s.submit(LeaseRequest(2, "best_effort", 0, None, 600, (Res(50, 512),)), 0, cordoned)  # on node 1
    assert HostOrder(s, req, 0, 600).tried() == [3, 4, 5, 6]
    barred = replace(req, id=3, barred=((4, "missing_capability: lacks accel.gpu"),))
    assert HostOrder(s, barred, 0, 600).tried() == [3, 5, 6]
    assert HostOrder(s, req, 0, 600).tried() == [3, 4, 5, 6]
    s.use_exclusions({})
    assert HostOrder(s, req, 0, 600).tried() == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("seed", range(8))
def test_the_summaries_kept_per_node_answer_as_reading_the_node_again_at_any_instant(seed):
    """Mapper._summary keeps several spans per node (each ask's answer holds until the node next changes): asked
    at instants in any order, earlier and later than before, while leases are placed and cancelled, it answers
    what reading the node's reservations answers."""
    rng = random.Random(seed)
    s = random_plan(rng, 12)
    edges = sorted({x for r in s.table.reservations() for x in (r.start, r.end)})
    instants = [*edges, *(x + 0.5 for x in edges), *(x - 0.5 for x in edges), 0.0, 1e7]
    hits = 0
    for k in range(400):
        node = rng.choice(list(s.table.nodes))
        t = rng.choice(instants)
        hits += any(a <= t < b for a, b, _, _ in s._views.get(node, ()))
        assert s._summary(node, t) == mapper.summary(s.table, node, t), (seed, k, node, t)
        if k % 40 == 39:
            if rng.random() < 0.5:
                vnodes = tuple(rng.choice(VMS) for _ in range(rng.randint(1, 3)))
                s.submit(LeaseRequest(70_000 + k, "best_effort", 3000, None, 600, vnodes), 3000)
            else:
                placed = [
                    lid for lid, rec in s.leases.items() if rec.state in ("scheduled", "ready", "active")
                ]
                if placed:
                    s.cancel(rng.choice(placed), 3000)
    assert hits > 100, "most asks were answered from a kept span"
