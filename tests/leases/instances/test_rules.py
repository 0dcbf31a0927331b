"""Table tests for leases/instances/rules.py: restarts and losses (moved from tests/leases/test_lifecycle.py)."""

import pytest

from leases.instances.rules import (
    LossDecision,
    ReschedulePolicy,
    RestartDecision,
    RestartPolicy,
    backoff_delay,
    decide_on_loss,
    decide_restart,
    needs_node_hardware,
)

# --- restarts


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(1, 0.0), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 16.0), (7, 30.0), (8, 30.0), (5000, 30.0)],
)
def test_the_backoff_doubles_from_one_second_and_stops_at_thirty(attempt, delay):
    assert backoff_delay(RestartPolicy(), attempt) == delay


T0 = 1_700_000_000.0  # an epoch time: the arithmetic must hold far from zero


@pytest.mark.parametrize(
    ("previous", "now", "expected"),
    [
        ([], T0, RestartDecision("restart", 1, T0, "")),
        ([T0], T0 + 0.5, RestartDecision("wait", 2, T0 + 1, "")),
        ([T0], T0 + 1, RestartDecision("restart", 2, T0 + 1, "")),
        ([T0, T0 + 1], T0 + 2, RestartDecision("wait", 3, T0 + 3, "")),  # 2 s after the second
        ([T0 + 1, T0], T0 + 3, RestartDecision("restart", 3, T0 + 3, "")),  # order does not matter
        ([T0, T0 + 1, T0 + 3], T0 + 100, RestartDecision("exhausted", 4, None, "")),
        # The window slides: at T0 + 600 the first restart is exactly window_s old and no longer counts.
        ([T0, T0 + 1, T0 + 3], T0 + 599.9, RestartDecision("exhausted", 4, None, "")),
        ([T0, T0 + 1, T0 + 3], T0 + 600, RestartDecision("restart", 3, T0 + 600, "")),
        ([T0, T0 + 1, T0 + 3], T0 + 603, RestartDecision("restart", 1, T0 + 603, "")),
        ([T0 - 5000, T0 - 4000, T0 - 3000], T0, RestartDecision("restart", 1, T0, "")),
    ],
)
def test_the_default_policy_allows_three_restarts_in_ten_minutes_with_backoff(previous, now, expected):
    decision = decide_restart(RestartPolicy(), previous, now)
    assert (decision.action, decision.attempt, decision.not_before) == (
        expected.action, expected.attempt, expected.not_before,
    )  # fmt: skip
    assert decision.reason.endswith(".")


def test_a_long_budget_reaches_the_backoff_cap():
    policy = RestartPolicy(max_restarts=10, window_s=3600)
    restarts = [
        T0 + offset for offset in (0, 1, 3, 7, 15, 31, 61)
    ]  # each one exactly its backoff after the last
    assert decide_restart(policy, restarts, T0 + 70) == RestartDecision(
        "wait", 8, T0 + 91, "Attempt 8 waits 30 s after the previous restart, 21 s more."
    )
    assert decide_restart(policy, restarts, T0 + 91).action == "restart"


def test_an_exhausted_budget_says_why_and_holds_the_instance():
    decision = decide_restart(RestartPolicy(), [T0, T0 + 1, T0 + 3], T0 + 10)
    assert decision.reason == (
        "3 restarts in the last 600 s reach the limit of 3; the instance is held as failed for the operator."
    )


def test_a_policy_without_restarts_is_exhausted_at_once():
    decision = decide_restart(RestartPolicy(max_restarts=0), [], T0)
    assert (decision.action, decision.attempt, decision.not_before) == ("exhausted", 1, None)
    assert decision.reason.startswith("Restarting is disabled")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_restarts": -1},
        {"window_s": 0},
        {"window_s": float("nan")},
        {"backoff_initial_s": -1},
        {"backoff_initial_s": 60, "backoff_max_s": 30},
        {"backoff_max_s": float("inf")},
    ],
)
def test_a_nonsensical_restart_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)


# --- losses


@pytest.mark.parametrize(
    ("capabilities", "attached"),
    [
        (["sensor.camera0"], True),
        (["device:gpu0"], True),
        (["feed.lan-cam"], True),
        (["Sensor.Camera0"], True),  # case never lets a sensor workload wander off its sensor
        (["sensor"], True),  # a bare namespace is a prefix for anything in it
        (["accel.gpu"], False),  # any node with the same accelerator is as good a home
        (["backend:claude"], False),
        (["sensors.camera0"], False),  # an allow-list: a namespace nobody listed never pins
        (["cpu.avx2", "accel.gpu", "device:tpu0"], True),
        ([], False),
        ([""], False),
    ],
)
def test_node_hardware_is_recognised_by_namespace(capabilities, attached):
    assert needs_node_hardware(capabilities, frozenset({"sensor", "device", "feed"})) is attached


@pytest.mark.parametrize(
    ("policy", "migratable", "capabilities", "so_far", "action", "auto"),
    [
        (ReschedulePolicy(), True, ["accel.gpu"], 0, "propose", False),
        (ReschedulePolicy(), True, [], 4, "propose", False),  # the fifth of five is still allowed
        (ReschedulePolicy(), True, [], 5, "fail", False),
        (ReschedulePolicy(max_reschedules=0), True, [], 0, "fail", False),
        (ReschedulePolicy(auto_approve=True), True, [], 0, "propose", True),
        (ReschedulePolicy(), False, [], 0, "hold", False),
        (ReschedulePolicy(), True, ["sensor.camera0"], 0, "hold", False),
        (ReschedulePolicy(), True, ["sensor.camera0"], 9, "hold", False),  # holding spends no reschedule
        (ReschedulePolicy(auto_approve=True), True, ["device:gpu0"], 0, "hold", False),
        (ReschedulePolicy(hardware_namespaces=frozenset({"accel"})), True, ["accel.gpu"], 0, "hold", False),
        (ReschedulePolicy(hardware_namespaces=frozenset()), True, ["sensor.camera0"], 0, "propose", False),
    ],
)
def test_a_lost_instance_is_moved_held_or_failed(policy, migratable, capabilities, so_far, action, auto):
    decision = decide_on_loss(
        policy, migratable=migratable, capabilities=capabilities, reschedules_so_far=so_far
    )
    assert (decision.action, decision.auto_approved) == (action, auto)


@pytest.mark.parametrize(
    ("migratable", "capabilities", "so_far", "expected"),
    [
        (True, ["sensor.camera0", "accel.gpu"], 0, LossDecision(
            "hold", "It needs hardware on its node (sensor.camera0); held until the node returns.")),
        (False, [], 0,
         LossDecision("hold", "It is not migratable; held until its node returns or an operator acts.")),
        (True, [], 5, LossDecision("fail", "It has been rescheduled 5 times, the limit is 5; "
                                   "a flapping fleet must not move it forever.")),
        (
            True,
            [],
            2,
            LossDecision(
                "propose",
                "This instance's move 3 of the 5 its lease allows, waiting for an operator's approval.",
            ),
        ),
    ],
)  # fmt: skip
def test_a_loss_decision_gives_its_reason_as_a_sentence(migratable, capabilities, so_far, expected):
    got = decide_on_loss(
        ReschedulePolicy(), migratable=migratable, capabilities=capabilities, reschedules_so_far=so_far
    )
    assert got == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_reschedules": -1},
        {"hardware_namespaces": frozenset({"Sensor"})},
        {"hardware_namespaces": frozenset({"sensor.camera"})},
        {"hardware_namespaces": frozenset({""})},
    ],
)
def test_a_nonsensical_reschedule_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        ReschedulePolicy(**kwargs)


def test_a_negative_reschedule_count_is_refused():
    with pytest.raises(ValueError, match="reschedules_so_far"):
        decide_on_loss(ReschedulePolicy(), migratable=True, capabilities=[], reschedules_so_far=-1)
