"""`Scheduler.decide`, the one answer to "can this run, where, and if not why" (docs/placer.md), without a database:
the three outcomes named from the capable nodes alone, a submission refused when no node could ever take it, and
live placement ranked by seed 001's free slots, then headroom, then id.

Node sizes are allocatable figures of the measured machines of seed 001 (tank 61440 MiB less the 4096 MiB reserve
and its 6144 MiB idle baseline: 51200; architect with 7168 idle: 50176; morpheus 31757 with 4314 idle: 23347)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from leases.lifecycle import LeaseState
from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.slottable import Res

TANK, ARCHITECT, MORPHEUS = 1, 2, 3
SIZES = {
    TANK: Res(cpu=1600, mem=51200, disk=980),
    ARCHITECT: Res(cpu=1600, mem=50176, disk=880),
    MORPHEUS: Res(cpu=800, mem=23347, disk=380),
}
LIVE = SchedulerConfig(whole_window_retry=True, rank_by_slots=True)
GiB8 = Res(cpu=100, mem=8192)
NOW = 1_000_000.0


def fleet(config: SchedulerConfig = LIVE, sizes=SIZES) -> Scheduler:
    s = Scheduler(dict(sizes), config)
    s.advance(NOW)
    return s


def ask(
    lid: int = -1, *vnodes: Res, kind: str = "immediate", start: float | None = None, **extra
) -> LeaseRequest:
    return LeaseRequest(
        lid, kind, NOW, start, 3600, vnodes or (GiB8,), preemptible=kind == "best_effort", **extra
    )


def lacking(*nodes: int, capability: str = "accel.tpu") -> dict:
    return {
        "barred": tuple((n, f"missing_capability: lacks {capability}") for n in nodes),
        "capabilities": frozenset({capability}),
    }


def test_a_capability_no_node_has_is_no_capable_node_and_the_message_names_it():
    trial = fleet().decide(ask(-1, **lacking(TANK, ARCHITECT, MORPHEUS)), NOW)
    assert trial.outcome == "no_capable_node"
    assert "accel.tpu" in trial.message and "not queued" in trial.message


def test_a_capability_only_a_silent_node_has_is_fleet_unreadable_whatever_the_others_say():
    # architect and morpheus are online with room, but lack the capability: they say nothing about tank.
    excluded = {TANK: "no_recent_health: no heartbeat for 45 s"}
    trial = fleet().decide(ask(-1, **lacking(ARCHITECT, MORPHEUS)), NOW, excluded)
    assert trial.outcome == "fleet_unreadable"


def test_a_vm_larger_than_every_capable_node_is_no_capable_node_naming_the_largest_capable_one():
    # 55 GiB fits no node's allocatable memory; the largest capable node (morpheus lacks the capability) is tank.
    trial = fleet().decide(ask(-1, Res(cpu=100, mem=56320), **lacking(MORPHEUS)), NOW)
    assert trial.outcome == "no_capable_node"
    assert "the largest, 1, allocates at most 50 GiB memory, 980 GiB disk, 16 cores" in trial.message


def test_a_node_both_too_small_and_draining_is_too_small_and_the_others_decide():
    # 40 GiB: morpheus is too small even when empty; tank is draining; architect is full. Capable, readable, full.
    s = fleet()
    s.submit(ask(7, Res(cpu=100, mem=50000)), NOW)
    s.submit(ask(8, Res(cpu=100, mem=50000)), NOW)
    excluded = {TANK: "draining: kernel upgrade", MORPHEUS: "draining: kernel upgrade"}
    trial = s.decide(ask(-1, Res(cpu=100, mem=40960)), NOW, excluded)
    assert trial.outcome == "fleet_at_capacity"
    verdicts = {
        v.node: v
        for v in s.explain(ask(-1, Res(cpu=100, mem=40960)), NOW, NOW + 3600, excluded=excluded).verdicts
    }
    assert (verdicts[MORPHEUS].code, verdicts[TANK].code, verdicts[ARCHITECT].code) == (
        "too_small",
        "draining",
        "at_capacity",
    )


def test_when_every_capable_node_is_blind_or_too_small_the_fleet_is_unreadable():
    excluded = {
        TANK: "offline: no heartbeat for 3 min",
        ARCHITECT: "dead: declared dead",
        MORPHEUS: "offline: x",
    }
    trial = fleet().decide(ask(-1, Res(cpu=100, mem=40960)), NOW, excluded)
    assert trial.outcome == "fleet_unreadable"


def test_vms_that_do_not_fit_together_on_the_capable_nodes_even_empty_are_no_capable_node():
    # Three 40 GiB VMs: only tank and architect can hold one each, ever.
    trial = fleet().decide(ask(-1, *[Res(cpu=100, mem=40960)] * 3), NOW)
    assert trial.outcome == "no_capable_node"
    assert "do not fit together" in trial.message


def test_a_best_effort_lease_no_node_can_ever_run_is_rejected_at_submission_not_queued():
    s = fleet()
    decision = s.submit(ask(5, kind="best_effort", **lacking(TANK, ARCHITECT, MORPHEUS)), NOW)
    assert (decision.accepted, decision.state, decision.code) == (
        False,
        LeaseState.REJECTED,
        "no_capable_node",
    )
    assert 5 not in s.queue


def test_an_immediate_lease_refused_for_room_says_which_outcome():
    s = fleet()
    s.submit(ask(7, Res(cpu=100, mem=50000)), NOW)
    s.submit(ask(8, Res(cpu=100, mem=50000)), NOW)
    s.submit(ask(9, Res(cpu=100, mem=23000)), NOW)
    decision = s.submit(ask(10), NOW)
    assert (decision.accepted, decision.code) == (False, "fleet_at_capacity")
    assert "fleet at capacity" in decision.message


def test_one_vm_goes_to_the_node_with_most_free_slots_and_a_tie_to_the_idler_node():
    s = fleet()
    # tank and architect both have 6 slots of 8 GiB; architect is the idler (more headroom).
    s.observe({}, None, {TANK: 50.0, ARCHITECT: 90.0, MORPHEUS: 99.0})
    assert s.decide(ask(), NOW).nodes == [ARCHITECT]
    s.observe({}, None, {TANK: 95.0, ARCHITECT: 90.0, MORPHEUS: 99.0})
    assert s.decide(ask(), NOW).nodes == [TANK]
    # No headroom known (replay's case): the lower id.
    s.observe({}, None, {})
    assert s.decide(ask(), NOW).nodes == [TANK]


def test_the_verdicts_say_seed_001s_free_slots_and_holds_the_vms_of_this_request():
    s = fleet()
    verdicts = {v.node: v for v in s.explain(ask(), NOW, NOW + 3600).verdicts}
    assert {n: v.slots for n, v in verdicts.items()} == {TANK: 6, ARCHITECT: 6, MORPHEUS: 2}
    assert {n: v.holds for n, v in verdicts.items()} == {TANK: 1, ARCHITECT: 1, MORPHEUS: 1}


def test_several_vms_spread_over_the_nodes_with_most_slots_instead_of_stacking():
    s = fleet()
    trial = s.decide(ask(-1, *[GiB8] * 3), NOW)
    assert sorted(trial.mapping.values()) == [TANK, TANK, ARCHITECT] or sorted(trial.mapping.values()) == [
        TANK,
        ARCHITECT,
        ARCHITECT,
    ]
    assert len(set(trial.mapping.values())) == 2
    # Haizea's mapper (the replay's) packs the first node instead.
    haizea = fleet(SchedulerConfig()).decide(ask(-1, *[GiB8] * 3), NOW)
    assert set(haizea.mapping.values()) == {TANK}


def test_a_decision_changes_nothing_and_the_submission_lands_where_it_said():
    s = fleet()
    s.observe({}, None, {TANK: 10.0, ARCHITECT: 80.0})
    before = (s.next_rid, len(s.table.reservations()), s.unwritten)
    trial = s.decide(ask(-1, *[GiB8] * 4), NOW)
    assert (s.next_rid, len(s.table.reservations()), s.unwritten) == before
    decision = s.submit(ask(11, *[GiB8] * 4), NOW)
    assert decision.accepted
    placed = s.leases[11].current_vm()
    assert placed is not None and dict(placed.nodes) == dict(trial.mapping)


def test_an_advance_reservation_preview_names_the_leases_it_would_preempt():
    s = fleet(replace(LIVE, rank_by_slots=False), {1: Res(cpu=100, mem=8192)})
    s.submit(ask(3, kind="best_effort"), NOW)
    trial = s.decide(ask(-1, kind="advance_reservation", start=NOW + 600), NOW)
    assert trial.placed and trial.preempt == (3,)
    assert (trial.start, trial.end) == (NOW + 600, NOW + 4200)


@pytest.mark.parametrize("ask_id", [-1, -2])
def test_a_probe_with_an_id_a_lease_has_is_refused(ask_id):
    s = fleet()
    s.submit(ask(ask_id), NOW)
    with pytest.raises(ValueError):
        s.decide(ask(ask_id), NOW)


def test_a_dry_run_forgets_what_it_memoised_for_its_probe_id():
    s = fleet()
    s.decide(ask(-1, Res(cpu=100, mem=40960)), NOW)
    # The same id, another shape: answered for its own shape, not the last probe's.
    assert s.decide(ask(-1, *[GiB8] * 2), NOW).placed
    verdicts = {v.node: v.slots for v in s.explain(ask(-1, *[GiB8] * 2), NOW, NOW + 3600).verdicts}
    assert verdicts[MORPHEUS] == 2
