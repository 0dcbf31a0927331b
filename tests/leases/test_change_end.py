"""Changing a placed lease's end (issue 48), in the pure scheduler: an extension takes free room on its own nodes and
nothing else; it never moves an advance reservation; a best-effort lease's future plan makes way; a shortening frees
the room at once for the queue; a dry run answers the same and changes nothing."""

from __future__ import annotations

from leases.lifecycle import LeaseState
from tests.leases.test_scheduler import ar, be, im, live, make


def test_an_extension_into_free_room_moves_the_end_and_the_duration():
    s = make(1)
    s.submit(im(1, 0, 100), 0)
    got = s.change_end(1, 250, 10)
    assert got.ok and got.code == "" and got.old_end == 100 and got.new_end == 250
    assert live(s, 1) == [(0, 250, [1])]
    assert s.leases[1].request.duration == 250


def test_an_extension_never_moves_an_advance_reservation_and_says_the_latest_end():
    s = make(1)
    s.submit(im(1, 0, 100), 0)
    s.submit(ar(2, 0, 200, 100), 0)
    before = live(s, 1)
    got = s.change_end(1, 300, 10)
    assert not got.ok and got.code == "blocked"
    assert got.blocking == (2,)
    assert got.latest_end is not None and 100 < got.latest_end <= 200
    assert live(s, 1) == before and live(s, 2) == [(200, 300, [1])]
    # The latest end it named fits.
    assert s.change_end(1, got.latest_end, 10).ok


def test_a_future_best_effort_plan_makes_way_and_is_planned_after():
    s = make(1)
    s.submit(im(1, 0, 100), 0)
    s.submit(be(2, 0, 100), 0)  # backfilled after lease 1, on the one node
    assert live(s, 2)[0][0] >= 100
    dry = s.change_end(1, 300, 10, dry_run=True)
    assert dry.ok and dry.replanned == (2,)
    assert live(s, 1) == [(0, 100, [1])] and live(s, 2)[0][0] < 300  # the dry run changed nothing
    got = s.change_end(1, 300, 10)
    assert got.ok and got.replanned == (2,)
    assert live(s, 1) == [(0, 300, [1])]
    assert all(start >= 300 for start, _, _ in live(s, 2) if start >= 10)


def test_a_shortening_frees_the_room_for_the_queue_at_once():
    s = make(1)
    s.submit(im(1, 0, 1000), 0)
    s.submit(be(2, 0, 100), 0)
    assert live(s, 2)[-1][0] >= 1000
    got = s.change_end(1, 50, 10)
    assert got.ok
    assert live(s, 1) == [(0, 50, [1])]
    assert live(s, 2)[-1][0] < 1000  # planned into the freed room
    assert s.leases[1].request.duration == 50


def test_an_end_before_now_or_a_lease_not_placed_is_refused():
    s = make(1)
    s.submit(im(1, 0, 100), 0)
    s.submit(im(2, 0, 100), 0)  # the one node is taken: rejected, so it has no plan to change
    assert s.leases[2].state == LeaseState.REJECTED
    assert s.change_end(1, 5, 10).code == "too_early"
    assert s.change_end(2, 500, 10).code == "not_changeable"
    assert live(s, 1) == [(0, 100, [1])]
