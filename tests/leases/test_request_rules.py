"""A lease request's pure rules (leases/request_rules.py) against the serializer they stand in for: over a table of
ordinary and hostile bodies and over generated ones, `plain_lease` either leaves the body to the serializer (None)
or returns exactly what the serializer validates it to (same keys, order, types and values), and it never accepts
a body the serializer refuses. The fleet checks are the same function on both ways (check_against_fleet), so here
they are left out of the serializer's answer; tests/leases/test_api.py covers them through the API."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leases.api import serializers as s
from leases.models import LeaseType
from leases.request_rules import LEASE_TYPES, MAX_CPU_CORES, MAX_DURATION_S, MAX_START_AHEAD, plain_lease

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
VM = {"cpu_cores": 2.0, "mem_mib": 8192, "disk_gib": 20}
BE = {"name": "web", "type": "best_effort", "duration_s": 3600.0, "nodes": [VM]}
AR = {**BE, "type": "advance_reservation", "start": (NOW + timedelta(hours=2)).isoformat()}

ORDINARY = [
    BE,
    {**BE, "start": None},
    {**BE, "type": "immediate", "nodes": [VM, VM]},
    AR,
    {**AR, "start": "2026-12-04T14:00:00Z"},
    {**AR, "start": "2026-12-04T15:00:00+01:00"},  # an offset: the field converts it to UTC
    {**AR, "start": NOW.isoformat()},  # exactly now is not the past
    {**BE, "nodes": [{"mem_mib": 1}]},  # defaults: cpu_cores 1, disk_gib 0
    {**BE, "nodes": [{"mem_mib": 4096.0, "cpu_cores": 1, "disk_gib": 0.0}]},  # integral floats, an int number
    {**BE, "nodes": [VM] * 1000},
    {**BE, "name": "  padded  "},  # trimmed
    {**BE, "name": "x" * 200},
    {**BE, "name": "ünïcode ✓"},
    {**BE, "duration_s": 1},
    {**BE, "duration_s": MAX_DURATION_S},
    {**BE, "capabilities": ["backend:claude", "sensor.camera0"], "groups": ["web-tier", "db_1"]},
    {**BE, "capabilities": [], "groups": []},
    {**BE, "preemptible": False, "migratable": False, "auto_approve_reschedules": True},
    {**BE, "max_reschedules": 0},
    {**BE, "max_reschedules": 1000.0},
    {**BE, "driver": "sim"},
    {**BE, "real_duration_s": 0},
    {**BE, "real_duration_s": None},
    {**BE, "real_duration_s": 12.5},
]

HOSTILE = [
    {**BE, "name": ""},
    {**BE, "name": "   "},
    {**BE, "name": "x" * 201},
    {**BE, "name": "nul\x00"},
    {**BE, "name": "lone \ud800"},
    {**BE, "name": 7},
    {**BE, "name": None},
    {**BE, "type": "batch"},
    {**BE, "type": ""},
    {**BE, "type": 1},
    {**BE, "type": None},
    {**BE, "duration_s": 0.5},
    {**BE, "duration_s": MAX_DURATION_S + 1},
    {**BE, "duration_s": math.inf},
    {**BE, "duration_s": math.nan},
    {**BE, "duration_s": "3600"},
    {**BE, "duration_s": True},
    {**BE, "duration_s": 10**400},
    {**BE, "nodes": []},
    {**BE, "nodes": [VM] * 1001},
    {**BE, "nodes": {}},
    {**BE, "nodes": None},
    {**BE, "nodes": [None]},
    {**BE, "nodes": [[8192]]},
    {**BE, "nodes": [{"cpu_cores": 1}]},  # mem_mib is required
    {**BE, "nodes": [{**VM, "gpus": 8}]},  # unknown fields are refused, not dropped
    {**BE, "nodes": [{**VM, "mem_mib": 0}]},
    {**BE, "nodes": [{**VM, "mem_mib": 2**31}]},
    {**BE, "nodes": [{**VM, "mem_mib": 8192.5}]},
    {**BE, "nodes": [{**VM, "mem_mib": "8192"}]},
    {**BE, "nodes": [{**VM, "mem_mib": True}]},
    {**BE, "nodes": [{**VM, "cpu_cores": -1}]},
    {**BE, "nodes": [{**VM, "cpu_cores": MAX_CPU_CORES + 1}]},
    {**BE, "nodes": [{**VM, "cpu_cores": None}]},
    {**BE, "nodes": [{**VM, "disk_gib": None}]},
    {**BE, "nodes": [{**VM, "disk_gib": -1}]},
    {**BE, "start": (NOW + timedelta(hours=2)).isoformat()},  # only an advance reservation takes a start
    {**AR, "start": None},
    {**AR, "start": (NOW - timedelta(seconds=1)).isoformat()},
    {**AR, "start": (NOW + MAX_START_AHEAD + timedelta(seconds=1)).isoformat()},
    {**AR, "start": "tomorrow"},
    {**AR, "start": "9999-12-31T23:59:59-23:59"},
    {**AR, "start": 1733313600},
    {**{k: v for k, v in AR.items() if k != "start"}},
    {**BE, "capabilities": ["Upper"]},
    {**BE, "capabilities": ["ok", 7]},
    {**BE, "capabilities": "ok"},
    {**BE, "capabilities": [" padded "]},  # trimmed, then matched: the serializer decides
    {**BE, "capabilities": ["c"] * 51},
    {**BE, "capabilities": None},
    {**BE, "groups": ["has space"]},
    {**BE, "groups": ["g" * 101]},
    {**BE, "groups": ["g"] * 21},
    {**BE, "groups": [None]},
    {**BE, "preemptible": "yes"},
    {**BE, "preemptible": 1},
    {**BE, "migratable": None},
    {**BE, "max_reschedules": -1},
    {**BE, "max_reschedules": 1001},
    {**BE, "max_reschedules": 2.5},
    {**BE, "driver": "process"},  # needs a spec with a command
    {**BE, "driver": "docker"},
    {**BE, "real_duration_s": -1},
    {**BE, "real_duration_s": "1"},
    {**BE, "priority": 5},
    {k: v for k, v in BE.items() if k != "name"},
    {k: v for k, v in BE.items() if k != "duration_s"},
    {k: v for k, v in BE.items() if k != "nodes"},
    [],
    "lease",
    None,
    # Valid, but not the plain shape: the serializer decides.
    {**BE, "restart_policy": {"max_restarts": 3}},
    {**BE, "restart_policy": {}},
    {**BE, "spec": {"sim": {"fail_after_s": 5}}},
    {**BE, "driver": "process", "spec": {"command": ["/bin/true"]}},
]


@pytest.fixture(autouse=True)
def _no_fleet(monkeypatch):
    # Both ways call the same check_against_fleet after their field rules; left out, no database is needed.
    monkeypatch.setattr(s, "check_against_fleet", lambda attrs: None)


def serializer_says(body):
    serializer = s.LeaseCreateSerializer(data=body, context={"now": NOW})
    return serializer.validated_data if serializer.is_valid() else None


def typed(value):
    """A value with every type and key order spelled out, so 1 and 1.0, or two key orders, compare unequal."""
    if isinstance(value, dict):
        return ("dict", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    if isinstance(value, datetime):
        return ("datetime", value.isoformat(), str(value.tzinfo))
    return (type(value).__name__, value)


def agree(body) -> dict | None:
    mine = plain_lease(body, NOW, s._parse_start)
    theirs = serializer_says(body)
    if mine is not None:
        assert theirs is not None, f"accepted what the serializer refuses: {body!r}"
        assert typed(mine) == typed(dict(theirs)), body
    return mine


@pytest.mark.parametrize("body", ORDINARY, ids=range(len(ORDINARY)))
def test_an_ordinary_body_is_decided_here_exactly_as_the_serializer_decides_it(body):
    assert agree(body) is not None


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_any_other_body_is_left_to_the_serializer(body):
    assert agree(body) is None


def test_the_lease_types_are_the_models():
    assert frozenset(LeaseType.values) == LEASE_TYPES


def test_the_rules_import_no_framework():
    from pathlib import Path

    import leases.request_rules as rules

    source = Path(rules.__file__).read_text()
    assert "django" not in source.replace("Django", "") and "rest_framework" not in source


NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=2**31 - 2, max_value=2**31 + 2),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, 1.0, 4096, 4096.0, 8192, 1e20, 2**53, MAX_DURATION_S, MAX_DURATION_S + 0.5]),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
TEXTS = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["web", " web", "web ", "a-b_c", "backend:claude", "Upper", "x" * 200, "x" * 201, ""]),
    st.integers(),
    st.none(),
)
VMS = st.dictionaries(st.sampled_from(["cpu_cores", "mem_mib", "disk_gib", "gpus"]), NUMBERS, max_size=4)
TIMES = st.one_of(
    st.datetimes(min_value=datetime(1999, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)).map(
        datetime.isoformat
    ),
    st.sampled_from([AR["start"], "2026-12-04T14:00:00Z", "2026-12-04", "soon", ""]),
    st.none(),
    st.integers(),
)
FIELDS = {
    "name": TEXTS,
    "type": st.one_of(st.sampled_from(sorted(LEASE_TYPES)), TEXTS),
    "start": TIMES,
    "duration_s": NUMBERS,
    "nodes": st.one_of(st.lists(VMS, max_size=3), st.just([VM]), NUMBERS),
    "capabilities": st.one_of(st.lists(TEXTS, max_size=3), TEXTS),
    "groups": st.one_of(st.lists(TEXTS, max_size=3), TEXTS),
    "preemptible": st.one_of(st.booleans(), NUMBERS),
    "migratable": st.booleans(),
    "max_reschedules": NUMBERS,
    "auto_approve_reschedules": st.one_of(st.booleans(), st.none()),
    "driver": st.sampled_from(["sim", "process", "other"]),
    "real_duration_s": NUMBERS,
    "restart_policy": st.just({}),
    "colour": st.just("blue"),
}


@st.composite
def bodies(draw):
    # Mostly an ordinary body with a few fields changed, so that the generated ones reach past the first check.
    body = dict(draw(st.sampled_from([BE, AR, {**BE, "type": "immediate"}])))
    for key in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True)):
        if draw(st.booleans()) and key in body:
            del body[key]
        else:
            body[key] = draw(FIELDS[key])
    return body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_generated_bodies_are_decided_as_the_serializer_decides_them_or_left_to_it(body):
    agree(body)
