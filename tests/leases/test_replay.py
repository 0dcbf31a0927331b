"""Replays of Haizea's own test traces under its two test configs (SEMANTICS §8, §10), plus random workloads."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leases.haizea_config import read_config
from leases.lifecycle import LeaseState
from leases.replay import as_json, check_invariants, replay, setup
from leases.scheduler import SchedulerConfig
from leases.slottable import Res
from leases.traces import Trace, TraceLease, read_trace
from slotkeeper import shared

HAIZEA = shared.HAIZEA
CONFIG_A = HAIZEA / "configs/haizea-1.1-tests-base_config_simulator.conf"
CONFIG_B = HAIZEA / "configs/haizea-1.0-tests-base_config_simulator.conf"
TRACES = [
    *sorted((HAIZEA / "tests-1.0").glob("*.lwf")),
    HAIZEA / "tests-1.1-extra/piggybacking.lwf",
    HAIZEA / "tests-1.1-extra/prematureend_in_start.lwf",
]


def at(clock: str) -> float:
    """Seconds after the 13:00:00 trace start for a clock time such as "13:29:28"."""
    h, m, s = (int(x) for x in clock.split(":"))
    return (h - 13) * 3600 + m * 60 + s


def run(trace_name: str, config_path: Path = CONFIG_A, **overrides: object):
    trace = read_trace(HAIZEA / trace_name)
    capacities, config = setup(trace, read_config(config_path))
    return replay(trace, capacities, replace(config, **overrides), check=True)


def plan(
    result, lease_id: int, *, include_cancelled: bool = False
) -> list[tuple[str, float, float, list[int]]]:
    rec = result.scheduler.leases[lease_id]
    return [
        (r.kind, r.start, r.end, sorted(set(r.nodes.values())))
        for r in rec.reservations
        if include_cancelled or r.status != "cancelled"
    ]


def test_the_manual_quickstart_suspends_the_best_effort_lease_just_before_the_ar_and_resumes_it_after():
    result = run("tests-1.0/preemption.lwf")
    assert plan(result, 1) == [
        ("vm", at("13:00:00"), at("13:29:28"), [1]),
        ("suspend", at("13:29:28"), at("13:30:00"), [1]),
        ("resume", at("14:00:00"), at("14:00:32"), [1]),
        ("vm", at("14:00:32"), at("14:31:04"), [1]),
    ]
    assert plan(result, 2) == [("vm", at("13:30:00"), at("14:00:00"), [1, 2, 3, 4])]
    assert result.scheduler.leases[1].end == at("14:31:04")


def test_without_suspension_the_preempted_lease_is_requeued_at_the_ar_request_and_restarts_from_scratch():
    result = run("tests-1.0/preemption.lwf", suspension="none")
    rec = result.scheduler.leases[1]
    assert plan(result, 1) == [
        ("vm", at("13:00:00"), at("13:15:00"), [1]),
        ("vm", at("14:00:00"), at("15:00:00"), [1]),
    ]
    assert rec.lost_run_time == 15 * 60
    assert rec.run_time == 3600


def test_a_wide_best_effort_lease_gets_a_future_reservation_behind_a_long_one():
    result = run("tests-1.0/reservation.lwf")
    assert plan(result, 1) == [("vm", at("13:00:00"), at("14:00:00"), [1])]
    assert plan(result, 2) == [("vm", at("14:00:00"), at("14:15:00"), [1, 2, 3, 4])]


def test_aggressive_backfilling_runs_the_eight_wide_leases_of_wait_back_to_back():
    result = run("tests-1.0/wait.lwf")
    starts = [plan(result, i)[0][1] for i in range(1, 9)]
    assert starts == [i * 900 for i in range(8)]


def test_an_early_end_pulls_the_future_reservation_forward():
    result = run("tests-1.0/reservation_prematureend.lwf")
    assert plan(result, 2) == [("vm", at("13:30:00"), at("13:45:00"), [1, 2, 3, 4])]
    cancelled = [r for r in result.scheduler.leases[2].reservations if r.status == "cancelled"]
    assert [(r.start, r.end) for r in cancelled] == [(at("14:00:00"), at("14:15:00"))]


def test_config_b_shortens_suspension_to_the_overhead_and_gives_the_ar_its_full_window_before_shutdown():
    result = run("tests-1.0/preemption.lwf", CONFIG_B)
    assert plan(result, 1)[:2] == [
        ("vm", at("13:00:00"), at("13:29:58"), [1]),
        ("suspend", at("13:29:58"), at("13:30:00"), [1]),
    ]
    # Q4: the AR's VM gets its whole 30 minutes; the 4 x 2 s shutdown follows it.
    assert plan(result, 2) == [
        ("vm", at("13:30:00"), at("14:00:00"), [1, 2, 3, 4]),
        ("shutdown", at("14:00:00"), at("14:00:08"), [1, 2, 3, 4]),
    ]


@pytest.mark.parametrize("config_path", [CONFIG_A, CONFIG_B], ids=["A", "B"])
@pytest.mark.parametrize("trace_path", TRACES, ids=lambda p: p.name)
def test_every_haizea_test_trace_replays_with_the_invariants_holding_after_every_step(
    trace_path, config_path
):
    result = run(str(trace_path.relative_to(HAIZEA)), config_path)
    states = {rec.state for rec in result.scheduler.leases.values()}
    assert states <= {LeaseState.DONE}
    assert result.metrics.leases == len(result.trace.leases)


def test_the_json_output_lists_every_reservation_with_node_numbers_and_iso_times():
    result = run("tests-1.0/reservation_prematureend.lwf")
    doc = json.loads(json.dumps(as_json(result, datetime(2006, 11, 25, 13, 0, 0))))
    lease2 = next(lease for lease in doc["leases"] if lease["id"] == 2)
    assert lease2["start"] == "2006-11-25T13:30:00"
    assert [(r["status"], r["nodes"]) for r in lease2["reservations"]] == [
        ("cancelled", [1, 2, 3, 4]),
        ("done", [1, 2, 3, 4]),
    ]
    assert set(doc["metrics"]) == {
        "leases",
        "last_best_effort_end_s",
        "mean_wait_s",
        "mean_bounded_slowdown",
        "utilisation",
        "ar_accepted",
        "ar_rejected",
    }


def test_metrics_follow_q12_and_count_ars_after_scheduling():
    m = run("tests-1.0/preemption.lwf").metrics
    assert m.last_best_effort_end_s == at("14:31:04")
    assert m.mean_wait_s == 0
    assert m.mean_bounded_slowdown == pytest.approx(at("14:31:04") / 3600)
    assert (m.ar_accepted, m.ar_rejected) == (1, 0)


# -- random workloads ------------------------------------------------------------------------------------

F = Res(cpu=100, mem=1024)
H = Res(cpu=50, mem=512)


@st.composite
def workloads(draw):
    nodes = draw(st.integers(1, 4))
    leases = []
    for i in range(1, draw(st.integers(1, 8)) + 1):
        kind = draw(st.sampled_from(["best_effort", "best_effort", "advance_reservation", "immediate"]))
        submit = draw(st.integers(0, 60)) * 60.0
        duration = draw(st.integers(1, 60)) * 60.0
        real = draw(st.one_of(st.none(), st.integers(1, 90).map(lambda m: m * 60.0)))
        vnodes = tuple(draw(st.sampled_from([F, H])) for _ in range(draw(st.integers(1, nodes))))
        start = submit + draw(st.integers(0, 60)) * 60.0 if kind == "advance_reservation" else None
        leases.append(
            TraceLease(i, kind, submit, start, None, duration, real, vnodes, preemptible=draw(st.booleans()))
        )
    leases.sort(key=lambda x: x.submit_s)
    config = SchedulerConfig(
        backfilling=draw(st.sampled_from(["off", "aggressive", "conservative"])),
        suspension=draw(st.sampled_from(["none", "serial-only", "all"])),
        migration=draw(st.sampled_from(["no", "yes", "yes-notransfer"])),
        suspendresume_exclusion=draw(st.sampled_from(["local", "global"])),
        enactment_overhead=draw(st.sampled_from([0.0, 2.0])),
    )
    capacities = {n: Res(100, 1024, 0, 100, 100) for n in range(1, nodes + 1)}
    return Trace("random", "random", None, tuple(leases)), capacities, config


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_small_workloads_keep_every_invariant(workload):
    trace, capacities, config = workload
    result = replay(trace, capacities, config, check=True)
    check_invariants(result.scheduler, final=True)
    for rec in result.scheduler.leases.values():
        if rec.request.type == "advance_reservation" and rec.state == LeaseState.DONE:
            assert rec.first_start == rec.request.start
        if not rec.request.preemptible:
            assert rec.lost_run_time == 0
            assert not any(r.kind == "suspend" for r in rec.reservations if r.status != "cancelled")


# -- the management command ------------------------------------------------------------------------------


def test_the_replay_command_prints_exactly_one_json_object(capsys):
    from django.core.management import call_command

    call_command("replay", str(HAIZEA / "tests-1.0/preemption.lwf"), "--config", str(CONFIG_A), "--json")
    doc = json.loads(capsys.readouterr().out)
    lease1 = next(lease for lease in doc["leases"] if lease["id"] == 1)
    assert (lease1["start"], lease1["end"]) == ("2006-11-25T13:00:00+00:00", "2006-11-25T14:31:04+00:00")
    assert doc["metrics"]["ar_accepted"] == 1


def test_an_unparseable_trace_is_one_error_naming_file_and_line(tmp_path):
    from django.core.management import CommandError, call_command

    bad = tmp_path / "bad.lwf"
    bad.write_text("<lease-workload>\n<lease-requests><oops\n")
    with pytest.raises(CommandError, match=rf"^{bad}:\d+: "):
        call_command("replay", str(bad))
