"""The victims an advance reservation preempts (SEMANTICS §4.4, Q6: the fewest youngest preemptible best-effort
leases) are searched on one scratch table: the same victims as trying every prefix on a fresh copy, without the
copies. A full fleet whose nodes all went stale made that copy-per-try search hold the plan lock for minutes."""

from __future__ import annotations

import random

import pytest

from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.scheduling.preemption import Preemption
from leases.slottable import Res, SlotTable


def copy_per_try(s: Scheduler, req: LeaseRequest, start: float, end: float) -> list[int]:
    """The search as SEMANTICS states it: add the youngest candidates until the AR fits, then drop every one it
    still fits without, each try on a fresh copy of the table."""
    chosen: list[int] = []
    for lid in s._candidates(req, start, end):
        chosen.append(lid)
        if s._map(s._without(chosen, start), req, start, end, True, None) is not None:
            break
    else:
        return []
    for lid in reversed(list(chosen)):
        rest = [c for c in chosen if c != lid]
        if s._map(s._without(rest, start), req, start, end, True, None) is not None:
            chosen = rest
    return chosen


def busy_fleet(seed: int, nodes: int = 12) -> Scheduler:
    rng = random.Random(seed)
    s = Scheduler({n: Res(400, 4096) for n in range(1, nodes + 1)}, SchedulerConfig())
    for lid in range(1, 80):
        size = rng.choice([Res(100, 1024), Res(200, 2048), Res(50, 512)])
        vms = (size,) * rng.randint(1, 3)
        s.submit(LeaseRequest(lid, "best_effort", lid, None, rng.randint(1, 6) * 3600, vms), lid)
    return s


@pytest.mark.parametrize("seed", range(12))
def test_the_victims_are_those_of_the_copy_per_try_search(seed):
    s = busy_fleet(seed)
    rng = random.Random(seed)
    excluded = {n: "stale" for n in rng.sample(sorted(s.table.nodes), rng.randint(0, 6))}
    s.settle(100)
    s._excluded = excluded
    tried = 0
    for k in range(6):
        width = rng.randint(1, 4)
        req = LeaseRequest(
            1000 + k, "advance_reservation", 100, 100 + rng.randint(0, 4) * 1800, 3600,
            (Res(rng.choice([100, 200, 400]), 1024),) * width, preemptible=False,
        )  # fmt: skip
        start, end = req.start, req.start + 3600
        expected = copy_per_try(s, req, start, end)
        assert s._minimal_victims(req, start, end, 100) == expected
        tried += bool(expected)
    assert tried  # the fleet is busy enough that some ARs need victims


def test_a_fleet_of_stale_nodes_maps_no_candidate(monkeypatch):
    """Every node excluded (their agents went quiet): no candidate can make the AR fit, and none is mapped."""
    s = busy_fleet(3)
    s._excluded = {n: "stale" for n in s.table.nodes}
    candidates = s._candidates(
        LeaseRequest(999, "advance_reservation", 100, 200, 3600, (Res(400, 4096),), preemptible=False),
        200,
        3800,
    )
    assert len(candidates) > 10
    maps, copies = [0], [0]
    real_map, real_copy = Preemption._map, SlotTable.copy

    def counted_map(self, *args):
        maps[0] += 1
        return real_map(self, *args)

    def counted_copy(self):
        copies[0] += 1
        return real_copy(self)

    monkeypatch.setattr(Preemption, "_map", counted_map)
    monkeypatch.setattr(SlotTable, "copy", counted_copy)
    req = LeaseRequest(999, "advance_reservation", 100, 200, 3600, (Res(400, 4096),), preemptible=False)
    assert s._minimal_victims(req, 200, 3800, 100) == []
    assert maps[0] == 0
    assert copies[0] == 1


def test_a_search_over_many_candidates_copies_the_table_once(monkeypatch):
    s = busy_fleet(5)
    req = LeaseRequest(999, "advance_reservation", 100, 200, 3600, (Res(400, 4096),) * 6, preemptible=False)
    expected = copy_per_try(s, req, 200, 3800)
    assert len(expected) > 3
    copies = [0]
    real_copy = SlotTable.copy

    def counted_copy(self):
        copies[0] += 1
        return real_copy(self)

    monkeypatch.setattr(SlotTable, "copy", counted_copy)
    assert s._minimal_victims(req, 200, 3800, 100) == expected
    assert copies[0] == 1


def test_a_queued_lease_s_position_follows_the_queue_as_leases_leave_it():
    """Decision messages say "queued at position N" from the queue's entry, found by bisection, not a scan."""
    s = Scheduler({1: Res(100, 1024)}, SchedulerConfig())
    for lid in range(1, 8):
        s.submit(LeaseRequest(lid, "best_effort", lid, None, 3600, (Res(100, 1024),)), lid)
    assert s.queue == [3, 4, 5, 6, 7]  # 1 runs, 2 holds the one future reservation
    assert [s.queue_position(lid) for lid in s.queue] == [1, 2, 3, 4, 5]
    s.cancel(4, 10)
    assert [s.queue_position(lid) for lid in (3, 5, 6, 7)] == [1, 2, 3, 4]
    s.advance(3601)  # 1 ends, 2 starts, 3 takes the future reservation
    assert s.queue == [5, 6, 7]
    assert [s.queue_position(lid) for lid in (5, 6, 7)] == [1, 2, 3]
    assert s.describe(6) == "lease 6 queued at position 2"
    assert not {3, 4} & s._queue_keys.keys()  # left the queue: forgotten
