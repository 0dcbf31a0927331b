"""The slot table: Haizea's own slot-table tests (SEMANTICS.md §8.2) ported to our API, the edges of the
half-open convention, and property tests against a naive model that scans every reservation."""

import contextlib
import itertools
import math
import random
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leases import slottable
from leases.slottable import Overcommit, Res, Reservation, RoomCounts, SlotTable

# Every Haizea test trace starts at 2006-11-25 13:00:00 on nodes of CPU 100 / Memory 1024 MB.
T0 = datetime(2006, 11, 25, 13, 0, tzinfo=UTC).timestamp()
F = Res(cpu=100, mem=1024)
H = Res(cpu=50, mem=512)
Q = Res(cpu=25, mem=256)
E = Res()


def at(hhmm: str) -> float:
    hours, minutes = hhmm.split(":")
    return T0 + (int(hours) - 13) * 3600 + int(minutes) * 60


def frac(x: float) -> Res:
    return Res(cpu=round(100 * x), mem=round(1024 * x))


def rr(rid, start, end, alloc, lease_id=None, kind="vm"):
    return Reservation(rid, rid if lease_id is None else lease_id, kind, at(start), at(end), alloc)


def rids(reservations):
    return {r.rid for r in reservations}


# -- resource tuples -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("need", "capacity", "fits"),
    [
        (Res(cpu=100), Res(cpu=200), True),
        (Res(cpu=100), Res(cpu=50), False),
        (Res(cpu=100, mem=1024), Res(cpu=100, mem=1023), False),
        (Res(net_out=1), Res(cpu=100, mem=1024), False),
        (Res(), Res(), True),
    ],
)
def test_a_resource_tuple_fits_only_when_every_component_does(need, capacity, fits):
    assert need.fits_in(capacity) is fits


def test_resource_tuples_add_subtract_and_scale_componentwise():
    a, b = Res(1, 2, 3, 4, 5), Res(10, 20, 30, 40, 50)
    assert a + b == Res(11, 22, 33, 44, 55)
    assert b - a == Res(9, 18, 27, 36, 45)
    assert a.scaled(3) == Res(3, 6, 9, 12, 15)
    assert Res.ZERO + a == a


# -- Haizea test_slottable: 2 full nodes, five reservations added then removed -------------------------------

HAIZEA_TIMES = ["13:00", "13:15", "13:30", "13:45", "14:00", "14:15"]
HAIZEA_STEPS = [
    # (reservation added, availability fraction of n1 then n2 at each of HAIZEA_TIMES, rids running then)
    (
        rr(1, "13:00", "13:30", {1: H, 2: H}),
        [0.5, 0.5, 1, 1, 1, 1],
        [0.5, 0.5, 1, 1, 1, 1],
        [{1}, {1}, set(), set(), set(), set()],
    ),
    (
        rr(2, "13:30", "14:00", {1: Q, 2: H}),
        [0.5, 0.5, 0.75, 0.75, 1, 1],
        [0.5, 0.5, 0.5, 0.5, 1, 1],
        [{1}, {1}, {2}, {2}, set(), set()],
    ),
    (
        rr(3, "13:15", "13:45", {1: Q, 2: Q}),
        [0.5, 0.25, 0.5, 0.75, 1, 1],
        [0.5, 0.25, 0.25, 0.5, 1, 1],
        [{1}, {1, 3}, {2, 3}, {2}, set(), set()],
    ),
    (
        rr(4, "13:30", "14:15", {1: H, 2: Q}),
        [0.5, 0.25, 0, 0.25, 0.5, 1],
        [0.5, 0.25, 0, 0.25, 0.75, 1],
        [{1}, {1, 3}, {2, 3, 4}, {2, 4}, {4}, set()],
    ),
    (
        rr(5, "13:45", "14:15", {2: Q}),
        [0.5, 0.25, 0, 0.25, 0.5, 1],
        [0.5, 0.25, 0, 0, 0.5, 1],
        [{1}, {1, 3}, {2, 3, 4}, {2, 4, 5}, {4, 5}, set()],
    ),
]


def assert_haizea_step(table, n1, n2, running):
    for hhmm, a1, a2, expected in zip(HAIZEA_TIMES, n1, n2, running, strict=True):
        t = at(hhmm)
        assert (table.available_at(1, t), table.available_at(2, t)) == (frac(a1), frac(a2)), hhmm
        assert rids(table.reservations(t, t)) == expected, hhmm


def haizea_table(steps=None):
    table = SlotTable({1: F, 2: F})
    for reservation, *_ in HAIZEA_STEPS[:steps]:
        table.add(reservation)
    return table


@pytest.mark.parametrize("steps", range(1, len(HAIZEA_STEPS) + 1))
def test_availability_after_each_of_haizeas_additions(steps):
    _, n1, n2, running = HAIZEA_STEPS[steps - 1]
    assert_haizea_step(haizea_table(steps), n1, n2, running)


def test_removing_haizeas_reservations_in_reverse_restores_each_earlier_state_down_to_empty():
    table = haizea_table()
    for k in range(len(HAIZEA_STEPS) - 1, 0, -1):
        table.remove(HAIZEA_STEPS[k][0].rid)
        _, n1, n2, running = HAIZEA_STEPS[k - 1]
        assert_haizea_step(table, n1, n2, running)
    table.remove(1)
    assert len(table) == 0
    assert table.changepoints(-math.inf) == []
    assert table.available_at(1, at("13:00")) == F


@pytest.mark.parametrize(
    ("after", "expected"),
    [("12:55", "13:00"), ("13:00", "13:15"), ("13:35", "13:45"), ("14:00", "14:15"), ("14:15", None)],
)
def test_the_next_changepoint_is_the_first_start_or_end_strictly_after(after, expected):
    points = haizea_table().changepoints(at(after))
    assert (points[0] if points else None) == (None if expected is None else at(expected))


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        ("13:00", "13:15", {1}),
        ("13:05", "13:35", {1, 2, 3, 4}),
        ("13:30", "13:45", {2, 3, 4}),  # rr1 ends at 13:30 and rr5 starts at 13:45: half-open, so neither
        ("14:00", "14:15", {4, 5}),
        ("14:15", "15:00", set()),
    ],
)
def test_reservations_overlapping_a_window_follow_the_half_open_convention(start, end, expected):
    assert rids(haizea_table().reservations(at(start), at(end))) == expected


def test_reservations_can_be_narrowed_to_one_node_and_come_sorted_by_start():
    found = haizea_table().reservations(at("13:00"), at("15:00"), node=1)
    assert [r.rid for r in found] == [1, 3, 2, 4]


# -- Haizea test_availabilitywindow: sample_slottable_1, 4 full nodes ----------------------------------------


def sample_slottable_1():
    table = SlotTable({1: F, 2: F, 3: F, 4: F})
    for r in [
        rr(1, "13:15", "13:25", {2: H}, lease_id=1),
        rr(2, "13:25", "13:30", {2: H}, lease_id=1),
        rr(3, "13:30", "13:45", {2: F, 3: F}, lease_id=2),
        rr(4, "13:30", "13:55", {4: F}, lease_id=3),
        rr(5, "13:55", "14:00", {4: F}, lease_id=3),
        rr(6, "13:50", "14:15", {2: Q, 3: H}, lease_id=4),
        rr(7, "13:50", "14:15", {2: Q}, lease_id=5),
        rr(8, "12:55", "13:05", {1: F}, lease_id=6),
    ]:
        table.add(r)
    return table


SAMPLE_1_WINDOW = {
    # changepoint: availability of nodes 1..4 there (SEMANTICS.md §8.2, the window at 13:00)
    "13:00": (E, F, F, F),
    "13:05": (F, F, F, F),
    "13:15": (F, H, F, F),
    "13:25": (F, H, F, F),
    "13:30": (F, E, E, E),
    "13:45": (F, F, F, E),
    "13:50": (F, H, H, E),
    "13:55": (F, H, H, E),
    "14:00": (F, H, H, F),
    "14:15": (F, F, F, F),
}


def test_the_changepoints_from_13_00_are_haizeas_window_changepoints():
    assert [at("13:00"), *sample_slottable_1().changepoints(at("13:00"))] == [at(t) for t in SAMPLE_1_WINDOW]


@pytest.mark.parametrize(("hhmm", "expected"), SAMPLE_1_WINDOW.items())
def test_availability_at_each_changepoint_matches_haizeas_window(hhmm, expected):
    table = sample_slottable_1()
    assert tuple(table.available_at(n, at(hhmm)) for n in (1, 2, 3, 4)) == expected


@pytest.mark.parametrize(
    ("node", "need", "start", "until"),
    [
        # Two back-to-back reservations of lease 1 are one span: H is free on n2 until 13:30, not 13:25.
        (2, H, "13:15", "13:30"),
        (2, F, "13:00", "13:15"),
        (3, F, "13:00", "13:30"),
        (2, Q, "13:50", None),  # from 13:50 n2 never has less than H free again
        (4, Q, "13:30", "13:30"),  # lease 3 holds n4 whole from 13:30: nothing fits there at all
        (1, F, "13:05", None),
    ],
)
def test_fits_until_reports_how_long_a_need_can_be_held_in_sample_1(node, need, start, until):
    expected = math.inf if until is None else at(until)
    assert sample_slottable_1().fits_until(node, need, at(start)) == expected


@pytest.mark.parametrize(
    ("node", "need", "minutes", "after", "expected"),
    [
        # lease 3's two reservations on n4 (13:30-13:55, 13:55-14:00) leave no gap at 13:55 to slip into.
        (4, Q, 5, "13:30", "14:00"),
        (2, F, 15, "13:00", "13:00"),
        # 13:00-13:16 runs into lease 1 at 13:15, and 13:45-13:50 is too short before leases 4 and 5.
        (2, F, 16, "13:00", "14:15"),
        (2, F, 5, "13:30", "13:45"),  # ... but five minutes fit exactly between lease 2 and leases 4 and 5
        (2, H, 30, "13:15", "13:45"),
        (1, F, 60, "12:00", "13:05"),  # lease 6 started before the window and still counts
    ],
)
def test_earliest_fit_in_sample_1(node, need, minutes, after, expected):
    assert sample_slottable_1().earliest_fit(node, need, minutes * 60, at(after)) == at(expected)


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        ("13:00", {1: [(E, None)], 2: [(F, "13:15"), (H, "13:30"), (E, None)], 3: [(F, "13:30"), (E, None)]}),
        ("13:30", {1: [(F, None)], 2: [(E, None)], 3: [(E, None)], 4: [(E, None)]}),
        (
            "13:45",
            {1: [(F, None)], 2: [(F, "13:50"), (H, None)], 3: [(F, "13:50"), (H, None)], 4: [(E, None)]},
        ),
        ("14:15", {1: [(F, None)], 2: [(F, None)], 3: [(F, None)], 4: [(F, None)]}),
    ],
)
def test_the_ongoing_availability_envelope_matches_haizeas(start, expected):
    table = sample_slottable_1()
    for node, pairs in expected.items():
        want = [(res, math.inf if until is None else at(until)) for res, until in pairs]
        assert table.envelope(node, at(start)) == want, node


def test_the_envelope_ignores_availability_rising_again_sample_4():
    table = SlotTable({1: F})
    table.add(rr(1, "13:15", "14:20", {1: H}))
    table.add(rr(2, "13:30", "14:15", {1: Q}))
    assert table.envelope(1, at("13:00")) == [(F, at("13:15")), (H, at("13:30")), (Q, math.inf)]
    assert table.changepoints(at("13:00")) == [at("13:15"), at("13:30"), at("14:15"), at("14:20")]


# -- the half-open convention, zero-length intervals and edges -----------------------------------------------


def test_a_reservation_ending_at_t_and_one_starting_at_t_never_overlap():
    table = SlotTable({1: F})
    table.add(rr(1, "13:00", "14:00", {1: F}))
    table.add(rr(2, "14:00", "15:00", {1: F}))
    assert table.used_at(1, at("14:00")) == F
    assert rids(table.reservations(at("14:00"), at("14:00"))) == {2}
    assert table.fits(1, F, at("12:00"), at("13:00"))
    assert table.fits(1, F, at("15:00"), at("16:00"))


@pytest.mark.parametrize(
    ("hhmm", "fits"),
    [("12:59", True), ("13:00", False), ("13:59", False), ("14:00", True)],
)
def test_fits_on_a_zero_length_interval_asks_whether_the_need_fits_at_that_instant(hhmm, fits):
    table = SlotTable({1: F})
    table.add(rr(1, "13:00", "14:00", {1: H}))
    assert table.fits(1, Res(cpu=51), at(hhmm), at(hhmm)) is fits
    assert table.fits(1, H, at(hhmm), at(hhmm))


@pytest.mark.parametrize(
    ("need", "minutes", "after", "expected"),
    [
        (H, 60, "12:00", "12:00"),  # half is free throughout
        (F, 60, "12:00", "12:00"),  # 12:00-13:00 ends exactly where rr1 starts
        (F, 61, "12:00", "14:00"),
        (F, 0, "13:30", "14:00"),  # a zero-length need still waits for room at its instant
        (F, 0, "12:30", "12:30"),
        (Res(cpu=101), 1, "12:00", None),  # more than the node has, ever
        (Res(mem=1024), 30, "13:10", "14:00"),
    ],
)
def test_earliest_fit_on_one_busy_hour(need, minutes, after, expected):
    table = SlotTable({1: F})
    table.add(rr(1, "13:00", "14:00", {1: H}))
    found = table.earliest_fit(1, need, minutes * 60, at(after))
    assert found == (None if expected is None else at(expected))


def test_fits_until_is_the_start_when_nothing_fits_and_infinite_on_an_empty_node():
    table = SlotTable({1: F, 2: F})
    table.add(rr(1, "13:00", "14:00", {1: F}))
    assert table.fits_until(1, Q, at("13:30")) == at("13:30")
    assert table.fits_until(1, Q, at("12:00")) == at("13:00")
    assert table.fits_until(2, F, at("12:00")) == math.inf
    assert table.fits_until(2, Res(cpu=101), at("12:00")) == at("12:00")


def test_an_overcommitting_add_names_the_node_instant_need_and_what_is_left_and_changes_nothing():
    table = SlotTable({1: F, 2: F})
    table.add(rr(1, "13:30", "14:00", {2: H}))
    with pytest.raises(Overcommit) as refused:
        table.add(rr(2, "13:00", "15:00", {1: F, 2: Res(cpu=60, mem=10)}))
    assert (refused.value.node, refused.value.instant) == (2, at("13:30"))
    assert (refused.value.need, refused.value.available) == (Res(cpu=60, mem=10), H)
    # Node 1 had room, but an all-or-nothing add must not leave half a reservation behind.
    assert table.used_at(1, at("13:30")) == E
    assert table.changepoints(-math.inf) == [at("13:30"), at("14:00")]
    with pytest.raises(KeyError):
        table.get(2)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (rr(1, "13:00", "13:30", {1: Q}), ValueError),  # rid 1 is already in the table
        (rr(2, "13:00", "13:30", {9: Q}), KeyError),  # no node 9
        (rr(2, "13:00", "13:30", {1: Res(cpu=-10)}), ValueError),  # negative use would hide real use
    ],
)
def test_an_invalid_reservation_is_refused(bad, error):
    table = SlotTable({1: F})
    table.add(rr(1, "13:00", "13:30", {1: Q}))
    with pytest.raises(error):
        table.add(bad)
    assert rids(table.reservations()) == {1}


def test_a_reservation_cannot_end_before_it_starts():
    with pytest.raises(ValueError, match="ends"):
        rr(1, "14:00", "13:00", {1: Q})


def test_a_zero_length_reservation_holds_nothing_but_marks_a_changepoint():
    table = SlotTable({1: F})
    table.add(rr(1, "13:00", "14:00", {1: F}))
    table.add(rr(2, "13:30", "13:30", {1: F}, kind="shutdown"))
    assert table.used_at(1, at("13:30")) == F
    assert table.changepoints(at("13:00")) == [at("13:30"), at("14:00")]
    assert rids(table.reservations(at("13:30"), at("13:31"))) == {1, 2}


def test_changepoints_can_be_limited_to_some_nodes_and_a_horizon():
    table = haizea_table()
    assert table.changepoints(at("13:00"), nodes=[1]) == [
        at(t) for t in ["13:15", "13:30", "13:45", "14:00", "14:15"]
    ]
    assert table.changepoints(at("13:00"), until=at("13:45"), nodes=[2]) == [
        at("13:15"),
        at("13:30"),
        at("13:45"),
    ]


def test_blockers_are_the_reservations_using_what_the_need_is_short_of():
    table = SlotTable({1: Res(cpu=100, mem=1024, disk=100)})
    table.add(rr(1, "13:00", "13:30", {1: Res(cpu=50)}))
    table.add(rr(2, "13:30", "14:00", {1: Res(cpu=80)}, lease_id=7))
    table.add(rr(3, "13:30", "14:00", {1: Res(disk=100)}))  # uses no cpu, so it blocks no cpu need
    assert [r.rid for r in table.blockers(1, Res(cpu=30), at("13:00"), at("15:00"))] == [2]
    assert [r.rid for r in table.blockers(1, Res(cpu=60), at("13:00"), at("15:00"))] == [1, 2]
    assert table.blockers(1, Res(cpu=20), at("13:00"), at("15:00")) == []
    assert [r.lease_id for r in table.blockers(1, Res(cpu=60), at("13:45"), at("13:45"))] == [7]


def test_replace_shortens_a_reservation_and_frees_the_tail():
    table = SlotTable({1: F})
    table.add(rr(1, "13:00", "15:00", {1: F}))
    table.replace(rr(1, "13:00", "14:00", {1: F}))
    assert table.fits(1, F, at("14:00"), at("15:00"))
    assert table.get(1).end == at("14:00")


def test_a_replace_that_would_overcommit_keeps_the_old_reservation():
    table = SlotTable({1: F})
    table.add(rr(1, "13:00", "14:00", {1: H}))
    table.add(rr(2, "14:00", "15:00", {1: F}))
    with pytest.raises(Overcommit):
        table.replace(rr(1, "13:00", "14:30", {1: H}))
    assert table.get(1).end == at("14:00")
    assert table.used_at(1, at("13:30")) == H


def test_reservations_of_one_lease_are_found_by_lease_id():
    table = sample_slottable_1()
    assert [r.rid for r in table.reservations(lease_id=3)] == [4, 5]
    assert [r.rid for r in table.reservations(at("13:56"), at("14:00"), lease_id=3)] == [5]
    assert table.reservations(lease_id=99) == []


def test_mutating_the_callers_alloc_after_add_does_not_change_the_table():
    alloc = {1: H}
    table = SlotTable({1: F})
    table.add(Reservation(1, 1, "vm", at("13:00"), at("14:00"), alloc))
    alloc[1] = F
    table.remove(1)
    assert table.used_at(1, at("13:30")) == E
    assert table.changepoints(-math.inf) == []


def test_a_copy_and_its_original_never_see_each_others_writes():
    original = haizea_table(3)
    snapshot = original.copy()
    snapshot.remove(3)
    snapshot.add(rr(9, "15:00", "16:00", {1: F}))
    original.add(rr(4, "13:30", "14:15", {1: H, 2: Q}))
    assert rids(original.reservations()) == {1, 2, 3, 4}
    assert rids(snapshot.reservations()) == {1, 2, 9}
    assert original.used_at(1, at("15:30")) == E
    assert snapshot.used_at(1, at("13:20")) == H
    assert original.used_at(1, at("13:20")) == frac(0.75)
    assert at("16:00") not in original.changepoints(at("13:00"))


# -- properties: the table agrees with a model that scans every reservation ----------------------------------


CAP = {1: Res(cpu=4, mem=4), 2: Res(cpu=3, mem=5)}


class NaiveTable:
    """What the slot table must answer, computed by scanning every reservation (slow and obviously right)."""

    def __init__(self):
        self.rows = {}

    def used(self, node, t):
        total = Res()
        for r in self.rows.values():
            if node in r.alloc and r.start <= t < r.end:
                total += r.alloc[node]
        return total

    def fits(self, node, need, start, end):
        instants = {start} | {r.start for r in self.rows.values() if start < r.start < end}
        return all((self.used(node, t) + need).fits_in(CAP[node]) for t in instants)

    def points(self):
        return sorted({t for r in self.rows.values() for t in (r.start, r.end)})

    def earliest_fit(self, node, need, duration, after):
        for t in [after, *(p for p in self.points() if p > after)]:
            if self.fits(node, need, t, t + duration):
                return t
        return None

    def fits_until(self, node, need, start):
        if not self.fits(node, need, start, start):
            return start
        later = [p for p in self.points() if p > start and not self.fits(node, need, p, p)]
        return min(later, default=math.inf)


small_res = st.builds(Res, cpu=st.integers(0, 4), mem=st.integers(0, 5))
moment = st.integers(0, 24).map(float)
candidate = st.tuples(
    moment, st.integers(0, 8), st.dictionaries(st.sampled_from([1, 2]), small_res, min_size=1)
)


def build(candidates, removals):
    table, naive = SlotTable(CAP), NaiveTable()
    for rid, (start, length, alloc) in enumerate(candidates):
        r = Reservation(rid, rid % 3, "vm", start, start + length, alloc)
        ok = length == 0 or all(naive.fits(n, use, r.start, r.end) for n, use in alloc.items())
        try:
            table.add(r)
        except Overcommit:
            assert not ok, r
            continue
        assert ok, r
        naive.rows[rid] = r
    for k in removals:
        if naive.rows:
            rid = sorted(naive.rows)[k % len(naive.rows)]
            assert table.remove(rid) == naive.rows.pop(rid)
    return table, naive


tables = st.tuples(st.lists(candidate, max_size=14), st.lists(st.integers(0, 100), max_size=6))
queries = st.tuples(st.sampled_from([1, 2]), small_res, moment, st.integers(0, 10).map(float))


@settings(max_examples=300, deadline=None)
@given(tables, st.lists(queries, min_size=1, max_size=5))
def test_every_query_agrees_with_a_scan_of_all_reservations(built, qs):
    table, naive = build(*built)
    assert table.changepoints(-1.0) == naive.points()
    for node, need, t, length in qs:
        assert table.used_at(node, t) == naive.used(node, t)
        assert table.fits(node, need, t, t + length) is naive.fits(node, need, t, t + length)
        assert table.fits_until(node, need, t) == naive.fits_until(node, need, t)
        assert table.earliest_fit(node, need, length, t) == naive.earliest_fit(node, need, length, t)
        every = {n: naive.earliest_fit(n, need, length, t) for n in CAP}
        assert table.earliest_fits(need, length, t) == {n: f for n, f in every.items() if f is not None}
        expected = [r for r in naive.rows.values() if r.overlaps(t, t + length)]
        assert table.reservations(t, t + length) == sorted(expected, key=lambda r: (r.start, r.rid))


@settings(max_examples=200, deadline=None)
@given(tables, st.lists(queries, min_size=1, max_size=4), st.lists(candidate, min_size=1, max_size=4))
def test_every_nodes_earliest_fit_at_once_follows_the_writes_between_questions(built, qs, more):
    """`earliest_fits` keeps each node's free runs between questions: a write must drop them."""
    table, naive = build(*built)
    for rid, ((_, need, t, length), (start, span, alloc)) in enumerate(zip(qs, more, strict=False), 1000):
        every = {n: naive.earliest_fit(n, need, length, t) for n in CAP}
        assert table.earliest_fits(need, length, t) == {n: f for n, f in every.items() if f is not None}
        r = Reservation(rid, rid % 3, "vm", start, start + span, alloc)
        if span and all(naive.fits(n, use, r.start, r.end) for n, use in alloc.items()):
            table.add(r)
            naive.rows[rid] = r
        elif naive.rows:
            gone = sorted(naive.rows)[0]
            table.remove(gone)
            del naive.rows[gone]
        every = {n: naive.earliest_fit(n, need, length, t) for n in CAP}
        assert table.earliest_fits(need, length, t) == {n: f for n, f in every.items() if f is not None}


@settings(max_examples=200, deadline=None)
@given(tables, queries)
def test_removing_the_blockers_always_makes_the_need_fit(built, query):
    table, _ = build(*built)
    node, need, start, length = query
    blockers = table.blockers(node, need, start, start + length)
    assert (blockers == []) is table.fits(node, need, start, start + length) or not need.fits_in(CAP[node])
    for r in blockers:
        table.remove(r.rid)
    assert table.fits(node, need, start, start + length) or not need.fits_in(CAP[node])


@settings(max_examples=150, deadline=None)
@given(tables)
def test_adding_and_removing_everything_leaves_an_empty_table(built):
    table, naive = build(*built)
    for rid in list(naive.rows):
        table.remove(rid)
    assert table.changepoints(-1.0) == []
    assert all(table.used_at(n, float(t)) == Res() for n in CAP for t in range(30))


@settings(max_examples=150, deadline=None)
@given(tables, moment)
def test_the_envelope_is_the_running_minimum_of_availability(built, start):
    table, naive = build(*built)
    for node in CAP:
        pairs = table.envelope(node, start)
        assert pairs[-1][1] == math.inf
        for t in [start, *(p for p in naive.points() if p > start)]:
            covering = next(avail for avail, until in pairs if t < until)
            instants = [start, *(p for p in naive.points() if start < p <= t)]
            lows = [CAP[node] - naive.used(node, s) for s in instants]
            assert covering == Res(cpu=min(x.cpu for x in lows), mem=min(x.mem for x in lows))


def test_thousands_of_reservations_added_out_of_order_keep_changepoints_and_windows_exact():
    rng = random.Random(5)
    table, kept = SlotTable({n: F for n in range(4)}), {}
    starts = list(range(3000))
    rng.shuffle(starts)
    for rid, start in enumerate(starts):
        r = Reservation(
            rid, rid, "vm", float(start), start + rng.choice([0.5, 7.0, 40.0]), {rid % 4: Res(cpu=1)}
        )
        table.add(r)
        kept[rid] = r
    for rid in rng.sample(sorted(kept), 1500):
        table.remove(kept.pop(rid).rid)
    points = sorted({t for r in kept.values() for t in (r.start, r.end)})
    assert table.changepoints(100.0, until=2000.0) == [p for p in points if 100 < p <= 2000]
    window = sorted((r for r in kept.values() if r.overlaps(1200.0, 1400.0)), key=lambda r: (r.start, r.rid))
    assert table.reservations(1200.0, 1400.0) == window


@pytest.mark.parametrize(
    ("ask", "expected"),
    [
        # Forty short quarter-node reservations with 5 s gaps, then the whole node taken at 1000-1100: answers
        # lie past the first few segments, where the table looks first.
        (lambda t: t.fits_until(1, H, 0.0), 1000.0),
        (lambda t: t.earliest_fit(1, F, 6.0, 0.0), 395.0),
        (lambda t: t.earliest_fit(1, F, 5.0, 0.0), 5.0),
        (lambda t: t.earliest_fit(1, F, 700.0, 0.0), 1100.0),
        (lambda t: t.fits(1, Res(cpu=76), 0.0, 1000.0), False),
    ],
)
def test_answers_far_beyond_the_first_segments_are_found(ask, expected):
    table = SlotTable({1: F})
    for i in range(40):
        table.add(Reservation(i, i, "vm", i * 10.0, i * 10.0 + 5, {1: Q}))
    table.add(Reservation(99, 99, "vm", 1000.0, 1100.0, {1: F}))
    assert ask(table) == expected


def test_nothing_can_start_after_a_reservation_that_never_ends():
    table = SlotTable({1: F})
    table.add(Reservation(1, 1, "vm", at("13:00"), math.inf, {1: F}))
    assert table.earliest_fit(1, Q, 60, at("12:30")) == at("12:30")  # a minute fits before 13:00
    assert table.earliest_fit(1, Q, 3600, at("12:30")) is None
    assert table.fits_until(1, Q, at("12:00")) == at("13:00")


# -- the replay's incremental availability (issue 14) ------------------------------------------------------


def _two_full_nodes_with_a_half_lease() -> SlotTable:
    table = SlotTable({1: Res(100, 1024), 2: Res(100, 1024)})
    table.add(Reservation(1, 1, "vm", 0, 100, {1: Res(50, 512)}))
    return table


def test_total_free_at_sums_every_node_and_follows_adds_and_removes():
    table = _two_full_nodes_with_a_half_lease()
    assert table.total_free_at(0) == Res(150, 1536)
    assert table.total_free_at(100) == Res(200, 2048)  # half-open: the lease is gone at its end
    copy = table.copy()
    copy.add(Reservation(2, 2, "vm", 50, 150, {2: Res(100, 1024)}))
    assert copy.total_free_at(60) == Res(50, 512)
    assert table.total_free_at(60) == Res(150, 1536)  # the copy's write did not reach the original
    copy.remove(1)
    assert copy.total_free_at(60) == Res(100, 1024)


def test_copies_many_counts_whole_copies_per_node_without_building_res():
    table = _two_full_nodes_with_a_half_lease()
    half, full = Res(50, 512), Res(100, 1024)
    assert table.copies_many([1, 2], half, 10) == {1: 1, 2: 2}
    assert table.copies_many([1, 2], full, 10) == {1: 0, 2: 1}
    assert table.copies_many([1, 2], full, 100) == {1: 1, 2: 1}
    assert table.copies_at(1, half, 10) == 1


def test_room_counts_recount_only_the_touched_nodes_and_forget_past_instants():
    table = _two_full_nodes_with_a_half_lease()
    asked: list[list[int]] = []

    def count(nodes):
        nodes = list(nodes)
        asked.append(sorted(nodes))
        return table.copies_many(nodes, Res(50, 512), 10)

    room = RoomCounts()
    assert room.total(10, Res(50, 512), [1, 2], count) == 3
    assert room.total(10, Res(50, 512), [1, 2], count) == 3  # answered from memory
    table.add(Reservation(2, 2, "vm", 0, 100, {2: Res(100, 1024)}))
    room.touch([2])
    assert room.total(10, Res(50, 512), [1, 2], count) == 1
    assert asked == [[1, 2], [2]]
    assert room.subtotal(10, Res(50, 512), [1, 2], {2}, count) == 0
    room.forget_before(11)
    assert room.total(10, Res(50, 512), [1, 2], count) == 1
    assert asked[-1] == [1, 2]  # counted afresh


def test_room_counts_keep_the_nodes_with_room_as_changes_take_it_and_give_it_back():
    table = SlotTable({n: Res(100, 1024) for n in range(1, 6)})
    unit = Res(50, 512)

    def count(nodes):
        return table.copies_many(list(nodes), unit, 10)

    room = RoomCounts()
    assert room.with_room(10, unit, range(1, 6), count) == {1, 2, 3, 4, 5}
    table.add(Reservation(1, 1, "vm", 0, 100, {2: Res(100, 1024), 4: Res(60, 0)}))
    room.touch([2, 4])
    assert room.with_room(10, unit, range(1, 6), count) == {1, 3, 5}
    assert room.counts(10, unit, range(1, 6), count) == {1: 2, 2: 0, 3: 2, 4: 0, 5: 2}
    table.remove(1)
    # Past the log's limit: the entry is handed the nodes to recount.
    for _ in range(RoomCounts._LOG_LIMIT // 2 + 1):
        room.touch([2, 4])
    assert room.total(10, unit, range(1, 6), count) == 10
    assert room.with_room(10, unit, range(1, 6), count) == {1, 2, 3, 4, 5}


def test_the_leases_in_the_way_are_kept_per_node_until_a_write_to_it_on_either_side_of_a_copy():
    table = SlotTable({1: Res(100, 1024), 2: Res(100, 1024)})
    table.add(Reservation(1, 7, "vm", 0, 100, {1: Res(60, 512), 2: Res(60, 512)}))
    need = Res(50, 512)
    assert table.blocking_leases(1, need, 10, 50) == {7}
    table.blocking_leases(1, need, 10, 50).discard(7)  # the caller's own set
    assert table.blocking_leases(1, need, 10, 50) == {7}
    copy = table.copy()
    copy.add(Reservation(2, 8, "vm", 20, 30, {1: Res(30, 0)}))
    assert copy.blocking_leases(1, Res(20), 10, 50) == {7, 8}
    assert table.blocking_leases(1, Res(20), 10, 50) == set(), "the copy's write is not the original's"
    table.add(Reservation(3, 9, "vm", 40, 60, {1: Res(30, 0)}))
    assert table.blocking_leases(1, Res(20), 10, 50) == {7, 9}
    table.remove(1)
    assert table.blocking_leases(1, need, 10, 50) == set()
    assert table.blocking_leases(2, need, 10, 50) == set()
    table.replace(Reservation(3, 9, "vm", 40, 60, {2: Res(30, 0)}))  # moved between nodes: a shift
    assert table.blocking_leases(1, Res(80), 10, 50) == set()
    assert table.blocking_leases(2, Res(80), 10, 50) == {9}
    for k in range(3 * slottable.BLOCKED_KEPT):  # a pass's `now` after another, the node never written to
        assert table.blocking_leases(2, Res(80), 45 + k / 1000, 50) == {9}
    assert 0 < len(table._blocked[2]) <= slottable.BLOCKED_KEPT


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 7))
def test_the_lowest_leases_in_the_way_are_the_lowest_of_all_of_them(rnd, most):
    """`most` stops the walk early on a crowded node; what it names must be the lowest ids of the whole set,
    leases with several reservations on the node counted once."""
    table = SlotTable({1: Res(100, 1024)})
    for rid in range(1, rnd.randint(2, 40)):
        start = rnd.randint(0, 90)
        lease = rnd.randint(1, 15)  # some leases hold several reservations
        r = Reservation(rid, lease, "vm", start, start + rnd.randint(0, 30), {1: Res(rnd.randint(1, 20), 64)})
        with contextlib.suppress(Overcommit):  # a reservation that does not fit is left out
            table.add(r)
    need = Res(rnd.randint(1, 60), rnd.choice([0, 256]))
    start = rnd.randint(0, 100)
    end = start + rnd.randint(0, 40)
    every = table.blocking_leases(1, need, start, end)
    assert every == {r.lease_id for r in table.blockers(1, need, start, end)}
    assert table.blocking_leases(1, need, start, end, most) == set(sorted(every)[:most])


def test_a_resource_first_used_late_reads_as_zero_before_and_counts_after():
    # Columns nobody has used are kept empty (docs/replay.md, Speed): the first use of disk or network on a node
    # with breakpoints already in place must read exactly as if the column had been there all along.
    table = SlotTable({1: Res(100, 1024, 10, 100, 100)})
    table.add(Reservation(1, 1, "vm", 0, 100, {1: Res(50, 512)}))
    assert table.available_at(1, 50) == Res(50, 512, 10, 100, 100)
    table.add(Reservation(2, 2, "migrate", 20, 40, {1: Res(net_in=100)}))
    assert table.used_at(1, 30) == Res(50, 512, 0, 100, 0)
    assert table.used_at(1, 10) == Res(50, 512)
    assert table.fits(1, Res(net_in=1), 40, 60)
    assert not table.fits(1, Res(net_in=1), 10, 30)
    assert table.fits_until(1, Res(net_in=1), 0) == 20
    assert table.copies_at(1, Res(net_in=50), 30) == 0
    assert table.copies_at(1, Res(net_in=50), 10) == 2
    assert table.copies_many([1], Res(cpu=10, net_out=10), 30) == {1: 5}
    assert table.earliest_fit(1, Res(10, 10, 0, 100), 10, 15) == 40
    assert table.total_copies_at(Res(cpu=25, net_in=50), 30) == 0
    assert table.total_copies_at(Res(cpu=25, net_in=50), 50) == 2
    with pytest.raises(Overcommit):
        table.add(Reservation(3, 3, "migrate", 30, 50, {1: Res(net_in=1)}))
    copy = table.copy()
    copy.add(Reservation(4, 4, "vm", 0, 10, {1: Res(disk=5)}))
    assert copy.used_at(1, 5) == Res(50, 512, 5)
    assert table.used_at(1, 5) == Res(50, 512)  # the original's columns are not the copy's
    table.remove(2)
    assert table.used_at(1, 30) == Res(50, 512)
    assert table.blockers(1, Res(60), 0, 10) == [table.get(1)]


def test_an_overcommit_on_a_later_node_leaves_the_earlier_nodes_as_they_were():
    table = SlotTable({1: Res(100, 1024), 2: Res(100, 1024)})
    table.add(Reservation(1, 1, "vm", 10, 20, {2: Res(100, 1024)}))
    before = [(n, table.changepoints(-math.inf, nodes=[n])) for n in (1, 2)]
    with pytest.raises(Overcommit) as err:
        table.add(Reservation(2, 2, "vm", 0, 30, {1: Res(50, 512), 2: Res(50, 512)}))
    assert (err.value.node, err.value.instant) == (2, 10)
    assert [(n, table.changepoints(-math.inf, nodes=[n])) for n in (1, 2)] == before
    assert table.used_at(1, 5) == Res.ZERO
    assert table.reservations(node=1) == []
    assert table.total_free_at(5) == Res(200, 2048)


def test_the_fleets_free_cpu_at_an_instant_matches_the_total_free():
    table = SlotTable({1: Res(100, 1024), 2: Res(200, 2048)})
    assert table.total_free_cpu_at(0) == 300
    table.add(Reservation(1, 1, "vm", 10, 20, {1: Res(100, 512), 2: Res(50, 0)}))
    for t in (0, 10, 15, 20, 25):
        assert table.total_free_cpu_at(t) == table.total_free_at(t).cpu
    assert table.total_free_cpu_at(10) == 150


@settings(max_examples=200, deadline=None)
@given(tables, queries)
def test_free_runs_give_every_earliest_fit(built, query):
    # The queue forecast reads earliest starts off these runs: the first run at least d long starts at the earliest
    # fit for d, for every d, and the runs are disjoint, in order, and end at inf.
    table, naive = build(*built)
    node, need, after, _ = query
    runs = table.free_runs(node, need, after)
    if not need.fits_in(CAP[node]):
        assert runs == []
        return
    assert runs[-1][1] == math.inf and runs[0][0] >= after
    assert all(a < b < c for (a, b), (c, _) in itertools.pairwise(runs))
    for length in (0.5, 1.0, 3.0, 7.0, 40.0):
        first = next((a for a, b in runs if b - a >= length), None)
        assert first == naive.earliest_fit(node, need, length, after)


def blockers_segment_by_segment(table, naive, node, need, start, end):
    """The blockers' definition, walked one segment at a time over every reservation: a reservation blocks when it
    shares an instant with a segment where the node has no room for `need`, in a dimension it uses there."""
    if not need.fits_in(CAP[node]):
        return []
    points = sorted(
        {start, end, *(t for r in naive.rows.values() for t in (r.start, r.end) if start < t < end)}
    )
    segments = [(a, b) for a, b in itertools.pairwise(points)] if end > start else [(start, start)]
    found = {}
    for a, b in segments:
        level = naive.used(node, a)
        short = [
            d
            for d in ("cpu", "mem")
            if getattr(need, d) and getattr(level, d) + getattr(need, d) > getattr(CAP[node], d)
        ]
        for r in naive.rows.values():
            if node in r.alloc and r.overlaps(a, b) and any(getattr(r.alloc[node], d) > 0 for d in short):
                found[r.rid] = r
    return sorted(found.values(), key=lambda r: (r.start, r.rid))


@settings(max_examples=300, deadline=None)
@given(tables, st.lists(queries, min_size=1, max_size=5))
def test_the_blockers_are_the_reservations_in_the_way_segment_by_segment(built, qs):
    table, naive = build(*built)
    for node, need, t, length in qs:
        expected = blockers_segment_by_segment(table, naive, node, need, t, t + length)
        assert [r.rid for r in table.blockers(node, need, t, t + length)] == [r.rid for r in expected]


@settings(max_examples=200, deadline=None)
@given(tables, st.data())
def test_moving_a_reservations_share_to_another_node_is_the_same_as_removing_and_adding_it(built, data):
    """A reschedule moves one vnode's share to another node: same times, same total. replace() rewrites only the
    two nodes then; the table must answer exactly as if the reservation had been removed and added again."""
    table, naive = build(*built)
    moved = [r for r in naive.rows.values() if len(r.alloc) == 1]
    if not moved:
        return
    r = data.draw(st.sampled_from(moved))
    [(source, use)] = r.alloc.items()
    target = 2 if source == 1 else 1
    shifted = Reservation(r.rid, r.lease_id, r.kind, r.start, r.end, {target: use})
    reference = SlotTable(CAP)
    for other in naive.rows.values():
        if other.rid != r.rid:
            reference.add(other)
    try:
        reference.add(shifted)
        fits = True
    except Overcommit:
        fits = False
    table.blockers(target, Res(cpu=1), 0.0, 30.0)  # built the kept columns, which the move must drop
    if not fits:
        with pytest.raises(Overcommit):
            table.replace(shifted)
        shifted, reference = r, SlotTable(CAP)
        for other in naive.rows.values():
            reference.add(other)
    else:
        table.replace(shifted)
    assert table.get(r.rid) == shifted
    for node in CAP:
        for t in range(0, 34):
            assert table.used_at(node, float(t)) == reference.used_at(node, float(t))
        assert table.blockers(node, Res(cpu=1), 0.0, 30.0) == reference.blockers(node, Res(cpu=1), 0.0, 30.0)
    assert table.total_free_at(float(r.start)) == reference.total_free_at(float(r.start))


def test_the_columns_answer_a_window_again_from_memory_until_the_next_write():
    """NodeArrays.over keeps its answer per window for a pass's reports; a write to the table must drop it."""
    table = SlotTable({1: Res(400, 4096), 2: Res(400, 4096)})
    table.add(Reservation(1, 1, "vm", 0.0, 100.0, {1: Res(100, 1024)}))
    peak, _ = table.arrays().over(0.0, 50.0)
    assert peak.tolist()[0][:2] == [100, 1024] and peak.tolist()[1][:2] == [0, 0]
    assert table.arrays().over(0.0, 50.0)[0] is peak  # asked again: the same answer, not a new gather
    with pytest.raises(ValueError):
        peak[0, 0] = 0  # shared by every caller until the next write: read-only
    table.add(Reservation(2, 2, "vm", 10.0, 20.0, {1: Res(200, 1024), 2: Res(100, 512)}))
    fresh, _ = table.arrays().over(0.0, 50.0)
    assert fresh.tolist()[0][:2] == [300, 2048] and fresh.tolist()[1][:2] == [100, 512]
    assert table.arrays().peak_over(0.0, 50.0).tolist() == fresh.tolist()
    table.remove(2)
    assert table.arrays().over(0.0, 50.0)[0].tolist() == peak.tolist()


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_the_fleet_total_follows_many_writes_and_copies_as_a_sum_of_every_reservation(rnd):
    """The fleet-wide total (total_free_at, total_free_cpu_at): after every write, on the table and on a copy taken
    halfway, it equals the plain sum over the reservations each one holds (kept for any faster total to meet)."""
    nodes = {n: Res(cpu=10_000, mem=100_000, disk=1_000) for n in range(1, 6)}
    table = SlotTable(nodes)
    held: dict[int, Reservation] = {}
    copy, copy_held = None, None

    def check(t: SlotTable, rows: dict[int, Reservation]) -> None:
        for at in [rnd.uniform(-5, 130) for _ in range(6)] + [r.start for r in rows.values()][:4]:
            used = [0, 0, 0]
            for r in rows.values():
                if r.start <= at < r.end:
                    for use in r.alloc.values():
                        used[0], used[1], used[2] = used[0] + use.cpu, used[1] + use.mem, used[2] + use.disk
            assert t.total_free_at(at) == Res(50_000 - used[0], 500_000 - used[1], 5_000 - used[2])
            assert t.total_free_cpu_at(at) == 50_000 - used[0]

    for step in range(rnd.randint(20, 300)):
        if held and rnd.random() < 0.35:
            rid = rnd.choice(sorted(held))
            table.remove(rid)
            del held[rid]
        else:
            rid = 1 + max(held, default=0) + step
            start = rnd.choice([rnd.randint(0, 100), rnd.uniform(0, 100)])
            end = start + rnd.choice([0, rnd.randint(1, 30), rnd.uniform(0.5, 30)])
            alloc = {
                n: Res(rnd.randint(0, 50), rnd.randint(0, 500), rnd.randint(0, 5))
                for n in rnd.sample(range(1, 6), 2)
            }
            r = Reservation(rid, rid, "vm", start, end, alloc)
            table.add(r)
            held[rid] = r
        if step == 10:
            copy, copy_held = table.copy(), dict(held)
        check(table, held)
    if copy is not None:
        copy.add(Reservation(10**6, 1, "vm", 0, 200, {1: Res(7, 70, 1)}))
        copy_held[10**6] = copy._index.by_rid[10**6]
        check(copy, copy_held)
        check(table, held)
