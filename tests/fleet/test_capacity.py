"""Table tests for the placer core (fleet/capacity.py), built from measured machines.

tank and architect are 60 GiB hosts (61440 MiB), morpheus a 31 GiB one (31744 MiB by `free`, 31757 MiB in the
run that found the young-VM bug). Their idle readings (6144, 7168, 5120 / 4314 MiB) and free disk (869, 388,
312 GiB) are real measurements: a change to the constants has to face what it does to real nodes. VM is the
8 GiB instance with 12 GiB of disk (an 8 GiB sparse rootfs plus its collected output) those machines ran.
No database: every case is plain values in, plain values out.
"""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.capacity import (
    BASELINE_FLOOR_MIB,
    DISK_RESERVE_GIB,
    HOST_RESERVE_MIB,
    Claim,
    Need,
    NodeState,
    Outcome,
    ReasonCode,
    Unfit,
    assess,
    committed_claims,
    effective_use,
    headroom_of,
    host_baseline_mib,
    place,
)

VM = Need(mem_mib=8192, disk_gib=12)


def node(name="tank", id=1, **kw):
    """An online node with fresh health; the measured tank unless told otherwise."""
    values = {
        "status": "online",
        "capabilities": frozenset({"kvm"}),
        "cpu_cores": 16,
        "mem_total_mib": 61440,
        "disk_total_gib": 900,
        "health_age_s": 3.0,
        "observed_mem_total_mib": 61440,
        "observed_mem_used_mib": 6144,
        "disk_free_gib": 869.0,
        "cpu_pct": 10.0,
    }
    values.update(kw)
    if "observed_mem_total_mib" not in kw:
        values["observed_mem_total_mib"] = values["mem_total_mib"]
    return NodeState(id=id, name=name, **values)


def vms(n, prefix="vm"):
    return tuple(Claim(f"{prefix}-{i}", 8192, 12) for i in range(n))


# Each machine remembers its measured idle reading, as the heartbeat ingest does when it sees a node idle.
def tank(**kw):
    return node("tank", 1, **{"idle_baseline_mib": 6144, **kw})


def architect(**kw):
    values = {"observed_mem_used_mib": 7168, "idle_baseline_mib": 7168, "disk_free_gib": 388.0}
    return node("architect", 2, **{**values, **kw})


def morpheus(**kw):
    values = {
        "mem_total_mib": 31744,
        "observed_mem_used_mib": 5120,
        "idle_baseline_mib": 5120,
        "disk_free_gib": 312.0,
    }
    return node("morpheus", 3, **{**values, **kw})


# --- capacity arithmetic ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "slots"),
    [
        (tank(), 6),  # (61440 - 6144 - 4096) / 8192 = 6.25
        (architect(), 6),  # (61440 - 7168 - 4096) / 8192 = 6.1
        # Deliberately 2, not 3: a third VM would leave the host under 2 GiB, where the OOM killer lives, and
        # an OOM-killed VM looks like an instance that gave up.
        (morpheus(), 2),  # (31744 - 5120 - 4096) / 8192 = 2.75
    ],
    ids=["tank", "architect", "morpheus"],
)
def test_the_measured_fleet_gets_the_slots_it_actually_has(machine, slots):
    verdict = assess(machine, VM)
    assert verdict.fit
    assert verdict.slots == slots


@pytest.mark.parametrize(
    ("claims", "slots"),
    [
        # What utilisation alone claims: (61440 - 12000 - 4096) / 8192 = 5. The bug being fixed.
        (0, 5),
        # Five VMs booted moments ago show only 12000 MiB used, but their 40960 MiB are spoken for.
        (5, 1),
    ],
)
def test_a_sold_out_node_is_not_mistaken_for_an_idle_one(claims, slots):
    verdict = assess(tank(observed_mem_used_mib=12000, running=vms(claims)), VM)
    assert verdict.slots == slots


@pytest.mark.parametrize(
    ("observed", "claims", "remembered", "slots", "code"),
    [
        # Idle morpheus: the reading that gets remembered, and the 2 slots it implies.
        (4314, 0, None, 2, None),
        # Two young VMs, about 1 GiB touched each, no remembered baseline: the inference 6314 - 16384 goes
        # negative, clamps to the 2048 floor, and invents one slot. Kept only as the no-baseline fallback.
        (6314, 2, None, 1, None),
        # With the remembered 4314 MiB the 2-slot node holding 2 VMs is correctly full.
        (6314, 2, 4314, 0, ReasonCode.AT_CAPACITY),
    ],
    ids=["idle", "inferred-only", "remembered"],
)
def test_a_young_instances_unconsumed_memory_is_not_handed_out_twice(
    observed, claims, remembered, slots, code
):
    machine = morpheus(
        mem_total_mib=31757, observed_mem_used_mib=observed, running=vms(claims), idle_baseline_mib=remembered
    )
    verdict = assess(machine, VM)
    assert (verdict.slots, verdict.reason_code) == (slots, code)


def test_a_remembered_baseline_never_under_charges_a_busy_host():
    # One VM that has consumed its 8192 MiB, plus 20 GiB of the host's own build work. The stale idle reading
    # of 4096 must not win over the 20480 the host is really using.
    busy = tank(observed_mem_used_mib=8192 + 20480, running=vms(1), idle_baseline_mib=4096)
    assert effective_use(busy) == (28672, 28672, 28672)
    assert assess(busy, VM).slots == 3  # (61440 - 28672 - 4096) / 8192


def test_effective_use_is_unknown_rather_than_zero_when_memory_is_unreadable():
    # Zero would read as an empty node, which is how an unreadable node gets double-booked.
    assert effective_use(tank(observed_mem_used_mib=None)) is None


@pytest.mark.parametrize(
    ("observed", "claimed", "remembered", "baseline"),
    [
        (1000, 0, None, BASELINE_FLOOR_MIB),  # an idle host never costs less than the floor
        (6144, 0, 9999, 6144),  # with nothing claimed the host is measured, not remembered
        (6314, 16384, None, BASELINE_FLOOR_MIB),  # negative inference clamps to the floor
        (6314, 16384, 4314, 4314),  # the remembered idle reading beats a collapsed inference
        (28672, 8192, 4096, 20480),  # a real inference beats a stale, lower memory
    ],
)
def test_the_host_baseline_is_the_largest_of_inference_memory_and_floor(
    observed, claimed, remembered, baseline
):
    assert host_baseline_mib(observed, claimed, remembered) == baseline


@pytest.mark.parametrize(
    ("declared", "observed", "slots"),
    [
        (61440, 61440, 6),
        (32768, 61440, 2),  # an operator capped what Slotkeeper may use: (32768 - 6144 - 4096) / 8192
        (
            61440,
            45056,
            4,
        ),  # the machine reports less than declared (a lost DIMM): (45056 - 6144 - 4096) / 8192
    ],
)
def test_the_smaller_of_declared_and_observed_memory_is_the_one_that_holds(declared, observed, slots):
    verdict = assess(tank(mem_total_mib=declared, observed_mem_total_mib=observed), VM)
    assert verdict.slots == slots


@pytest.mark.parametrize(
    ("need", "machine", "slots"),
    [
        (Need(4096), tank(), 12),  # (61440 - 6144 - 4096) / 4096 = 12.5: slots are counted in THIS request
        (Need(8192, disk_gib=400), tank(), 2),  # disk runs out first: (869 - 20) / 400
        (Need(1024, cpu_cores=4), tank(), 4),  # cores run out first: 16 / 4
        (Need(1024, cpu_cores=4), tank(running=(Claim("a", 1024, 0, 10.0),)), 1),  # 6 of 16 uncommitted
        (Need(1024, cpu_cores=0.1), node(cpu_cores=1, running=(Claim("a", 1, 0, 0.7),)), 3),  # float dust
    ],
)
def test_slots_count_how_many_more_of_this_request_fit(need, machine, slots):
    assert assess(machine, need).slots == slots


# --- commitments --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "pending", "count"),
    [
        (("a", "b"), ("a",), 2),  # placed, then started: the same instance in both lists counts once
        (("a", "b"), ("c",), 3),  # placed seconds ago and not started: a real additional claim
        ((), ("c", "d"), 2),
    ],
)
def test_commitments_union_by_identity_rather_than_adding(running, pending, count):
    machine = tank(
        running=tuple(Claim(i, 8192) for i in running), pending=tuple(Claim(i, 8192) for i in pending)
    )
    assert len(committed_claims(machine)) == count
    # The host's own 6144 MiB (tank's remembered idle reading) is charged once, beside the claims.
    assert assess(machine, VM).numbers["committed_mib"] == count * 8192 + 6144


def test_a_pending_instance_holds_memory_no_node_can_report_yet():
    # Observed use is idle, but three instances were just placed here: their 24576 MiB are gone already.
    verdict = assess(tank(pending=vms(3, "new")), VM)
    assert verdict.slots == 3  # (61440 - (24576 + 6144) - 4096) / 8192 = 3.25


def test_a_pending_instance_is_not_subtracted_from_observed_use():
    # tank busy at 16385 MiB with nothing running: all of it is the host's. Four instances placed but not
    # started have touched none of it, so the host is charged 16385 + 32768 and there is no room for a fifth.
    # Inferring the baseline as 16385 - 32768 would fall back to the 6144 idle memory and find 2 more slots.
    verdict = assess(tank(observed_mem_used_mib=16385, pending=vms(4, "new")), VM)
    assert verdict.reason_code == ReasonCode.AT_CAPACITY
    assert verdict.numbers["committed_mib"] == 16385 + 32768


# --- disk ---------------------------------------------------------------------------------------------------


def test_disk_is_checked_before_memory_so_the_message_names_the_real_problem():
    # 25 GiB free and memory full as well: the reason must be the disk, because that is what to fix first.
    verdict = assess(tank(disk_free_gib=25.0, observed_mem_used_mib=60000), VM)
    assert verdict.reason_code == ReasonCode.NO_DISK
    assert "25 GiB free" in verdict.reason
    assert f"{DISK_RESERVE_GIB} GiB are reserved" in verdict.reason


@pytest.mark.parametrize(
    ("free", "pending", "fit"),
    [
        (32.0, 0, True),  # 32 - 12 = 20: exactly the reserve is still allowed
        (31.0, 0, False),  # 31 - 12 = 19 would eat into the reserve
        (56.0, 2, True),  # 56 - 24 promised to pending - 12 = 20
        (55.0, 2, False),  # the pending instances' disk is not written yet but is already theirs
        (55.0, 0, True),
    ],
)
def test_disk_promised_to_pending_instances_counts_before_they_write_it(free, pending, fit):
    assert assess(tank(disk_free_gib=free, pending=vms(pending, "new")), VM).fit is fit


# --- fail closed --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "code", "words"),
    [
        ({"status": "draining"}, ReasonCode.DRAINING, "undrain"),
        ({"status": "offline"}, ReasonCode.OFFLINE, "not connected"),
        ({"status": "dead"}, ReasonCode.DEAD, "dead"),
        ({"status": "rebooting"}, ReasonCode.OFFLINE, "rebooting"),  # an unknown status is not permission
        ({"health_age_s": None}, ReasonCode.NO_RECENT_HEALTH, "never reported"),
        ({"health_age_s": 31.0}, ReasonCode.NO_RECENT_HEALTH, "31 s ago (max 30 s)"),
        ({"observed_mem_total_mib": None}, ReasonCode.CAPACITY_UNKNOWN, "unreadable"),
        ({"observed_mem_used_mib": None}, ReasonCode.CAPACITY_UNKNOWN, "unreadable"),
        ({"observed_mem_total_mib": 0}, ReasonCode.CAPACITY_UNKNOWN, "unreadable"),
        ({"disk_free_gib": None}, ReasonCode.CAPACITY_UNKNOWN, "disk free None"),
        ({"capabilities": frozenset()}, ReasonCode.MISSING_CAPABILITY, "missing kvm"),
    ],
)
def test_an_ineligible_node_gets_its_own_reason(changes, code, words):
    verdict = assess(tank(**changes), dataclasses.replace(VM, capabilities=frozenset({"kvm"})))
    assert not verdict.fit
    assert verdict.reason_code == code
    assert words in verdict.reason


def test_health_exactly_at_the_limit_is_still_fresh():
    assert assess(tank(health_age_s=30.0), VM).fit
    assert (
        assess(tank(health_age_s=10.0), VM, health_max_age_s=5.0).reason_code == ReasonCode.NO_RECENT_HEALTH
    )


@pytest.mark.parametrize(
    ("changes", "headroom"),
    [
        ({"cpu_pct": 5.0}, 95.0),  # fresh health carries the headroom
        ({"cpu_pct": 5.0, "metrics_age_s": 3600.0}, 0.0),  # an hour-old CPU reading is worth nothing
        ({"cpu_pct": None}, 0.0),
        ({"cpu_pct": 130.0}, 0.0),  # a reading above 100 % never becomes negative headroom
    ],
)
def test_stale_metrics_demote_but_do_not_exclude(changes, headroom):
    machine = tank(**changes)
    assert headroom_of(machine) == headroom
    assert assess(machine, VM).fit, "excluding is health's job, not the metrics'"


def test_a_stale_cpu_reading_loses_a_tie_it_would_otherwise_win():
    stale = tank(cpu_pct=1.0, metrics_age_s=3600.0)
    fresh = architect(observed_mem_used_mib=6144, cpu_pct=50.0)
    assert place([stale, fresh], VM).nodes == ("architect",)


# --- capabilities -------------------------------------------------------------------------------------------


def test_every_required_capability_must_be_on_one_node():
    # The roster story: a verifier on canary-claude was placed on architect, which held claude and
    # local-ornith; the second graph node died with "no rootfs for backend canary-claude on this node".
    need = Need(8192, capabilities=frozenset({"claude", "canary-claude"}))
    fleet = [
        architect(capabilities=frozenset({"claude", "local-ornith"})),
        tank(capabilities=frozenset({"canary-claude"})),
    ]
    placement = place(fleet, need)
    assert placement.outcome == Outcome.NO_CAPABLE_NODE
    assert not placement.outcome.transient, "a missing image will not appear by waiting"
    assert "canary-claude, claude" in placement.message
    assert "ONE node" in placement.message
    assert all(v.reason_code == ReasonCode.MISSING_CAPABILITY for v in placement.verdicts)


def test_a_node_holding_every_capability_is_chosen_over_a_roomier_one_holding_some():
    need = Need(8192, capabilities=frozenset({"claude", "canary-claude"}))
    fleet = [
        tank(capabilities=frozenset({"claude"})),
        morpheus(capabilities=frozenset({"claude", "canary-claude"})),
    ]
    assert place(fleet, need).nodes == ("morpheus",)


# --- ranking ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fleet", "winner"),
    [
        # Most free slots wins over an idler CPU: spread, don't stack.
        ([tank(cpu_pct=60.0), architect(observed_mem_used_mib=6144, running=vms(3), cpu_pct=10.0)], "tank"),
        # Equal slots: the node under less real load.
        ([tank(cpu_pct=90.0), architect(observed_mem_used_mib=6144, cpu_pct=5.0)], "architect"),
        # Equal on both: the lower node id, whatever order the rows came in.
        ([node("x", 9), node("y", 8)], "y"),
        ([node("y", 8), node("x", 9)], "y"),
    ],
)
def test_ranking_prefers_free_slots_then_headroom_then_node_id(fleet, winner):
    assert place(fleet, VM).nodes == (winner,)


def test_the_same_fleet_state_always_gives_the_same_answer():
    fleet = [
        node(f"n{i}", i, observed_mem_used_mib=6144 + 512 * (i % 4), cpu_pct=float(i % 3)) for i in range(40)
    ]
    first = place(fleet, dataclasses.replace(VM, count=3))
    for seed in range(5):
        shuffled = fleet[:]
        random.Random(seed).shuffle(shuffled)
        again = place(shuffled, dataclasses.replace(VM, count=3))
        assert (again.nodes, again.verdicts) == (first.nodes, first.verdicts)


def test_every_node_gets_a_verdict_in_rank_order_fit_first():
    m2 = dataclasses.replace(morpheus(), id=4, name="m2")
    fleet = [morpheus(status="dead"), m2, tank(), architect(status="draining")]
    placement = place(fleet, VM)
    assert [(v.node, v.fit) for v in placement.verdicts] == [
        ("tank", True),
        ("m2", True),
        ("architect", False),
        ("morpheus", False),
    ]


def test_a_failure_message_shows_capable_nodes_before_incapable_ones():
    # Twenty nodes without kvm sort first by id; the one full node that could run the work must still be named.
    fleet = [node(f"plain{i}", i, capabilities=frozenset()) for i in range(20)]
    fleet.append(node("tank", 99, running=vms(6), idle_baseline_mib=6144))
    placement = place(fleet, dataclasses.replace(VM, capabilities=frozenset({"kvm"})))
    assert placement.outcome == Outcome.FLEET_AT_CAPACITY
    assert placement.verdicts[0].node == "tank"
    assert "  tank: at_capacity" in placement.message


def test_a_penalised_node_ranks_below_one_with_fewer_slots():
    placement = place([tank(), morpheus()], VM, penalties={"tank": 1})
    assert placement.nodes == ("morpheus",)
    assert placement.verdicts[1].numbers["penalty"] == 1, "the operator can see why the roomier node lost"


# --- the three outcomes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fleet", "outcome"),
    [
        ([tank(running=vms(6)), morpheus(running=vms(2))], Outcome.FLEET_AT_CAPACITY),
        ([tank(health_age_s=120.0), morpheus(observed_mem_used_mib=None)], Outcome.FLEET_UNREADABLE),
        ([tank(status="offline"), morpheus(status="dead")], Outcome.FLEET_UNREADABLE),
        # One node full and one unreadable: some capacity is known to be used, so waiting is the answer.
        ([tank(running=vms(6)), morpheus(health_age_s=None)], Outcome.FLEET_AT_CAPACITY),
        # Draining is an operator's choice, not blindness: the work waits for an undrain.
        ([tank(status="draining"), morpheus(status="dead")], Outcome.FLEET_AT_CAPACITY),
        # A node that lacks the capability does not make a blind fleet look full, or vice versa.
        ([tank(health_age_s=None), morpheus(capabilities=frozenset())], Outcome.FLEET_UNREADABLE),
        ([tank(capabilities=frozenset())], Outcome.NO_CAPABLE_NODE),
        ([], Outcome.NO_CAPABLE_NODE),
    ],
)
def test_the_three_no_placement_outcomes_are_never_confused(fleet, outcome):
    placement = place(fleet, dataclasses.replace(VM, capabilities=frozenset({"kvm"})))
    assert placement.outcome == outcome
    assert placement.nodes == ()


def test_unreadable_capacity_never_reads_as_a_full_fleet():
    blind = place([tank(health_age_s=None), morpheus(observed_mem_used_mib=None)], VM)
    full = place([tank(running=vms(6)), morpheus(running=vms(2))], VM)
    assert "NOT a full fleet" in blind.message
    assert "at capacity" not in blind.message, "sends an operator hunting a load problem that does not exist"
    assert "fleet at capacity" in full.message
    assert blind.outcome.transient and full.outcome.transient, "both must queue, not fail"


def test_a_full_fleet_message_carries_the_numbers_behind_it():
    placement = place([tank(observed_mem_used_mib=12000, running=vms(6))], VM)
    assert (
        # committed = 6 x 8192 + 6144 remembered idle = 55296; free = 61440 - 55296 - 4096 = 2048
        "tank: at_capacity: needs 8192 MiB; 2048 MiB free after the 4096 MiB host reserve "
        "(effective use 55296 of 61440 MiB: committed 55296, observed 12000; 6 instance(s) committed)"
    ) in placement.message
    assert placement.verdicts[0].numbers["reserve_mib"] == HOST_RESERVE_MIB


def test_a_large_fleets_message_stays_readable():
    placement = place([node(f"n{i}", i, status="dead") for i in range(300)], VM)
    assert "300 node(s): 300 dead" in placement.message
    assert "... and 290 more in the verdicts" in placement.message
    assert len(placement.verdicts) == 300


@pytest.mark.parametrize(
    ("need", "words"),
    [
        # tank offers at most 61440 - 4096 reserve - 6144 idle = 51200 MiB to one instance (architect 50176).
        (Need(65536), "the largest, tank, offers at most 51200 MiB, 880 GiB disk, 16 cores"),
        (Need(8192, disk_gib=1000), "the largest, tank"),
        (Need(8192, cpu_cores=32), "16 cores"),
    ],
)
def test_a_request_larger_than_any_node_names_the_largest_nodes_capacity(need, words):
    placement = place([morpheus(), tank(), architect()], need)
    assert placement.outcome == Outcome.NO_CAPABLE_NODE
    assert words in placement.message
    assert "Shrink the request or add a larger node" in placement.message
    assert {v.reason_code for v in placement.verdicts} == {ReasonCode.TOO_SMALL}


def test_a_small_dead_node_reports_dead_and_a_fleet_of_them_is_still_not_capable():
    # leases/store.py probes with a 1 MiB need to find dead and draining nodes; a 4 GiB demo node cannot hold
    # even that after its reserve, but it must still answer "dead" or the slot table would keep offering it.
    tiny = node("tiny", 7, status="dead", mem_total_mib=4096)
    assert assess(tiny, Need(1)).reason_code == ReasonCode.DEAD
    # Waiting for morpheus to come back will not make it hold 32 GiB: permanent, whatever the first reason says.
    placement = place([morpheus(status="dead"), tiny], Need(32768))
    assert [v.reason_code for v in placement.verdicts] == [ReasonCode.DEAD, ReasonCode.DEAD]
    assert placement.outcome == Outcome.NO_CAPABLE_NODE
    assert "the largest, morpheus" in placement.message


def test_a_node_too_small_even_when_empty_says_so_with_its_limits():
    # morpheus: 31757 - 4096 host reserve - 4314 remembered idle = 23347 MiB is the most one instance can get.
    verdict = assess(morpheus(mem_total_mib=31757, idle_baseline_mib=4314), Need(24576))
    assert verdict.reason_code == ReasonCode.TOO_SMALL
    assert "at most 23347 MiB" in verdict.reason
    assert "4314 MiB host baseline" in verdict.reason


# --- the preferred node -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preferred", "fleet", "placed", "note"),
    [
        # Fits: used even though tank has more slots. Re-placing costs nothing, but neither does staying.
        ("morpheus", [tank(), morpheus()], ("morpheus",), None),
        # The previous phase's node filled up: the phase moves, it does not fail.
        (
            "morpheus",
            [tank(), morpheus(running=vms(2))],
            ("tank",),
            "preferred node morpheus was not used (at_capacity)",
        ),
        (
            "morpheus",
            [tank(), morpheus(status="draining")],
            ("tank",),
            "preferred node morpheus was not used (draining)",
        ),
        ("gone", [tank()], ("tank",), "preferred node gone is not in the fleet"),
    ],
)
def test_a_preferred_node_is_a_request_not_a_requirement(preferred, fleet, placed, note):
    placement = place(fleet, dataclasses.replace(VM, preferred_node=preferred))
    assert placement.outcome == Outcome.PLACED
    assert placement.nodes == placed
    assert (placement.preferred_note or "").startswith(note or "")
    assert (placement.preferred_note is None) == (note is None)


def test_a_preferred_node_that_breaks_more_soft_rules_is_passed_over_with_a_note():
    placement = place(
        [tank(), morpheus()], dataclasses.replace(VM, preferred_node="morpheus"), penalties={"morpheus": 2}
    )
    assert placement.nodes == ("tank",)
    assert "breaks more soft rules (2)" in placement.preferred_note


def test_a_preferred_node_that_fills_up_mid_placement_says_how_many_it_took():
    placement = place([tank(), morpheus()], dataclasses.replace(VM, count=3, preferred_node="morpheus"))
    assert placement.nodes == ("morpheus", "morpheus", "tank")
    assert placement.preferred_note.startswith(
        "preferred node morpheus took 2 instance(s), then was not used"
    )


# --- several instances and extra checks ---------------------------------------------------------------------


def test_each_chosen_instance_is_charged_before_the_next_is_placed():
    # morpheus alone has 2 slots; a 3-instance lease must not be squeezed onto it, and nothing is half-placed.
    placement = place([morpheus()], dataclasses.replace(VM, count=3))
    assert placement.outcome == Outcome.FLEET_AT_CAPACITY
    assert placement.nodes == ()
    assert "2 of 3 fitted before capacity ran out; none were placed" in placement.message


def test_instances_spread_over_equal_nodes_instead_of_stacking():
    placement = place([tank(), architect(observed_mem_used_mib=6144)], dataclasses.replace(VM, count=4))
    assert placement.nodes == ("tank", "architect", "tank", "architect")
    assert [v.slots for v in placement.verdicts] == [6, 6], "the verdicts describe the fleet as it was asked"


def anti_affinity(node, need, chosen):
    if node.name in chosen:
        return Unfit(
            ReasonCode.ANTI_AFFINITY, f"already holds an instance of this group on {node.name}", {"g": 1}
        )
    return None


def test_an_extra_check_sees_earlier_choices_and_excludes_with_its_own_reason():
    fleet = [tank(), morpheus()]
    placement = place(fleet, dataclasses.replace(VM, count=2), checks=[anti_affinity])
    assert placement.nodes == ("tank", "morpheus")
    blocked = assess(tank(), VM, checks=[anti_affinity], chosen=["tank"])
    assert (blocked.fit, blocked.reason_code, blocked.numbers["g"]) == (False, ReasonCode.ANTI_AFFINITY, 1)
    assert blocked.numbers["effective_mib"] == 6144, "the capacity numbers are kept beside the check's own"


def test_a_check_that_blocks_every_node_is_capacity_not_a_missing_node():
    placement = place([tank(), morpheus()], dataclasses.replace(VM, count=3), checks=[anti_affinity])
    assert placement.outcome == Outcome.FLEET_AT_CAPACITY
    assert "2 anti_affinity" in placement.message


def test_a_caller_check_saying_too_small_is_permanent():
    def slot_table_too_small(node, need, chosen):
        return Unfit(ReasonCode.TOO_SMALL, "the slot table gives this node 4 cores")

    placement = place([tank()], VM, checks=[slot_table_too_small])
    assert placement.outcome == Outcome.NO_CAPABLE_NODE


def test_an_extra_check_runs_only_on_nodes_that_fit_on_capacity():
    seen = []

    def spy(node, need, chosen):
        seen.append(node.name)

    place([tank(), morpheus(status="dead")], VM, checks=[spy])
    assert seen == ["tank"], "slot-table checks are costly; a dead node needs none"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mem_mib": 0},
        {"mem_mib": 1024, "count": 0},
        {"mem_mib": 1024, "disk_gib": -1},
        {"mem_mib": 1, "cpu_cores": -1},
    ],
)
def test_a_request_must_claim_memory_and_want_an_instance(kwargs):
    with pytest.raises(ValueError):
        Need(**kwargs)


# --- the invariant ------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    used=st.lists(st.integers(2048, 40000), min_size=1, max_size=6),
    claims=st.lists(st.integers(0, 5), min_size=6, max_size=6),
    size=st.sampled_from([1024, 4096, 8192, 16384]),
    count=st.integers(1, 8),
)
def test_placing_never_books_a_node_past_its_reserve(used, claims, size, count):
    fleet = [
        node(f"n{i}", i, observed_mem_used_mib=u, running=vms(claims[i]), idle_baseline_mib=4096)
        for i, u in enumerate(used)
    ]
    placement = place(fleet, Need(size, count=count))
    room = sum(assess(m, Need(size)).slots or 0 for m in fleet if assess(m, Need(size)).fit)
    assert (placement.outcome == Outcome.PLACED) == (room >= count), (
        "greedy must find room exactly when it exists"
    )
    for machine in fleet:
        mine = placement.nodes.count(machine.name)
        after = dataclasses.replace(machine, pending=tuple(Claim(f"p{k}", size) for k in range(mine)))
        use = effective_use(after)
        assert mine == 0 or use.effective_mib + HOST_RESERVE_MIB <= machine.mem_total_mib
