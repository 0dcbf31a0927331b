"""The sweep: silent nodes go offline at 20 s and dead after the grace; heartbeats bring them back."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet import actions
from fleet.models import HealthSample, Node
from leases.instances.actions import loss
from leases.instances.actions import nodes as node_actions
from slotkeeper.models import AuditEntry

pytestmark = pytest.mark.django_db


def report(**kw):
    base = {
        "mem_total_mib": 61440,
        "mem_used_mib": 6000,
        "disk_free_gib": 300.0,
        "cpu_pct": 3.0,
        "load1": 0.1,
    }
    return actions.HealthReport(**{**base, **kw})


@pytest.fixture
def tank(register_node, t0):
    node, _ = register_node("tank", now=t0)
    return node_actions.do_heartbeat(node, report(), now=t0)


def status(node) -> str:
    return Node.objects.get(pk=node.pk).status


def sweeps(t0, first: float, last: float, every: float = 5.0) -> actions.SweepResult:
    """The sweep as beat runs it: every 5 s from `first` to `last` seconds after t0. A sweep that finds itself
    away for longer than SWEEP_OUTAGE_GAP_S gives every node a fresh grace, so tests sweep as production does."""
    total = actions.SweepResult(offline=[], dead=[], trimmed_samples=0)
    at = first
    while at <= last:
        result = node_actions.sweep(t0 + timedelta(seconds=at))
        total.offline += result.offline
        total.dead += result.dead
        at += every
    return total


def test_a_node_is_online_until_its_heartbeat_is_20_seconds_old(tank, t0):
    assert sweeps(t0, 0, 15).offline == []
    assert node_actions.sweep(t0 + timedelta(seconds=19.9)).offline == []
    assert status(tank) == "online"
    assert node_actions.sweep(t0 + timedelta(seconds=20.1)).offline == ["tank"]
    assert status(tank) == "offline"


def test_an_offline_node_is_dead_after_the_grace_and_others_hear_of_it(tank, t0, monkeypatch):
    # "Others" are the instances package's node-loss handler, which the composed sweep calls (no signal).
    died = []
    monkeypatch.setattr(loss, "on_nodes_died", lambda node_ids, now, reason="": died.append(list(node_ids)))
    sweeps(t0, 0, 75)
    assert node_actions.sweep(t0 + timedelta(seconds=79)).dead == []
    result = node_actions.sweep(t0 + timedelta(seconds=81))
    assert result.dead == ["tank"]
    assert status(tank) == "dead"
    assert died == [[tank.pk]]
    assert AuditEntry.objects.filter(action="node.dead", target_id=str(tank.pk)).count() == 1


def test_the_grace_is_configurable(tank, t0, settings):
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "DEAD_AFTER_S": 5}
    sweeps(t0, 0, 21)
    assert node_actions.sweep(t0 + timedelta(seconds=26)).dead == ["tank"]


def test_a_heartbeat_brings_an_offline_node_back_online(tank, t0):
    sweeps(t0, 0, 25)
    assert status(tank) == "offline"
    node = Node.objects.get(pk=tank.pk)
    node_actions.do_heartbeat(node, report(), now=t0 + timedelta(seconds=26))
    assert status(tank) == "online"
    assert AuditEntry.objects.filter(action="node.back").exists()


def test_a_drained_node_that_went_dead_returns_as_draining(tank, t0):
    node_actions.do_drain(None, tank.pk, reason="memory test", now=t0)
    sweeps(t0, 0, 90)
    assert status(tank) == "dead"
    node_actions.do_heartbeat(Node.objects.get(pk=tank.pk), report(), now=t0 + timedelta(seconds=91))
    assert status(tank) == "draining"


def test_a_draining_node_is_never_marked_offline_but_can_die(tank, t0):
    node_actions.do_drain(None, tank.pk, reason="kernel upgrade", now=t0)
    assert sweeps(t0, 0, 30).offline == []
    assert status(tank) == "draining"
    assert sweeps(t0, 35, 81, every=2).dead == ["tank"]


def test_a_node_that_never_reported_is_not_declared_dead(register_node, t0):
    node, _ = register_node("fresh", now=t0)
    result = sweeps(t0, 0, 3600, every=10)
    assert result.dead == []
    assert status(node) == "offline"


def test_two_sweeps_of_the_same_instant_act_once(tank, t0):
    sweeps(t0, 0, 15)
    first = node_actions.sweep(t0 + timedelta(seconds=21))
    second = node_actions.sweep(t0 + timedelta(seconds=21))
    assert (first.offline, second.offline) == (["tank"], [])
    assert AuditEntry.objects.filter(action="node.offline").count() == 1


def test_health_history_is_bounded_to_the_last_hour(tank, t0):
    node = Node.objects.get(pk=tank.pk)
    for minutes in (5, 50, 70):
        node_actions.do_heartbeat(node, report(), now=t0 + timedelta(minutes=minutes))
    result = node_actions.sweep(t0 + timedelta(minutes=70))
    # The samples at 0 and 5 minutes are more than an hour old at 70 minutes.
    assert result.trimmed_samples == 2
    assert HealthSample.objects.filter(node=node).count() == 2


def test_history_keeps_one_sample_per_interval_while_the_node_row_keeps_the_latest(tank, t0):
    node = Node.objects.get(pk=tank.pk)  # the fixture's heartbeat at t0 took a sample
    node = node_actions.do_heartbeat(node, report(mem_used_mib=7000), now=t0 + timedelta(seconds=5))
    node = node_actions.do_heartbeat(node, report(mem_used_mib=7500), now=t0 + timedelta(seconds=29))
    node = node_actions.do_heartbeat(node, report(mem_used_mib=8000), now=t0 + timedelta(seconds=31))
    assert HealthSample.objects.filter(node=node).count() == 2  # t0 and t0+31 s; the others within 30 s
    assert Node.objects.get(pk=node.pk).obs_mem_used_mib == 8000


def test_an_undrain_clears_the_drain_deadline(tank, t0):
    node_actions.do_drain(
        None, tank.pk, reason="move", now=t0, deadline=t0 + timedelta(hours=1), max_parallel=4
    )
    actions.do_undrain(None, tank.pk, reason="done", now=t0)
    node = Node.objects.get(pk=tank.pk)
    assert (node.status, node.drain_reason, node.drain_deadline) == ("online", "", None)


def test_after_its_own_60_s_outage_the_sweep_gives_every_node_a_fresh_grace(tank, t0):
    # The server (and its sweep) was down for 60 s: the nodes kept heartbeating into the void. When it comes back
    # it must not find them silent for its own absence and declare them dead; they get a fresh grace from then.
    sweeps(t0, 0, 10)
    back = 70.0
    result = node_actions.sweep(t0 + timedelta(seconds=back))
    assert result.resumed_after_s == pytest.approx(60.0)
    assert (result.offline, result.dead) == ([], [])
    assert status(tank) == "online"
    # If the node really is silent it goes offline 20 s after the grace began, and dead after the usual grace.
    assert sweeps(t0, back + 5, back + 15).offline == []
    assert sweeps(t0, back + 20, back + 20).offline == ["tank"]
    assert sweeps(t0, back + 25, back + 75).dead == []
    assert sweeps(t0, back + 80, back + 85).dead == ["tank"]


def test_a_node_that_heartbeats_within_the_fresh_grace_is_never_marked_offline(tank, t0):
    sweeps(t0, 0, 10)
    node_actions.sweep(t0 + timedelta(seconds=200))
    node_actions.do_heartbeat(Node.objects.get(pk=tank.pk), report(), now=t0 + timedelta(seconds=205))
    assert sweeps(t0, 205, 220).offline == []
    assert status(tank) == "online"
    # Never touched at all: a node wrongly marked offline or dead would also be back online by now.
    changes = AuditEntry.objects.filter(at__gt=t0, action__in=["node.offline", "node.dead", "node.back"])
    assert not changes.exists()


@pytest.fixture
def fleet_of_five(register_node, t0):
    nodes = []
    for name in ("a", "b", "c", "d", "e"):
        node, _ = register_node(name, now=t0)
        nodes.append(node_actions.do_heartbeat(node, report(), now=t0))
    return nodes


def test_when_most_of_the_fleet_goes_silent_at_once_nodes_go_offline_but_none_is_declared_dead(
    fleet_of_five, t0
):
    # The web processes stopped receiving heartbeats (a network split, a load balancer gone) while the sweep ran
    # on: all five nodes are silent. Marking them offline stops new work landing there; declaring them dead would
    # lose every instance and propose 5 reschedules for a fault that is ours.
    result = sweeps(t0, 0, 200)
    assert sorted(result.offline) == ["a", "b", "c", "d", "e"]
    assert result.dead == []
    last = node_actions.sweep(t0 + timedelta(seconds=205))
    assert last.disrupted and "5 of 5 nodes" in last.note
    assert AuditEntry.objects.filter(action="fleet.disrupted").count() == 1
    # The heartbeats come back for four of them; the fifth really is gone. It gets a fresh grace from the end of
    # the disruption, then is declared dead as usual.
    for node in fleet_of_five[:4]:
        node_actions.do_heartbeat(Node.objects.get(pk=node.pk), report(), now=t0 + timedelta(seconds=206))
    for at in range(210, 400, 5):
        for node in fleet_of_five[:4]:
            node_actions.do_heartbeat(Node.objects.get(pk=node.pk), report(), now=t0 + timedelta(seconds=at))
        result = node_actions.sweep(t0 + timedelta(seconds=at))
        assert not result.disrupted
        if result.dead:
            break
    assert result.dead == ["e"]
    assert at >= 210 + 80  # not before a full grace from the end of the disruption
    assert AuditEntry.objects.filter(action="fleet.disruption_over").count() == 1


def test_one_silent_node_among_five_is_an_ordinary_death(fleet_of_five, t0):
    for at in range(0, 120, 5):
        for node in fleet_of_five[:4]:
            node_actions.do_heartbeat(Node.objects.get(pk=node.pk), report(), now=t0 + timedelta(seconds=at))
        result = node_actions.sweep(t0 + timedelta(seconds=at))
        assert not result.disrupted
    assert status(fleet_of_five[4]) == "dead"
