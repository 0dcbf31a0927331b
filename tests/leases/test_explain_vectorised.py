"""The vectorised verdicts (`Scheduler.explain`, one numpy pass over the fleet) agree node by node with the
per-node loop they replaced (explain_reference.py), on random plans: mixed node sizes, running and future
reservations, exclusions, barred nodes, group spreads, the now-gate, a lease's own share added back, and windows
that start now, later, or before every reservation."""

from __future__ import annotations

import random

import pytest

from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.slottable import Res
from tests.leases.explain_reference import reference_verdicts

SIZES = [Res(100, 1024, 10, 100, 100), Res(400, 4096, 40, 100, 100), Res(800, 16384, 80, 100, 100)]
VMS = [Res(50, 512, 5), Res(100, 1024, 10), Res(200, 2048, 20), Res(100, 4096, 0), Res(400, 1024, 50)]


def random_plan(rng: random.Random, nodes: int) -> Scheduler:
    s = Scheduler({n: rng.choice(SIZES) for n in range(1, nodes + 1)}, SchedulerConfig())
    lid = 0
    for t in range(0, 3000, 100):
        for _ in range(rng.randint(0, 4)):
            lid += 1
            vnodes = tuple(rng.choice(VMS) for _ in range(rng.randint(1, 3)))
            duration = rng.choice([300, 600, 1800])
            kind = rng.choice(["best_effort", "best_effort", "advance_reservation", "immediate"])
            start = t + rng.choice([200, 900, 2500]) if kind == "advance_reservation" else None
            s.submit(
                LeaseRequest(lid, kind, t, start, duration, vnodes, preemptible=kind == "best_effort"), t
            )
    return s


def request(rng: random.Random, s: Scheduler, lid: int) -> LeaseRequest:
    nodes = list(s.table.nodes)
    spread = rng.choice([None, None, 1, 2])
    return LeaseRequest(
        lid,
        "advance_reservation",
        3000,
        3000,
        600,
        tuple(rng.choice(VMS) for _ in range(rng.randint(1, 4))),
        spread=spread,
        taken=tuple((n, rng.randint(1, 2)) for n in rng.sample(nodes, 2)) if spread else (),
        barred=tuple(
            (n, "missing_capability: lacks accel.gpu") for n in rng.sample(nodes, rng.randint(0, 3))
        ),
    )


def comparable(verdicts):
    return [
        (v.node, v.holds, v.slots, v.code, v.dim, v.need, v.free, v.allocatable, v.rank, v.chosen, v.note)
        for v in verdicts
    ]


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_verdicts_equal_the_per_node_loop(seed):
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([3, 8, 20]))
    nodes = list(s.table.nodes)
    s.observe({n: Res(0, rng.choice([256, 2048]), rng.choice([0, 30])) for n in rng.sample(nodes, 2)})
    excluded = {n: rng.choice(["draining", "offline: no heartbeat for 2 min"]) for n in rng.sample(nodes, 1)}
    checked = 0
    for k in range(15):
        req = request(rng, s, 10_000 + k)
        start = rng.choice([0.0, 1500.0, 2950.0, 3000.0, 4000.0, 99_999.0])
        end = start + rng.choice([0.0, 60.0, 600.0, 5000.0])
        now = rng.choice([start, start - 10, start + 10])
        own: dict[int, Res] = {}
        live = [rec for rec in s.leases.values() if rec.current_vm() is not None]
        if live and rng.random() < 0.4:
            rec = rng.choice(live)
            req, own = rec.request, s.alloc_of(rec, rec.current_vm())
        proposed = rng.sample(nodes, 2) if not own and rng.random() < 0.3 else []
        kwargs = dict(chosen=own, proposed=proposed, excluded=excluded, now=now)
        got = s.explain(req, start, end, **kwargs).verdicts
        want = reference_verdicts(s, req, start, end, **kwargs)
        assert comparable(got) == comparable(want), (seed, k, start, end, now)
        # Blockers are named for the nodes closest to fitting only; on these small fleets that is all of them.
        assert [v.blockers for v in got] == [v.blockers for v in want]
        checked += 1
    assert checked == 15


def test_the_columns_follow_the_table_as_it_changes():
    """The flat columns are spliced, not rebuilt: after adds and removes on a few nodes they still give each
    node's peak and level exactly as the table's own per-node questions do."""
    rng = random.Random(5)
    s = random_plan(rng, 12)
    table = s.table
    table.arrays()  # built once; everything after this is a splice
    placed = [rec.request.id for rec in s.leases.values() if rec.current_vm() is not None]
    assert len(placed) >= 5
    for lid in placed[:5]:
        s.cancel(lid, 3000)
    s.submit(LeaseRequest(99_001, "best_effort", 3000, None, 900, (VMS[2], VMS[2])), 3000)
    arrays = table.arrays()
    for start, end in [(0.0, 50.0), (2900.0, 3100.0), (3000.0, 9000.0), (10.0**6, 10.0**6 + 1)]:
        peak = arrays.peak_over(start, end)
        level = arrays.level_at(start)
        together = arrays.over(start, end)  # one gather for both
        assert (together[0] == peak).all() and (together[1] == level).all()
        for i, node in enumerate(table.nodes):
            cap = table.capacity(node)
            free = table.free_over_vec(node, start, end)
            assert tuple(peak[i]) == (cap.cpu - free[0], cap.mem - free[1], cap.disk - free[2])
            used = table.used_at(node, start)
            assert tuple(level[i]) == (used.cpu, used.mem, used.disk)


def test_a_copy_of_the_table_keeps_its_own_columns():
    rng = random.Random(9)
    s = random_plan(rng, 6)
    before = s.table.arrays().peak_over(0.0, 10.0**7).copy()
    other = s.table.copy()
    other.remove(next(iter(r.rid for r in other.reservations())))
    assert (s.table.arrays().peak_over(0.0, 10.0**7) == before).all()
    assert (other.arrays().peak_over(0.0, 10.0**7) <= before).all()
    assert (other.arrays().peak_over(0.0, 10.0**7) != before).any()


def test_the_columns_are_rewritten_in_place_and_grow_where_a_line_outgrows_its_slots():
    """Every write leaves the kept columns answering as columns built afresh from the table would; a node whose
    line stays within its slots is rewritten in place (the arrays are the same objects), and one that outgrows
    them gets more slots inserted after its own."""
    from leases.slots import arrays as slot_arrays

    rng = random.Random(21)
    s = random_plan(rng, 4)
    table = s.table
    kept = table.arrays()
    in_place = grown = 0
    for k in range(40):
        before = (kept.times, int(kept.off[-1]))
        if k % 3 == 2:
            live = [rec.request.id for rec in s.leases.values() if rec.current_vm() is not None]
            s.cancel(rng.choice(live), 3000 + k)
        else:
            s.submit(LeaseRequest(50_000 + k, "best_effort", 3000 + k, None, 300, (VMS[0],)), 3000 + k)
        arrays = table.arrays()
        assert arrays is kept
        if arrays.times is before[0]:
            in_place += 1
            assert int(arrays.off[-1]) == before[1]
        else:
            grown += 1
            assert int(arrays.off[-1]) > before[1]
        assert (arrays.off[1:] - arrays.off[:-1] > arrays.sizes).all()  # a spare slot after every line
        fresh = slot_arrays.NodeArrays(
            list(table.nodes), {n: table._cap(n) for n in table.nodes}, table._lines
        )
        for start, end in [(0.0, 50.0), (2900.0, 3100.0), (3000.0, 9000.0), (3000.0 + k, 10.0**6)]:
            assert (arrays.peak_over(start, end) == fresh.peak_over(start, end)).all()
            assert (arrays.level_at(start) == fresh.level_at(start)).all()
            together, fresh_together = arrays.over(start, end), fresh.over(start, end)
            assert all((a == b).all() for a, b in zip(together, fresh_together, strict=True))
    assert in_place >= 10
    assert grown >= 1


@pytest.mark.parametrize("seed", range(6))
def test_verdicts_kept_for_a_shape_and_window_hold_for_every_lease_own_share_group_and_now_gate(seed):
    """The fleet's capacity verdicts for one VM shape over one window are kept on the slot table's columns until
    the next write, and the rows that differ per lease worked out again: asked again and again for the same
    shape and window with a different lease's own share, a different group, a changed now-gate and a write in
    between, every answer is still the per-node loop's."""
    rng = random.Random(seed)
    s = random_plan(rng, rng.choice([8, 20]))
    nodes = list(s.table.nodes)
    vm = rng.choice(VMS)
    start, end = 3000.0, 3600.0
    kept = 0
    for k in range(30):
        spread = rng.choice([None, 1, 2])
        req = LeaseRequest(
            20_000 + k,
            "advance_reservation",
            start,
            start,
            end - start,
            (vm,) * rng.randint(1, 3),
            spread=spread,
            taken=tuple((n, rng.randint(1, 2)) for n in rng.sample(nodes, 3)) if spread else (),
        )
        own = {n: vm for n in rng.sample(nodes, rng.randint(0, 2))}
        if rng.random() < 0.2:
            s.observe({n: Res(0, rng.choice([256, 2048]), 0) for n in rng.sample(nodes, 2)})
        if rng.random() < 0.1:
            s.submit(LeaseRequest(30_000 + k, "best_effort", start, None, 600, (vm,)), start)
        kwargs = dict(chosen=own, excluded={}, now=rng.choice([start, start - 10]))
        kept += bool(s.table.arrays().derived)
        got = s.explain(req, start, end, **kwargs).verdicts
        want = reference_verdicts(s, req, start, end, **kwargs)
        assert comparable(got) == comparable(want), (seed, k)
    assert kept > 15, "most asks found the shape's verdicts kept"
