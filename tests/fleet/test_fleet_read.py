"""The planning pass's fleet read (fleet/placement.py `states_from_rows`) gives exactly what reading the model
objects gives (`snapshot`): the fast path converts the heartbeat time and the capabilities in bulk."""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta
from unittest.mock import patch

import pytest
from django.db.models.sql.compiler import SQLCompiler
from django.utils import timezone

from fleet import placement
from fleet.models import Node
from fleet.nodestate import NodeState

pytestmark = pytest.mark.django_db


def test_the_fast_fleet_read_equals_the_model_objects_read():
    now = timezone.now()
    Node.objects.create(
        name="gpu-01", token_digest="t1", cpu_cores=32, mem_total_mib=131072, disk_total_gib=2000, capabilities=["kvm", "gpu"],
        last_heartbeat_at=now - timedelta(seconds=7, microseconds=250_000), obs_mem_total_mib=131072,
        obs_mem_used_mib=4000, obs_disk_free_gib=1500.5, obs_cpu_pct=12.5, idle_baseline_mib=3500,
    )  # fmt: skip
    Node.objects.create(
        name="silent", token_digest="t2", cpu_cores=4, mem_total_mib=8192, disk_total_gib=100, capabilities=[]
    )
    Node.objects.create(
        name="future-clock", token_digest="t3", cpu_cores=8, mem_total_mib=16384, disk_total_gib=200, capabilities=["kvm"],
        last_heartbeat_at=now + timedelta(seconds=3), status="draining", drain_reason="disk swap",
    )  # fmt: skip
    fast = placement.states_from_rows(now)
    slow = placement.snapshot(now)
    assert [n.name for n in fast] == ["gpu-01", "silent", "future-clock"]
    for a, b in zip(fast, slow, strict=True):
        assert (
            a.health_age_s == pytest.approx(b.health_age_s, abs=1e-3)
            if b.health_age_s is not None
            else (a.health_age_s is None)
        )
        assert {f.name: getattr(a, f.name) for f in fields(NodeState) if f.name != "health_age_s"} == {
            f.name: getattr(b, f.name) for f in fields(NodeState) if f.name != "health_age_s"
        }
    assert fast[0].health_age_s == pytest.approx(7.25, abs=1e-3)
    assert fast[2].health_age_s == 0.0, (
        "a heartbeat stamped ahead of the server's clock is fresh, not negative"
    )
    assert fast[0].capabilities == frozenset({"kvm", "gpu"}) and fast[1].capabilities == frozenset()


def test_a_node_state_read_in_bulk_has_every_field_and_compares_equal_to_one_built_field_by_field():
    values = (3, "n3", "online", frozenset({"kvm"}), 16, 65536, 1000, 1.5, 65536, 3000, 500.0, 20.0, 4000)
    read = NodeState.read(*values)
    built = NodeState(*values)
    assert read == built and hash(read.capabilities) == hash(built.capabilities)
    assert set(vars(read)) == {f.name for f in fields(NodeState)}


def test_the_fleet_read_compiles_its_statement_once_and_reads_rows_as_the_query_gives_them(
    django_assert_num_queries,
):
    """The pass's fleet read runs one precompiled statement (compiling it and Django's row iterator were a fifth
    of the read at 1,000 nodes); its rows are the queryset's, value for value and type for type."""
    now = timezone.now()
    Node.objects.create(
        name="gpu-01", token_digest="t1", cpu_cores=32, mem_total_mib=131072, disk_total_gib=2000,
        capabilities=["kvm", "gpu"], last_heartbeat_at=now, obs_mem_total_mib=131072, obs_mem_used_mib=4000,
        obs_disk_free_gib=1500.5, obs_cpu_pct=12.5, idle_baseline_mib=3500,
    )  # fmt: skip
    Node.objects.create(name="silent", token_digest="t2", cpu_cores=4, mem_total_mib=8192, disk_total_gib=100)
    placement.states_from_rows(now)
    with (
        patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")),
        django_assert_num_queries(1),
    ):
        states = placement.states_from_rows(now)
    assert [s.name for s in states] == ["gpu-01", "silent"]
    raw = placement._fleet_rows()
    expected = [
        (*row[:7], None if row[7] is None else float(row[7]), *row[8:]) for row in placement._fleet_query()
    ]
    assert raw == expected
    assert [tuple(map(type, row)) for row in raw] == [tuple(map(type, row)) for row in expected]


def _fleet_of_every_kind(now):
    """A node of each kind liveness tells apart: fresh, stale, silent, unreadable, draining, dead, offline."""
    fresh = dict(obs_mem_total_mib=65536, obs_mem_used_mib=3000, obs_disk_free_gib=800.0, obs_cpu_pct=5.0)
    specs = [
        ("fresh", "online", now - timedelta(seconds=2), fresh),
        ("stale", "online", now - timedelta(seconds=95), fresh),
        ("silent", "online", None, {}),
        ("unreadable", "online", now - timedelta(seconds=1), dict(fresh, obs_disk_free_gib=None)),
        ("cordoned", "draining", now - timedelta(seconds=1), fresh),
        ("gone", "dead", now - timedelta(hours=1), fresh),
        ("away", "offline", now - timedelta(minutes=3), fresh),
    ]
    for i, (name, status, seen, health) in enumerate(specs):
        Node.objects.create(
            name=name, token_digest=f"t{i}", status=status, cpu_cores=16, mem_total_mib=65536,
            disk_total_gib=1000, capabilities=["kvm"], last_heartbeat_at=seen, idle_baseline_mib=3000,
            drain_reason="disk swap" if status == "draining" else "", **health,
        )  # fmt: skip


def test_what_a_fleet_read_remembers_of_its_rows_gives_what_the_node_states_alone_give(settings):
    """FleetRead's fingerprint and exclusions come from facts remembered per row; they must be exactly what the
    NodeStates give, read after read, as rows change and as the clock moves."""
    now = timezone.now()
    _fleet_of_every_kind(now)
    max_age = settings.SLOTKEEPER["HEALTH_MAX_AGE_S"]

    def agree(at):
        read = placement.read_fleet(at)
        assert read.fingerprint() == placement.fingerprint(read.states)
        assert read.excluded(max_age) == placement.excluded(read.states, max_age)
        return read

    first = agree(now)
    assert set(first.excluded(max_age)) == {n.id for n in Node.objects.exclude(name="fresh")}
    again = agree(now)  # every row remembered now
    assert again.fingerprint() == first.fingerprint()

    # The clock moves: the fresh node's remembered row turns stale, with its age in the sentence.
    later = now + timedelta(seconds=max_age + 10)
    fresh = Node.objects.get(name="fresh")
    excluded = agree(later).excluded(max_age)
    assert excluded[fresh.pk].startswith("no_recent_health: last health report 4")

    # Rows change: a drain, a new baseline (allocatable memory), a rename, a fixed disk probe.
    Node.objects.filter(pk=fresh.pk).update(status="draining", drain_reason="kernel update")
    Node.objects.filter(name="stale").update(idle_baseline_mib=9000)
    Node.objects.filter(name="silent").update(name="quiet")
    Node.objects.filter(name="unreadable").update(obs_disk_free_gib=700.0)
    changed = agree(now)
    excluded = changed.excluded(max_age)
    assert excluded[fresh.pk].startswith("draining: ")
    assert Node.objects.get(name="unreadable").pk not in excluded
    assert changed.fingerprint() != first.fingerprint()
    stale = next(s for s in changed.states if s.name == "stale")
    assert (
        dict((i, limits) for i, _, limits in changed.fingerprint())[stale.id].mem_mib == 65536 - 4096 - 9000
    )
    assert "quiet" in [s.name for s in changed.states]


def test_a_remembered_row_gives_a_new_node_state_with_its_own_age_each_read():
    now = timezone.now()
    _fleet_of_every_kind(now)
    first = placement.states_from_rows(now)
    second = placement.states_from_rows(now + timedelta(seconds=5))
    for a, b in zip(first, second, strict=True):
        assert a is not b
        if a.health_age_s is not None:
            assert b.health_age_s == pytest.approx(a.health_age_s + 5, abs=1e-3)
        assert {k: v for k, v in vars(a).items() if k != "health_age_s"} == {
            k: v for k, v in vars(b).items() if k != "health_age_s"
        }


def test_the_fleet_read_remembers_one_fleets_worth_of_rows_however_often_they_change():
    """Every heartbeat makes a new row; the remembered facts are the last read's rows only, so a fleet
    heartbeating for days holds no more than its own size."""
    now = timezone.now()
    _fleet_of_every_kind(now)
    fresh = Node.objects.get(name="fresh")
    for beat in range(50):
        Node.objects.filter(pk=fresh.pk).update(last_heartbeat_at=now + timedelta(seconds=beat))
        placement.read_fleet(now + timedelta(seconds=beat))
    assert len(placement._facts_of) == Node.objects.count() == 7
    assert [row[0] for row in placement._facts_of] == sorted(Node.objects.values_list("id", flat=True))
