"""Table tests for the pure scheduler: options, preemption, threshold, backfilling, immediacy, migration, journal.

Nodes are Haizea's test nodes (CPU 100, Memory 1024 MB); F is a full node's VM, H half of one. Times are seconds.
"""

from __future__ import annotations

import pytest

from leases.lifecycle import IllegalTransition, LeaseState
from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.scheduling.timing import global_groups, local_groups
from leases.slottable import Res

F = Res(cpu=100, mem=1024)
H = Res(cpu=50, mem=512)


def make(nodes: int = 4, **config: object) -> Scheduler:
    return Scheduler({n: Res(100, 1024, 0, 100, 100) for n in range(1, nodes + 1)}, SchedulerConfig(**config))


def be(lid: int, submit: float, duration: float, *vnodes: Res, preemptible: bool = True) -> LeaseRequest:
    return LeaseRequest(lid, "best_effort", submit, None, duration, vnodes or (F,), preemptible=preemptible)


def ar(lid: int, submit: float, start: float, duration: float, *vnodes: Res) -> LeaseRequest:
    return LeaseRequest(
        lid, "advance_reservation", submit, start, duration, vnodes or (F,), preemptible=False
    )


def im(lid: int, submit: float, duration: float, *vnodes: Res) -> LeaseRequest:
    return LeaseRequest(lid, "immediate", submit, None, duration, vnodes or (F,), preemptible=False)


def live(s: Scheduler, lid: int, kind: str = "vm") -> list[tuple[float, float, list[int]]]:
    return [
        (r.start, r.end, sorted(set(r.nodes.values())))
        for r in s.leases[lid].reservations
        if r.kind == kind and r.status != "cancelled"
    ]


# -- options ---------------------------------------------------------------------------------------------


def test_haizea_option_names_map_onto_the_config():
    config = SchedulerConfig.from_options(
        {
            "backfilling": "intermediate",
            "backfilling-reservations": "3",
            "suspend-rate": "50",
            "migration": "yes",
        }
    )
    assert (config.backfilling, config.max_in_future, config.suspend_rate, config.migration) == (
        "intermediate",
        3,
        50.0,
        "yes",
    )


def test_an_unknown_option_is_refused_with_the_list_of_known_ones():
    with pytest.raises(ValueError, match=r"unknown scheduling option .suspend-speed.; known: .*suspend-rate"):
        SchedulerConfig.from_options({"suspend-speed": "3"})


def test_slotkeeper_defaults_are_aggressive_backfilling_and_ars_preempting_best_effort():
    config = SchedulerConfig.from_options({})
    assert (config.backfilling, config.max_in_future, config.preempts) == ("aggressive", 1, True)


def test_intermediate_backfilling_without_a_reservation_count_is_refused():
    with pytest.raises(ValueError, match="backfilling-reservations"):
        SchedulerConfig.from_options({"backfilling": "intermediate"})


# -- preemption (§4.4, Q1, Q6) ---------------------------------------------------------------------------


def preemption_fleet(*, young_preemptible: bool = True) -> Scheduler:
    """Two nodes: old half VM (lease 1) and youngest half VM (lease 3) share node 1; lease 2 fills node 2."""
    s = make(2)
    s.submit(be(1, 0, 3600, H), 0)
    s.submit(be(2, 10, 3600, F), 10)
    s.submit(be(3, 20, 3600, H, preemptible=young_preemptible), 20)
    assert live(s, 1)[0][2] == live(s, 3)[0][2] == [1] and live(s, 2)[0][2] == [2]
    return s


def test_an_ar_preempts_only_the_leases_it_needs_even_if_a_younger_one_was_tried_first():
    s = preemption_fleet()
    decision = s.submit(ar(9, 30, 1000, 600), 30)
    assert decision.accepted
    assert live(s, 2) == [(10, 968, [2])]
    assert live(s, 2, "suspend") == [(968, 1000, [2])]
    assert live(s, 1) == [(0, 3600, [1])] and live(s, 3) == [(20, 3620, [1])]


@pytest.mark.parametrize("needs, victims", [((F,), {2}), ((F, F), {1, 2, 3}), ((H,), {3})])
def test_the_preempted_set_is_minimal(needs, victims):
    s = preemption_fleet()
    s.submit(ar(9, 30, 1000, 600, *needs), 30)
    hit = {lid for lid in (1, 2, 3) if live(s, lid, "suspend")}
    assert hit == victims


def test_the_youngest_preemptible_lease_is_preempted_first():
    s = make(3)
    for lid, submit in [(1, 0), (2, 10), (3, 20)]:
        s.submit(be(lid, submit, 3600), submit)
    s.submit(ar(9, 30, 1000, 600), 30)
    assert [lid for lid in (1, 2, 3) if live(s, lid, "suspend")] == [3]


def test_a_non_preemptible_lease_is_never_preempted_and_the_ar_is_rejected_instead():
    s = make(1)
    s.submit(be(1, 0, 3600, preemptible=False), 0)
    decision = s.submit(ar(9, 30, 1000, 600), 30)
    assert not decision.accepted
    (verdict,) = s.explain(s.leases[9].request, 1000, 1600).verdicts
    assert (verdict.holds, verdict.code, verdict.blockers) == (0, "reserved", (1,))
    assert (verdict.dim, verdict.need, verdict.free, verdict.allocatable) == ("mem", 1024, 0, 1024)
    assert live(s, 1) == [(0, 3600, [1])]


def test_with_no_preemption_policy_the_ar_is_rejected():
    s = make(1, policy_preemption="no-preemption")
    s.submit(be(1, 0, 3600), 0)
    assert not s.submit(ar(9, 30, 1000, 600), 30).accepted


def test_a_lease_too_young_to_suspend_before_the_ar_is_cancelled_and_requeued_from_scratch():
    s = make(1)
    s.submit(be(1, 0, 3600), 0)
    s.submit(ar(9, 10, 40, 600), 10)  # 40 s of run time is below the 64 s threshold
    rec = s.leases[1]
    assert (rec.lost_run_time, rec.run_time) == (10, 0)
    assert live(s, 1) == [(0, 10, [1]), (640, 4240, [1])]


# -- the scheduling threshold (§3.9) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "ar_start, first_vm",
    [
        (600, (0, 568, [1])),  # 600 s before the AR: run, suspend 568-600, resume after it
        (64, (0, 32, [1])),  # exactly the 2 x 32 s threshold is still worth starting
        (63, (663, 4263, [1])),  # one second less: wait behind the AR
    ],
)
def test_a_best_effort_lease_starts_before_a_blocker_only_if_it_can_run_the_threshold(ar_start, first_vm):
    s = make(1)
    s.submit(ar(9, 0, ar_start, 600), 0)
    s.submit(be(1, 0, 3600), 0)
    assert live(s, 1)[0] == first_vm


def test_a_suspended_future_reservation_replanned_after_an_early_end_needs_only_the_suspend_threshold():
    # §3.9: the resume estimate counts towards the threshold only while the lease waits in the queue
    # (SUSPENDED_QUEUED); re-planned after an early end it is SUSPENDED_PENDING and needs 2 x 32 s, not 4 x 32.
    s = make(1)
    s.submit(ar(9, 0, 200, 50), 0)
    s.submit(ar(8, 0, 650, 100), 0)
    s.submit(be(1, 0, 2000), 0)  # runs 0-168, suspended 168-200 before AR 9
    s.submit(LeaseRequest(2, "best_effort", 100, None, 1000, (F,), real_duration=300), 100)
    while (t := s.next_event_time()) is not None:
        s.advance(t)
    # Lease 2 holds the future reservation (250, after AR 9), so lease 1 waits for it and is given the future
    # slot at 750 (after AR 8). Lease 2 ends early at 550: lease 1 is re-planned there, and the 100 s before
    # AR 8 (resume 550-582, run 582-618, suspend 618-650) pass 64 s though not 128 s.
    assert live(s, 1, "resume") == [(550, 582, [1]), (750, 782, [1])]
    assert live(s, 1) == [(0, 168, [1]), (582, 618, [1]), (782, 2578, [1])]
    assert s.leases[1].end == 2578  # 168 + 36 + 1796 s of run time


def test_with_suspension_none_the_threshold_is_zero_and_a_lease_never_starts_into_a_blocker():
    s = make(1, suspension="none")
    s.submit(ar(9, 0, 600, 600), 0)
    s.submit(be(1, 0, 3600), 0)
    assert live(s, 1) == [(1200, 4800, [1])]


# -- backfilling (§3.6) ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, extra, future",
    [
        ("off", {}, 0),
        ("aggressive", {}, 1),
        ("intermediate", {"backfilling_reservations": 2}, 2),
        ("conservative", {}, 4),
    ],
)
def test_backfilling_caps_how_many_queued_leases_hold_future_reservations(mode, extra, future):
    s = make(1, backfilling=mode, **extra)
    for lid in range(1, 6):
        s.submit(be(lid, 0, 600), 0)
    holders = [lid for lid in range(2, 6) if s.leases[lid].in_future]
    assert len(holders) == future
    assert len(s.queue) == 4 - future


def test_a_short_lease_backfills_a_hole_before_the_future_reservation():
    s = make(2)
    s.submit(be(1, 0, 3600), 0)
    s.submit(be(2, 0, 600, F, F), 0)  # must wait for node 1: future reservation at 3600
    s.submit(be(3, 0, 600), 0)  # fits now on node 2, ending before 3600
    assert live(s, 2) == [(3600, 4200, [1, 2])]
    assert live(s, 3) == [(0, 600, [2])]


# -- immediate leases (Q7) -------------------------------------------------------------------------------


@pytest.mark.parametrize("duration, accepted", [(300, True), (301, False)])
def test_an_immediate_lease_runs_its_whole_duration_now_or_is_rejected(duration, accepted):
    s = make(1)
    s.submit(ar(9, 0, 300, 600), 0)
    decision = s.submit(im(1, 0, duration), 0)
    assert decision.accepted is accepted
    assert decision.state == (LeaseState.ACTIVE if accepted else LeaseState.REJECTED)
    if not accepted:
        (verdict,) = s.explain(s.leases[1].request, 0, duration).verdicts
        # Free now, but not for the whole window: reserved (by the AR), not at capacity.
        assert (verdict.holds, verdict.code, verdict.blockers) == (0, "reserved", (9,))
        assert s.leases[1].reservations == []


def test_requests_handed_in_together_decide_every_immediate_lease_before_the_queue_runs():
    """SEMANTICS.md §3.2: the requests of one instant (a replay step, a group-commit pass) decide their ARs and
    IMs first and run the queue once after them. Running it after each accepted IM let a best-effort lease handed
    in earlier take the room a later IM of the same instant needed, and cost a queue pass per fixed lease."""
    s = make(2)
    first = s.submit(be(1, 0, 600), 0, defer=True)
    im_a = s.submit(im(2, 0, 600), 0, defer=True)
    im_b = s.submit(im(3, 0, 600), 0, defer=True)
    assert (first.state, im_a.accepted, im_b.accepted) == (LeaseState.QUEUED, True, True)
    assert s.leases[1].state == LeaseState.QUEUED  # not yet: the queue has not run
    s.run_queue(0)
    assert [s.leases[i].state for i in (2, 3)] == [LeaseState.ACTIVE, LeaseState.ACTIVE]
    assert [start for start, _, _ in live(s, 1)] == [600]  # after the IMs, not now
    # Without `defer`, an accepted IM runs the queue at once, as before.
    s = make(2)
    s.submit(be(1, 0, 600), 0, defer=True)
    s.submit(im(2, 0, 600), 0)
    assert [s.leases[i].state for i in (1, 2)] == [LeaseState.ACTIVE, LeaseState.ACTIVE]


# -- node exclusions -------------------------------------------------------------------------------------


def test_excluded_nodes_get_nothing_new_and_their_verdict_is_the_reason():
    s = make(2)
    s.submit(be(1, 0, 600), 0, excluded={1: "draining"})
    assert live(s, 1) == [(0, 600, [2])]
    decision = s.submit(ar(9, 0, 1000, 600, F, F), 0, excluded={1: "draining"})
    assert not decision.accepted
    verdicts = s.explain(s.leases[9].request, 1000, 1600, excluded={1: "draining"}).verdicts
    assert [(v.node, v.holds, v.code) for v in verdicts] == [(1, 0, "draining"), (2, 1, None)]


# -- suspension and migration timing (§3.8, §3.12, Q9) ---------------------------------------------------


@pytest.mark.parametrize(
    "groups, expected",
    [
        # two VMs on node 1 one after the other, node 2 in parallel; overhead 2 s per VM in each group
        (local_groups({1: 32, 2: 32, 3: 32}, {1: 1, 2: 1, 3: 2}, 100, True, 2), [(100, 136), (136, 170)]),
        (local_groups({1: 32, 2: 32}, {1: 1, 2: 2}, 100, False, 0), [(68, 100)]),
        (global_groups({1: 32, 2: 32}, {1: 1, 2: 2}, 100, True, 2), [(100, 134), (134, 168)]),
    ],
)
def test_suspend_and_resume_groups_follow_the_exclusion_mode(groups, expected):
    assert sorted((a, b) for a, b, _ in groups) == expected


def migration_case(block_node_1: bool) -> Scheduler:
    """Lease 1 runs on node 1, is suspended for a 2-node AR at 600-1200; AR 3 may then hold node 1."""
    s = make(2, migration="yes")
    s.submit(be(1, 0, 3600), 0)
    s.submit(ar(2, 100, 600, 600, F, F), 100)
    if block_node_1:
        s.submit(ar(3, 200, 1200, 3800), 200)
    s.advance(600)
    return s


def test_a_lease_resuming_in_place_waits_for_no_migration():
    s = migration_case(block_node_1=False)
    assert live(s, 1, "migrate") == []
    assert live(s, 1, "resume") == [(1200, 1232, [1])]


def test_a_lease_resuming_elsewhere_migrates_its_memory_at_the_bandwidth_first():
    s = migration_case(block_node_1=True)
    migrations = [r for r in s.leases[1].reservations if r.kind == "migrate"]
    assert [(r.start, r.end, r.sources, r.nodes) for r in migrations] == [(600, 682, {1: 1}, {1: 2})]
    assert live(s, 1, "resume") == [(1200, 1232, [2])]
    s.advance(650)
    assert s.leases[1].state == LeaseState.MIGRATING


# -- life cycle, cancel and journal ----------------------------------------------------------------------


def test_a_best_effort_lease_walks_the_haizea_life_cycle():
    s = make(1)
    s.submit(be(1, 0, 600), 0)
    s.advance(600)
    assert [to for _, _, to in s.leases[1].history] == [
        "pending",
        "queued",
        "scheduled",
        "ready",
        "active",
        "done",
    ]


def test_cancelling_a_finished_lease_is_refused_and_changes_nothing():
    s = make(1)
    s.submit(be(1, 0, 600), 0)
    s.advance(600)
    with pytest.raises(IllegalTransition):
        s.cancel(1, 700)
    assert s.leases[1].state == LeaseState.DONE


def test_cancelling_a_running_lease_stops_its_vm_and_counts_its_run_time():
    s = make(1)
    s.submit(be(1, 0, 600), 0)
    decision = s.cancel(1, 200)
    assert decision.state == LeaseState.CANCELLED
    assert live(s, 1) == [(0, 200, [1])] and s.leases[1].run_time == 200
    assert s.table.reservations(start=200) == []


def test_the_journal_lists_every_reservation_and_state_change_once():
    s = make(1)
    s.submit(be(1, 0, 600), 0)
    changes = s.take_changes()
    assert [c.state for c in changes if c.what == "lease_state"] == [
        "pending",
        "queued",
        "scheduled",
        "ready",
        "active",
    ]
    added = [c.reservation for c in changes if c.what == "reservation_added"]
    assert [(r.kind, r.start, r.end) for r in added if r] == [("vm", 0, 600)]
    assert s.take_changes() == []


def test_an_early_end_finishes_the_lease_at_its_real_duration():
    s = make(1)
    s.submit(LeaseRequest(1, "best_effort", 0, None, 600, (F,), real_duration=100), 0)
    assert s.next_event_time() == 100
    s.advance(100)
    assert (s.leases[1].state, s.leases[1].run_time, s.leases[1].end) == (LeaseState.DONE, 100, 100)


@pytest.mark.parametrize("retry, placed_on", [(False, None), (True, 2)])
def test_a_lease_the_greedy_first_choice_holds_too_briefly_waits_in_haizea_and_runs_elsewhere_live(
    retry, placed_on
):
    # Node 1 is empty now but an AR takes it whole from t=100; node 2 runs two small long leases, so the greedy
    # mapper prefers node 1, which would hold the new lease for 100 s: below its 128 s threshold.
    s = Scheduler(
        {1: Res(400, 8192, 0, 100, 100), 2: Res(400, 8192, 0, 100, 100)},
        SchedulerConfig(whole_window_retry=retry),
        strict=True,
    )
    s.submit(ar(9, 0, 100, 3600, Res(cpu=400, mem=8192)), 0)
    small = Res(cpu=50, mem=512)
    s.submit(LeaseRequest(1, "immediate", 0, None, 7200, (small,), preemptible=False), 0, excluded={1: "x"})
    s.submit(LeaseRequest(2, "immediate", 0, None, 7200, (small,), preemptible=False), 0, excluded={1: "x"})
    s.submit(be(3, 0, 3600, Res(cpu=100, mem=2048)), 0)
    if placed_on is None:
        # Haizea 1.1 gives up on now after its first choice, and backfills the lease into the future instead.
        assert s.leases[3].state == LeaseState.READY and s.leases[3].current_vm().start > 0
    else:
        assert live(s, 3) == [(0, 3600, [placed_on])]


def test_a_scheduler_that_takes_over_another_plans_as_that_one_and_the_other_is_used_up():
    # The plan applier's way back from a submit that raised part-way: the half-changed scheduler becomes one built
    # again from the records the pass started from, and stays the object the pass holds.
    half = make()
    half.submit(be(1, 0, 100, F, F, F, F), 0)
    half.submit(ar(2, 0, 50, 100, F, F, F, F), 0)  # preempted lease 1 and placed itself
    fresh = make()
    fresh.submit(be(1, 0, 100, F, F, F, F), 0)
    fresh.take_changes()
    expected = make()
    expected.submit(be(1, 0, 100, F, F, F, F), 0)
    expected.take_changes()
    assert half.leases[2].state == LeaseState.READY and live(half, 1) != live(expected, 1)
    held = half
    half.take_over(fresh)
    assert half is held
    assert 2 not in half.leases and half.take_changes() == []
    assert live(half, 1) == live(expected, 1) and half.next_rid == expected.next_rid
    assert half.leases[1].state == expected.leases[1].state == LeaseState.ACTIVE
    # It goes on planning as the fresh one would have.
    assert half.submit(im(3, 10, 20, F), 10).accepted == expected.submit(im(3, 10, 20, F), 10).accepted
    assert live(half, 3) == live(expected, 3) and half.take_changes() == expected.take_changes()
    assert vars(fresh) == {}
    with pytest.raises(TypeError):
        half.take_over(object())  # type: ignore[arg-type]


def test_a_lease_that_cannot_be_requeued_off_an_unusable_node_is_isolated_and_the_tick_goes_on(monkeypatch):
    # advance() requeues a best-effort lease whose reservation comes due on an excluded node. A lease that raised
    # there raised out of every tick (and every approval, which advances first): the tick failed for good.
    s = make(2)
    s.submit(be(1, 0, 600, F, F), 0)  # both nodes until 600
    s.submit(be(2, 0, 600), 0)  # queued, with a future reservation from 600
    s.submit(be(3, 0, 600), 0)  # queued behind it
    (node,) = {n for _, _, nodes in live(s, 2) for n in nodes}
    real = Scheduler._requeue

    def broken(self, rec, now):
        if rec.request.id == 2:
            real(self, rec, now)
            raise RuntimeError("injected")
        real(self, rec, now)

    monkeypatch.setattr(Scheduler, "_requeue", broken)
    s.advance(600, {node: "draining"})
    assert s.leases[2].state == LeaseState.FAILED
    assert [lid for lid, _ in s.take_isolated()] == [2]
    assert 2 not in s.queue and not [
        r for r in s.leases[2].reservations if r.status in ("scheduled", "active")
    ]
    assert s.leases[3].state == LeaseState.ACTIVE  # the other node runs the rest of the queue


def test_a_running_vms_early_end_survives_a_reload_of_the_scheduler():
    """Found by the demo: restore pushed a VM's start and end but not its early end (the lease's real run time), so
    a scheduler loaded again ran the VM to its planned end, and once it was suspended and resumed, the early end
    fell before the resumed VM's start and every tick failed writing it."""
    first = make(1)
    first.submit(LeaseRequest(1, "best_effort", 0, None, 600, (F,), real_duration=100), 0)
    first.advance(10)
    again = make(1)
    for rec in first.leases.values():
        again.restore(rec)
    again.advance(200)
    assert again.leases[1].state == LeaseState.DONE
    assert again.leases[1].end == 100


def test_an_early_end_never_comes_before_its_vms_start():
    s = make(1)
    s.submit(LeaseRequest(1, "best_effort", 0, None, 600, (F,), real_duration=100), 0)
    rec = s.leases[1]
    rec.run_time = 150  # more than its real run time, used up before this VM (a reload lost its early end)
    vm = rec.current_vm()
    assert vm is not None and s._early_end(rec, vm) == vm.start
