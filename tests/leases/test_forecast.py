"""The queue forecast (leases/scheduling/forecast.py), pure: hand-checked schedules on Haizea's test nodes
(CPU 100, memory 1024 MB; F is a whole node's VM). Times are seconds."""

from __future__ import annotations

import copy
from dataclasses import replace

from leases.lifecycle import LeaseState
from leases.scheduler import Estimate, LeaseRecord, ReservationRecord, forecast, snapshot
from tests.leases.test_scheduler import F, be, live, make


def blocked_queue():
    """Two nodes. Lease 1 holds both over 0-100; lease 2 (one VM, 50 s) got aggressive backfilling's one future
    reservation, 100-150 on node 1. Leases 3, 4 and 5 wait in the queue with no start at all."""
    s = make(2)
    s.submit(be(1, 0, 100, F, F), 0)
    s.submit(be(2, 0, 50), 0)
    s.submit(be(3, 1, 40, F, F), 1)  # both nodes for 40 s
    s.submit(be(4, 2, 30), 2)  # one node for 30 s
    s.submit(be(5, 3, 200), 3)  # one node for 200 s
    assert live(s, 2) == [(100, 150, [1])]
    assert list(s.queue) == [3, 4, 5]
    return s


def test_each_queued_lease_is_reserved_in_queue_order_at_its_earliest_start():
    s = blocked_queue()
    got = forecast(s, 10)
    assert got == {
        # Both nodes are first free together when lease 2 ends on node 1: 150-190.
        3: Estimate(150, 190),
        # Backfilled: lease 3 takes node 2 only from 150, so node 2 is free over 100-150, and 30 s fit there.
        4: Estimate(100, 130),
        # 200 s fit nowhere before lease 3 ends (node 2's gap 130-150 is too short): 190 on node 1.
        5: Estimate(190, 390),
    }


def test_the_forecast_changes_nothing_in_the_scheduler():
    s = blocked_queue()
    s.take_changes()
    before = (
        [(r.rid, r.lease_id, r.start, r.end, dict(r.alloc)) for r in s.table.reservations()],
        list(s.queue),
        {lid: (rec.state, copy.deepcopy(rec.reservations)) for lid, rec in s.leases.items()},
        s.next_rid,
    )
    forecast(s, 10)
    forecast(s, 10)  # and asking twice gives the same answer from the same state
    after = (
        [(r.rid, r.lease_id, r.start, r.end, dict(r.alloc)) for r in s.table.reservations()],
        list(s.queue),
        {lid: (rec.state, rec.reservations) for lid, rec in s.leases.items()},
        s.next_rid,
    )
    assert after == before
    assert s.take_changes() == []
    assert forecast(s, 10) == forecast(s, 10)


def test_the_forecast_agrees_with_conservative_backfilling():
    # The same workload under conservative backfilling (and no suspension, so no window is shortened) reserves
    # every queued lease where the forecast says it would be.
    s = make(2, backfilling="conservative", suspension="none")
    s.submit(be(1, 0, 100, F, F), 0)
    s.submit(be(2, 0, 50), 0)
    s.submit(be(3, 1, 40, F, F), 1)
    s.submit(be(4, 2, 30), 2)
    s.submit(be(5, 3, 200), 3)
    assert [live(s, lid)[0][:2] for lid in (3, 4, 5)] == [(150, 190), (100, 130), (190, 390)]


def test_a_lease_that_can_never_fit_gets_none_with_the_reason():
    s = blocked_queue()
    # A lease with a capability no node has: barred from both.
    rec = s.leases[5]
    s.leases[5] = LeaseRecord(
        request=replace(
            rec.request, barred=((1, "missing_capability: lacks gpu"), (2, "missing_capability: lacks gpu"))
        ),
        state=rec.state,
    )
    got = forecast(s, 10)
    assert got[5] == Estimate(None, None, "no usable node: 2 missing_capability")
    # With node 2 draining, lease 3 (two whole nodes) can never fit; lease 4 waits for lease 2 on node 1.
    drained = forecast(s, 10, excluded={2: "draining: maintenance"})
    assert drained[3] == Estimate(
        None, None, "its 2 VM(s) do not fit on the 1 usable node(s) even when they are empty"
    )
    assert drained[4] == Estimate(150, 180)


def test_a_suspended_lease_waits_for_its_memory_node_and_counts_its_resumption():
    s = blocked_queue()
    # Lease 7 ran 40 of its 100 s and was suspended with its memory on node 2; it is first in the queue.
    s.restore(
        LeaseRecord(
            request=be(7, -10, 100),
            state=LeaseState.SUSPENDED_QUEUED,
            reservations=[ReservationRecord(900, 7, "vm", -50, -10, {1: 2}, status="done")],
            run_time=40,
            images={1: 2},
        )
    )
    assert list(s.queue) == [7, 3, 4, 5]
    got = forecast(s, 10)
    # Resumption 32 s (1024 MB at 32 MB/s) + the 60 s left, on node 2 from 100 (migration = no).
    assert got[7] == Estimate(100, 192)
    # Node 2 is now busy until 192: lease 3 waits for it, lease 4 backfills nowhere before 232.
    assert got[3] == Estimate(192, 232)
    assert got[4] == Estimate(150, 180)
    assert forecast(s, 10, excluded={2: "draining: maintenance"})[7].note == (
        "suspended with its memory on node 2, which is unusable (draining: maintenance)"
    )


def test_a_group_spread_and_the_limit():
    s = blocked_queue()
    # At most one of the group's VMs on a node, and the group already has one on node 2: lease 3's two VMs
    # can never be placed.
    rec = s.leases[3]
    s.leases[3] = LeaseRecord(request=replace(rec.request, spread=1, taken=((2, 1),)), state=rec.state)
    got = forecast(s, 10)
    assert got[3] == Estimate(
        None,
        None,
        "its 2 VM(s) do not fit on the 1 usable node(s) even when they are empty, at most 1 on a node",
    )
    assert got[4] == Estimate(100, 130)  # lease 3 holds nothing, so the queue behind it moves up
    assert got[5] == Estimate(130, 330)
    # Only the first lease looked at: the rest say why they have no estimate.
    assert forecast(s, 10, limit=1)[4] == Estimate(
        None, None, "beyond the first 1 queued leases the forecast looks at"
    )


def test_a_snapshot_keeps_the_forecasts_input_while_the_live_scheduler_moves_on():
    # The plan applier takes the snapshot under the plan lock and forecasts from it after the lock is released,
    # while the next pass changes the live scheduler: nothing that pass does may reach the snapshot.
    s = blocked_queue()
    s.restore(
        LeaseRecord(
            request=be(7, -10, 100),
            state=LeaseState.SUSPENDED_QUEUED,
            reservations=[ReservationRecord(900, 7, "vm", -50, -10, {1: 2}, status="done")],
            run_time=40,
            images={1: 2},
        )
    )
    snap = snapshot(s)
    before = forecast(snap, 10)
    assert before == forecast(s, 10)
    # The next pass: lease 1 is cancelled (its reservations leave the live table and the queue moves up), and a
    # pass changes a queued record in place (where its memory is, how long it ran).
    s.cancel(1, 10)
    s.leases[7].images[1] = 1
    s.leases[7].run_time = 0
    s.submit(be(8, 11, 500, F), 11)
    assert forecast(s, 12) != before  # the live scheduler did move
    assert snap.queue == (7, 3, 4, 5)
    assert forecast(snap, 10) == before
