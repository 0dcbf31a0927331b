"""The heartbeat's pure rules (fleet/heartbeat_rules.py) against the serializer they stand in for: over a table of
ordinary and hostile bodies, `plain_report` either leaves the body to the serializer (None) or returns exactly
what the serializer validates it to, and it never accepts a body the serializer refuses. No database."""

from __future__ import annotations

import math
import random

import pytest

from fleet.api.serializers import HeartbeatSerializer
from fleet.heartbeat_rules import MAX_DISK_GIB, MAX_LOAD1, MAX_MEM_MIB, plain_report

# The agent's report on tank (61,440 MiB, 500 GiB disk) when it runs nothing.
TANK = {"mem_total_mib": 61440, "mem_used_mib": 6144, "disk_free_gib": 400.0, "cpu_pct": 5.0, "load1": 0.3}

BODIES = [
    TANK,
    {**TANK, "instances": []},
    {**TANK, "mem_total_mib": 61440.0},  # an integral float is a whole number
    {**TANK, "disk_free_gib": 400, "cpu_pct": 0, "load1": 0},  # integers are numbers
    {**TANK, "mem_used_mib": 61440},  # all of it used
    {**TANK, "mem_total_mib": MAX_MEM_MIB, "disk_free_gib": MAX_DISK_GIB, "load1": MAX_LOAD1, "cpu_pct": 100},
    # Hostile, each refused by the serializer (tests/fleet/test_bad_input.py's cases among them).
    {**TANK, "mem_total_mib": 2**31},
    {**TANK, "mem_total_mib": 2**63},
    {**TANK, "mem_total_mib": 0},
    {**TANK, "mem_total_mib": 61440.5},
    {**TANK, "mem_total_mib": True},
    {**TANK, "mem_total_mib": "61440"},
    {**TANK, "mem_used_mib": -1},
    {**TANK, "mem_used_mib": 70000},  # more than the total
    {**TANK, "disk_free_gib": 1e308},
    {**TANK, "disk_free_gib": math.inf},
    {**TANK, "disk_free_gib": math.nan},
    {**TANK, "disk_free_gib": -0.5},
    {**TANK, "cpu_pct": 100.5},
    {**TANK, "cpu_pct": False},
    {**TANK, "load1": 1e308},
    {**TANK, "load1": None},
    {**TANK, "load1": [1]},
    {**TANK, "gpu_temp_c": 80},  # unknown fields are refused, not dropped
    {k: v for k, v in TANK.items() if k != "load1"},  # a field missing
    {**TANK, "instances": None},
    {**TANK, "instances": {}},
    {**TANK, "instances": "1-1-0"},
    # Valid, but not the plain shape: the serializer decides.
    {**TANK, "instances": ["1-1-0"]},
    {**TANK, "instances": [{"id": "1-1-0", "status": "running"}]},
    {**TANK, "instances": [{"id": "1-1-0", "status": "exited", "exit_code": 1e20}]},
    [],
    "tank",
    None,
]


def serializer_says(body):
    serializer = HeartbeatSerializer(data=body)
    return dict(serializer.validated_data) if serializer.is_valid() else None


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_the_rules_answer_as_the_serializer_or_leave_it_to_it(body):
    decided = plain_report(body)
    if decided is not None:
        assert decided == serializer_says(body)
        assert [type(decided[k]) for k in decided] == [type(v) for v in serializer_says(body).values()]


def test_the_idle_report_is_decided_here():
    assert plain_report(TANK) == {**TANK, "instances": []}
    assert plain_report({**TANK, "instances": []}) == {**TANK, "instances": []}


def test_every_body_the_serializer_refuses_is_left_to_it():
    for body in BODIES:
        if serializer_says(body) is None:
            assert plain_report(body) is None, body


def test_random_numbers_near_the_bounds_get_the_serializers_answer():
    # The bounds are where a hand-written rule goes wrong (<= against <, int against float): 2,000 reports with
    # each number drawn around its bounds, as int, float or integral float.
    rng = random.Random(12)

    def near(bound):
        value = rng.choice([bound, -bound, 0, 1]) + rng.choice([-1, -0.5, 0, 0.5, 1])
        return rng.choice([value, float(value), int(value)])

    for _ in range(2000):
        body = {
            "mem_total_mib": near(MAX_MEM_MIB),
            "mem_used_mib": near(MAX_MEM_MIB),
            "disk_free_gib": near(MAX_DISK_GIB),
            "cpu_pct": near(100),
            "load1": near(MAX_LOAD1),
        }
        decided = plain_report(body)
        expected = serializer_says(body)
        assert decided is None or decided == expected, body
        assert (decided is None) == (expected is None), body  # the plain shape: decided here whenever valid
