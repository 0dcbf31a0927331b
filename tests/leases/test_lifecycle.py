"""Table tests for leases/lifecycle.py: both state machines, the consistency rule, instance ids."""

import itertools

import pytest

from leases.lifecycle import (
    INSTANCE_BADGES,
    LEASE_BADGES,
    LEASE_TYPES,
    LIVE_INSTANCE_STATES,
    TERMINAL_INSTANCE_STATES,
    TERMINAL_LEASE_STATES,
    IllegalTransition,
    InstanceState,
    LeaseState,
    can_instance,
    can_lease,
    inconsistent_instances,
    instance_id,
    instance_transition,
    lease_states_allow_instances,
    lease_transition,
    parse_instance_id,
)

# The lease machine written out by hand from SEMANTICS.md §1.4 (plus 1.1's REJECTED_BY_USER and PREPARING ->
# QUEUED, and Q14's MIGRATING), independently of the module's table, so a typo in either one fails a test.
LEASE_STEPS = {
    "new": "pending",
    "pending": "scheduled queued cancelled rejected rejected_by_user",
    "scheduled": "preparing queued pending ready cancelled failed",
    "queued": "scheduled cancelled",
    "preparing": "ready pending queued cancelled failed",
    "ready": "active queued pending cancelled failed",
    "active": "suspending queued done cancelled failed",
    "suspending": "suspended_pending cancelled failed",
    "suspended_pending": "suspended_queued suspended_scheduled cancelled failed",
    "suspended_queued": "suspended_scheduled cancelled failed",
    "suspended_scheduled": "suspended_queued suspended_pending migrating resuming cancelled failed",
    "migrating": "suspended_scheduled cancelled failed",
    "resuming": "resumed_ready cancelled failed",
    "resumed_ready": "active cancelled failed",
}
LEGAL_LEASE = sorted((a, b) for a, targets in LEASE_STEPS.items() for b in targets.split())

# The instance machine of seed 003, written out in full: every state that exists can also be revoked or lost,
# except that a replaced (rescheduled) record is only unloaded and a revoked one is never marked lost.
INSTANCE_STEPS = {
    "requested": "placed failed revoked lost",
    "placed": "fetching loaded running failed revoked lost",
    "fetching": "verified failed revoked lost",
    "verified": "loaded failed revoked lost",
    "loaded": "running unloaded failed revoked lost",
    "running": "unhealthy stopping stopped finished failed unloaded revoked lost",
    "unhealthy": "running restarting stopping failed unloaded revoked lost",
    "restarting": "running unhealthy failed stopping revoked lost",
    "stopping": "stopped unloaded failed revoked lost",
    "stopped": "running unloaded failed revoked lost",
    "finished": "running unloaded revoked lost",
    "failed": "running unloaded revoked lost",
    "lost": "running rescheduled unloaded failed revoked",
    "rescheduled": "unloaded",
    "revoked": "unloaded failed",
}
LEGAL_INSTANCE = sorted((a, b) for a, targets in INSTANCE_STEPS.items() for b in targets.split())


# --- lease machine


def test_the_lease_states_are_haizeas_nineteen_with_lower_case_values():
    assert [s.value for s in LeaseState] == [
        "new", "pending", "rejected", "scheduled", "queued", "cancelled", "preparing", "ready", "active",
        "suspending", "suspended_pending", "suspended_queued", "suspended_scheduled", "migrating", "resuming",
        "resumed_ready", "done", "failed", "rejected_by_user",
    ]  # fmt: skip


@pytest.mark.parametrize(("current", "target"), LEGAL_LEASE)
def test_every_legal_lease_step_is_taken(current, target):
    assert can_lease(current, target)
    assert lease_transition(LeaseState(current), LeaseState(target), ident="7") is LeaseState(target)


def test_no_lease_step_outside_the_table_is_legal():
    legal = {(LeaseState(a), LeaseState(b)) for a, b in LEGAL_LEASE}
    allowed = {(a, b) for a, b in itertools.product(LeaseState, LeaseState) if can_lease(a, b)}
    assert allowed == legal


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("done", "active"),  # a finished lease never runs again
        ("cancelled", "pending"),
        ("rejected", "scheduled"),
        ("failed", "active"),
        ("new", "scheduled"),  # admission comes first
        ("queued", "active"),  # a queued lease needs reservations before it runs
        ("active", "ready"),  # 1.1's deadline-only step is not ours (Q8 requeues instead)
        ("active", "pending"),
        ("suspended_queued", "resuming"),  # resumption must be scheduled first
        ("migrating", "resuming"),  # a migration always hands back to suspended_scheduled
        ("active", "migrating"),  # only a suspended lease migrates
        ("queued", "failed"),
        ("active", "active"),
    ],
)
def test_an_illegal_lease_step_names_both_states(current, target):
    assert not can_lease(current, target)
    with pytest.raises(IllegalTransition, match=f"^lease 7: cannot go from {current} to {target}$") as info:
        lease_transition(LeaseState(current), LeaseState(target), ident="7")
    assert (info.value.kind, info.value.ident, info.value.current, info.value.target) == (
        "lease", "7", current, target,
    )  # fmt: skip


def test_an_illegal_step_without_an_ident_still_reads_as_a_sentence():
    with pytest.raises(IllegalTransition, match=r"^lease: cannot go from done to active$"):
        lease_transition(LeaseState.DONE, LeaseState.ACTIVE)


def test_the_terminal_lease_states_have_no_way_out():
    assert {s for s in LeaseState if not any(can_lease(s, t) for t in LeaseState)} == TERMINAL_LEASE_STATES
    assert {s.value for s in TERMINAL_LEASE_STATES} == {
        "done", "cancelled", "failed", "rejected", "rejected_by_user",
    }  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        # §1.5: best-effort without preparation.
        "new pending queued scheduled ready active done",
        # §1.5: best-effort suspended by an AR, resumed elsewhere after a memory-image migration (Q14).
        "new pending queued scheduled ready active suspending suspended_pending suspended_queued "
        "suspended_scheduled migrating suspended_scheduled resuming resumed_ready active done",
        # §1.5 and Q8: a running best-effort lease cancelled and requeued, then run from scratch.
        "new pending queued scheduled ready active queued scheduled ready active done",
        # §3.7: a future reservation pulled earlier after an early end.
        "new pending queued scheduled pending scheduled ready active done",
        # §1.5: an advance reservation with image preparation.
        "new pending scheduled preparing ready active done",
        "new pending rejected",
    ],
)
def test_the_typical_life_cycles_walk_through_the_machine(path):
    states = [LeaseState(s) for s in path.split()]
    for current, target in itertools.pairwise(states):
        assert lease_transition(current, target) is target


@pytest.mark.parametrize("lease_type", ["advance_reservation", "immediate"])
@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("pending", "queued"),
        ("active", "suspending"),
        ("active", "queued"),
        ("ready", "queued"),
        ("scheduled", "pending"),  # re-evaluation (§3.7) moves best-effort leases only
        ("preparing", "pending"),
    ],
)
def test_a_fixed_window_lease_is_never_queued_suspended_or_reevaluated(lease_type, current, target):
    assert can_lease(current, target)
    assert not can_lease(current, target, lease_type=lease_type)
    with pytest.raises(IllegalTransition, match=f"lease 3: cannot go from {current} to {target} \\(an "):
        lease_transition(current, target, ident="3", lease_type=lease_type)


@pytest.mark.parametrize("lease_type", ["advance_reservation", "immediate"])
def test_a_fixed_window_lease_still_runs_its_own_life(lease_type):
    path = [LeaseState(s) for s in ("new", "pending", "scheduled", "preparing", "ready", "active", "done")]
    for current, target in itertools.pairwise(path):
        assert lease_transition(current, target, lease_type=lease_type) is target
    assert can_lease("pending", "rejected", lease_type=lease_type)
    assert can_lease("active", "cancelled", lease_type=lease_type)


@pytest.mark.parametrize("lease_type", ["best_effort", "deadline"])
def test_a_best_effort_or_deadline_lease_may_be_suspended_and_requeued(lease_type):
    assert can_lease("active", "suspending", lease_type=lease_type)
    assert can_lease("active", "queued", lease_type=lease_type)


def test_an_unknown_lease_type_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown lease type 'besteffort'; known: best_effort, "):
        can_lease("active", "done", lease_type="besteffort")
    assert LEASE_TYPES == ("best_effort", "advance_reservation", "immediate", "deadline")


def test_a_state_name_from_the_database_is_accepted_and_an_unknown_one_refused():
    assert lease_transition("active", "done") is LeaseState.DONE
    with pytest.raises(ValueError, match="'finished' is not a valid LeaseState"):
        lease_transition("active", "finished")


# --- instance machine


@pytest.mark.parametrize(("current", "target"), LEGAL_INSTANCE)
def test_every_legal_instance_step_is_taken(current, target):
    assert can_instance(current, target)
    assert instance_transition(InstanceState(current), InstanceState(target)) is InstanceState(target)


def test_no_instance_step_outside_the_table_is_legal():
    legal = {(InstanceState(a), InstanceState(b)) for a, b in LEGAL_INSTANCE}
    allowed = {(a, b) for a, b in itertools.product(InstanceState, InstanceState) if can_instance(a, b)}
    assert allowed == legal


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("unloaded", "running"),  # gone is gone
        ("unloaded", "lost"),
        ("rescheduled", "running"),  # its replacement runs elsewhere; two copies would fight over the work
        ("rescheduled", "lost"),
        ("revoked", "lost"),  # a revoked instance must not be offered for a reschedule
        ("revoked", "running"),
        ("requested", "running"),  # no node has accepted it yet
        ("fetching", "running"),  # an unverified payload never runs
        ("verified", "running"),
        ("running", "restarting"),  # a restart follows a missed health check
        ("lost", "restarting"),
        ("running", "running"),
        ("stopping", "running"),
    ],
)
def test_an_illegal_instance_step_names_both_states(current, target):
    assert not can_instance(current, target)
    with pytest.raises(IllegalTransition, match=f"^instance 7-0-1: cannot go from {current} to {target}$"):
        instance_transition(InstanceState(current), InstanceState(target), ident="7-0-1")


def test_only_unloaded_is_a_terminal_instance_state():
    assert {s for s in InstanceState if not any(can_instance(s, t) for t in InstanceState)} == {
        InstanceState.UNLOADED
    }
    assert set(TERMINAL_INSTANCE_STATES) == {InstanceState.UNLOADED}


def test_the_live_instance_states_are_those_from_placed_to_stopping():
    assert {s.value for s in LIVE_INSTANCE_STATES} == {
        "placed", "fetching", "verified", "loaded", "running", "unhealthy", "restarting", "stopping",
    }  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        "requested placed fetching verified loaded running finished unloaded",
        "requested placed running unhealthy restarting running stopping stopped unloaded",
        "requested placed loaded running unhealthy restarting unhealthy failed unloaded",
        "requested placed running lost rescheduled unloaded",  # the node died and the move was approved
        "requested placed running lost running",  # the node came back before anyone moved it
        "requested placed running revoked unloaded",
    ],
)
def test_the_instance_life_cycles_of_seed_003_walk_through_the_machine(path):
    for current, target in itertools.pairwise(InstanceState(s) for s in path.split()):
        assert instance_transition(current, target) is target


# --- badges


# CSS named colours (CSS Color Level 4) used by the console; a typo here would render an unstyled badge.
CSS_NAMED_COLOURS = {
    "cadetblue", "crimson", "darkcyan", "darkgreen", "darkorange", "dimgray", "firebrick", "gainsboro",
    "goldenrod", "green", "indianred", "lightseagreen", "lightsteelblue", "mediumpurple", "mediumseagreen",
    "orange", "peru", "sandybrown", "silver", "slategray", "steelblue",
}  # fmt: skip


@pytest.mark.parametrize(("badges", "states"), [(LEASE_BADGES, LeaseState), (INSTANCE_BADGES, InstanceState)])
def test_every_state_has_a_css_colour_badge(badges, states):
    assert set(badges) == set(states)
    assert set(badges.values()) <= CSS_NAMED_COLOURS


def test_running_and_failing_look_different():
    assert LEASE_BADGES[LeaseState.ACTIVE] != LEASE_BADGES[LeaseState.FAILED]
    assert INSTANCE_BADGES[InstanceState.RUNNING] != INSTANCE_BADGES[InstanceState.FAILED]
    assert INSTANCE_BADGES[InstanceState.RUNNING] != INSTANCE_BADGES[InstanceState.LOST]


# --- consistency


@pytest.mark.parametrize(
    ("lease_state", "instance_state", "allowed"),
    [
        ("new", "stopped", False),  # a new lease has never had an instance
        ("queued", "running", False),  # Q8: a requeued lease's VM must be stopped
        ("queued", "stopping", True),
        ("queued", "stopped", True),  # the earlier run's record stays
        ("scheduled", "requested", False),  # instances are created from PREPARING/READY on
        ("ready", "requested", True),
        ("preparing", "fetching", True),
        ("active", "running", True),
        ("active", "lost", True),
        ("active", "requested", True),  # a replacement after a reschedule
        ("suspending", "running", True),
        ("suspending", "stopping", True),
        ("suspending", "requested", False),
        ("suspended_queued", "running", False),
        ("suspended_scheduled", "stopped", True),
        ("migrating", "fetching", True),  # the new node copies the memory image
        ("migrating", "running", False),
        ("resuming", "loaded", True),
        ("resumed_ready", "running", False),
        ("done", "running", False),
        ("done", "finished", True),
        ("cancelled", "stopping", True),  # the cancel stops the VMs after the lease is cancelled
        ("cancelled", "restarting", False),
        ("failed", "failed", True),
    ],
)
def test_a_lease_state_allows_only_consistent_instance_states(lease_state, instance_state, allowed):
    assert (InstanceState(instance_state) in lease_states_allow_instances(LeaseState(lease_state))) is allowed


def test_no_instance_runs_unless_its_lease_is_active_or_suspending():
    running_ok = {s for s in LeaseState if InstanceState.RUNNING in lease_states_allow_instances(s)}
    assert running_ok == {LeaseState.ACTIVE, LeaseState.SUSPENDING}


def test_inconsistent_instances_are_named_in_id_order():
    instances = {"7-1-0": "running", "7-0-0": "unhealthy", "7-2-0": "stopped"}
    assert inconsistent_instances("queued", instances, ident="7") == [
        "instance 7-0-0 is unhealthy while lease 7 is queued",
        "instance 7-1-0 is running while lease 7 is queued",
    ]
    assert inconsistent_instances(LeaseState.ACTIVE, instances) == []


# --- instance ids


@pytest.mark.parametrize(
    ("lease", "vnode", "generation", "text"),
    [(7, 1, 0, "7-1-0"), ("7", 0, 0, "7-0-0"), (12345, 3, 2, "12345-3-2")],
)
def test_an_instance_id_is_lease_vnode_generation_and_parses_back(lease, vnode, generation, text):
    assert instance_id(lease, vnode, generation) == text
    assert parse_instance_id(text) == (str(lease), vnode, generation)


@pytest.mark.parametrize(
    ("lease", "vnode", "generation"), [("a-b", 0, 0), ("", 0, 0), (7, -1, 0), (7, 0, -1)]
)
def test_an_ambiguous_instance_id_is_refused(lease, vnode, generation):
    with pytest.raises(ValueError):
        instance_id(lease, vnode, generation)


@pytest.mark.parametrize("text", ["7-1", "7-1-0-2", "-1-0", "7-x-0", "7-1--1", ""])
def test_a_malformed_instance_id_does_not_parse(text):
    with pytest.raises(ValueError, match="not an instance id"):
        parse_instance_id(text)
