"""Replays of Haizea's own test traces under its two test configs (SEMANTICS §8, §10), plus random workloads."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leases.haizea_config import read_config
from leases.lifecycle import LeaseState
from leases.replay import as_json, check_invariants, locate, replay, run_config, setup, timeline
from leases.scheduler import SchedulerConfig
from leases.slottable import Res
from leases.traces import Trace, TraceLease, merge_traces, read_trace
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


# -- AR injection (Haizea's [tracefile] injectionfile) ---------------------------------------------------


def inject(tmp_path: Path, *lines: str) -> Path:
    """A legacy one-line injection file (SEMANTICS §7.2): reqTime startTime duration realDuration numNodes
    CPU mem disk 'image' imageSize, in seconds after the trace start."""
    path = tmp_path / "injection.lwf"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def run_injected(trace_name: str, injection: Path, config_path: Path = CONFIG_A):
    return run_config(read_config(config_path), HAIZEA / trace_name, injection, check=True)


def test_an_ar_injected_into_wait_takes_its_slot_and_pushes_the_later_wide_leases_back_by_its_length(
    tmp_path,
):
    # wait.lwf: eight 4-node leases of 15 min at 13:00, run back to back. An AR for all 4 nodes 13:45-14:00,
    # requested at 13:00, is decided before the queue runs: leases 1-3 still fit before it, 4-8 come after.
    result = run_injected("tests-1.0/wait.lwf", inject(tmp_path, "0 2700 900 900 4 1 1024 0 'NONE.img' 600"))
    ar = 9  # the injection's id 1 collides with the trace's, so it is moved past the largest (8)
    assert result.trace.injected == (ar,)
    assert plan(result, ar) == [("vm", at("13:45:00"), at("14:00:00"), [1, 2, 3, 4])]
    starts = [plan(result, i)[0][1] for i in range(1, 9)]
    assert starts == [at("13:00:00"), at("13:15:00"), at("13:30:00")] + [
        at("14:00:00") + i * 900 for i in range(5)
    ]
    m = result.metrics
    assert (m.ar_accepted, m.ar_rejected) == (1, 0)
    assert m.last_best_effort_end_s == at("15:15:00")  # the best-effort metrics leave the AR out
    assert m.mean_wait_s == (0 + 900 + 1800 + sum(3600 + i * 900 for i in range(5))) / 8
    assert m.utilisation == 1.0  # back to back on all 4 nodes from 13:00 to 15:15


def test_an_injected_ar_inside_a_running_lease_suspends_it_just_before_and_it_resumes_after_the_queue(
    tmp_path,
):
    # The AR (13:10-13:15, all 4 nodes, requested at 13:05) cuts into lease 1 (13:00-13:15). Config A: 32 s
    # to suspend each 1024 MB VM, one per node in parallel, so lease 1 runs to 13:09:28 and is suspended by
    # 13:10. Lease 2 keeps the one future reservation (13:15); lease 1 rejoins the queue behind the leases
    # submitted at the same instant, so it resumes at 15:00 (32 s) and runs its last 332 s to 15:06:04.
    result = run_injected("tests-1.0/wait.lwf", inject(tmp_path, "300 600 300 300 4 1 1024 0 'NONE.img' 600"))
    assert plan(result, 9) == [("vm", at("13:10:00"), at("13:15:00"), [1, 2, 3, 4])]
    assert plan(result, 1) == [
        ("vm", at("13:00:00"), at("13:09:28"), [1, 2, 3, 4]),
        ("suspend", at("13:09:28"), at("13:10:00"), [1, 2, 3, 4]),
        ("resume", at("15:00:00"), at("15:00:32"), [1, 2, 3, 4]),
        ("vm", at("15:00:32"), at("15:06:04"), [1, 2, 3, 4]),
    ]
    assert [plan(result, i)[0][1] for i in range(2, 9)] == [at("13:15:00") + i * 900 for i in range(7)]
    assert result.scheduler.leases[1].run_time == 900


def test_an_injected_ar_is_never_preempted_even_if_its_file_says_preemptible(tmp_path):
    base = read_trace(HAIZEA / "tests-1.0/wait.lwf")
    lwf = (HAIZEA / "traces/multi/inj1.lwf").read_text().replace('preemptible="false"', 'preemptible="true"')
    (tmp_path / "inj.lwf").write_text(lwf)
    merged = merge_traces(base, read_trace(tmp_path / "inj.lwf"))
    injected = [lease for lease in merged.leases if lease.id in merged.injected]
    assert len(injected) == 13
    assert not any(lease.preemptible for lease in injected)
    assert all(lease.id > 8 for lease in injected)  # kept apart from the trace's 1..8


def test_an_injection_holding_a_best_effort_lease_is_refused(tmp_path):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="exact start"):
        call_command(
            "replay", str(HAIZEA / "tests-1.0/wait.lwf"), "--inject", str(HAIZEA / "tests-1.0/wait.lwf")
        )


def test_replay_takes_the_injectionfile_from_the_config_and_inject_wins_over_it(tmp_path, capsys):
    from django.core.management import call_command

    late = inject(tmp_path, "0 2700 900 900 4 1 1024 0 'NONE.img' 600")
    early = tmp_path / "early.lwf"
    early.write_text("300 600 300 300 4 1 1024 0 'NONE.img' 600\n")
    config = tmp_path / "wait.conf"
    # Config A's own [tracefile] names preemption.lwf on its author's disk; a repeated section is merged, as
    # Haizea's ConfigParser did, so these lines win.
    extra = f"\n[tracefile]\ntracefile: {HAIZEA / 'tests-1.0/wait.lwf'}\ninjectionfile: {late}\n"
    config.write_text(CONFIG_A.read_text() + extra)

    def ar_start(*extra: str) -> str:
        call_command("replay", "--config", str(config), "--json", *extra)
        doc = json.loads(capsys.readouterr().out)
        assert doc["workload"]["injected_leases"] == 1
        ar = [lease for lease in doc["leases"] if lease["injected"]]
        assert [lease["type"] for lease in ar] == ["advance_reservation"]
        assert doc["metrics"]["ar_accepted"] == 1
        return ar[0]["start"]

    assert ar_start() == "2006-11-25T13:45:00+00:00"
    assert ar_start("--inject", str(early)) == "2006-11-25T13:10:00+00:00"


def test_a_config_path_from_another_disk_is_found_under_the_shared_material_by_its_tail():
    assert locate("/usr/share/haizea/traces/multi/inj1.lwf", [HAIZEA]) == HAIZEA / "traces/multi/inj1.lwf"
    assert locate("/nowhere/at/all.lwf", [HAIZEA]) == Path("/nowhere/at/all.lwf")


# -- sweeps over a multi-configuration -------------------------------------------------------------------

TWO_TRACE_MULTI = """
[multi]
tracedir: /usr/share/haizea/tests
tracefiles: wait.lwf preemption.lwf
injectiondir: {injections}
injectionfiles: late.lwf

[common:general]
mode: simulated
lease-preparation: unmanaged

[common:simulation]
clock: simulated
starttime: 2006-11-25 13:00:00
resources: 4 CPU:100 Memory:1024
imagetransfer-bandwidth: 100

[common:scheduling]
policy-preemption: ar-preempts-everything
backfilling: aggressive
suspend-rate: 32
resume-rate: 32

[SR:scheduling]
suspension: all

[noSR:scheduling]
suspension: none
"""


def _two_trace_multi(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    for name in ("wait.lwf", "preemption.lwf"):
        (tmp_path / "tests" / name).write_bytes((HAIZEA / "tests-1.0" / name).read_bytes())
    (tmp_path / "late.lwf").write_text("0 2700 900 900 4 1 1024 0 'NONE.img' 600\n")
    path = tmp_path / "two.conf"
    path.write_text(TWO_TRACE_MULTI.format(injections=tmp_path))
    return path


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_sweep_replays_every_profile_trace_and_injection_one_line_and_one_csv_row_each(
    tmp_path, capsys, jobs
):
    from django.core.management import call_command

    multi = _two_trace_multi(tmp_path)
    table = tmp_path / "sweep.csv"
    call_command("replay", "--sweep", str(multi), "--jobs", jobs, "--csv", str(table))
    out = capsys.readouterr()
    lines = out.out.splitlines()
    # 2 profiles x 2 traces x (late.lwf, none), in the file's order; the traces were found beside the config.
    assert [line.split(":")[0] for line in lines] == [
        "SR wait late",
        "SR wait (no injection)",
        "SR preemption late",
        "SR preemption (no injection)",
        "noSR wait late",
        "noSR wait (no injection)",
        "noSR preemption late",
        "noSR preemption (no injection)",
    ]
    assert "8/8 runs" in out.err
    with table.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["profile"], r["trace"], r["injection"]) for r in rows][:2] == [
        ("SR", "wait", "late"),
        ("SR", "wait", ""),
    ]
    # The same numbers as a single replay of that combination (the first test above).
    assert rows[0]["ar_accepted"] == "1"
    assert float(rows[0]["last_best_effort_end_s"]) == at("15:15:00")
    assert float(rows[1]["last_best_effort_end_s"]) == at("15:00:00")  # wait.lwf alone: 8 x 15 min
    # preemption.lwf's own AR holds all 4 nodes 13:30-14:00, so the injected one (13:45-14:00) is rejected:
    # an AR never preempts another AR.
    assert [(r["ar_accepted"], r["ar_rejected"]) for r in rows[2:4]] == [("1", "1"), ("1", "0")]
    # Every row's last best-effort end, worked out by hand:
    # - wait.lwf: leases 1-3 fit before the injected AR (13:45) and 4-8 follow it, with or without suspension;
    # - preemption.lwf + late.lwf, SR: the injected AR is decided first (requested at 13:00), so the 1-hour
    #   lease runs 13:00-13:44:28, is suspended by 13:45, resumes 14:00-14:00:32 and runs its last 932 s;
    # - preemption.lwf alone, SR: the worked example of SEMANTICS §10 (done at 14:31:04);
    # - noSR: the lease never starts into an AR, so it runs 14:00-15:00 in both preemption rows.
    ends = [(r["profile"], r["trace"], r["injection"], float(r["last_best_effort_end_s"])) for r in rows]
    assert ends == [
        ("SR", "wait", "late", at("15:15:00")),
        ("SR", "wait", "", at("15:00:00")),
        ("SR", "preemption", "late", at("14:16:04")),
        ("SR", "preemption", "", at("14:31:04")),
        ("noSR", "wait", "late", at("15:15:00")),
        ("noSR", "wait", "", at("15:00:00")),
        ("noSR", "preemption", "late", at("15:00:00")),
        ("noSR", "preemption", "", at("15:00:00")),
    ]


def test_a_sweep_names_a_trace_it_cannot_find(tmp_path):
    from django.core.management import CommandError, call_command

    multi = tmp_path / "m.conf"
    multi.write_text(TWO_TRACE_MULTI.format(injections=tmp_path).replace("wait.lwf", "nosuch.lwf"))
    with pytest.raises(CommandError, match=r"nosuch\.lwf not found"):
        call_command("replay", "--sweep", str(multi))


# -- plots -----------------------------------------------------------------------------------------------


def test_the_timeline_counts_cpu_in_use_and_queued_leases_between_events(tmp_path):
    result = run_injected("tests-1.0/wait.lwf", inject(tmp_path, "0 2700 900 900 4 1 1024 0 'NONE.img' 600"))
    rows = timeline(result.scheduler)
    assert rows[0] == (0.0, 1.0, 6)  # lease 1 runs, lease 2 holds the future slot, 3-8 wait
    assert rows[-1] == (at("15:15:00"), 0.0, 0)
    assert all(u == 1.0 for t, u, _ in rows[:-1])
    # Every 15 min the next lease starts and the one behind it takes the future slot, except at 13:45, when
    # the AR starts and the slot stays with lease 4 (booked for 14:00).
    assert [t for t, _, _ in rows] == [i * 900.0 for i in range(10)]
    assert [q for _, _, q in rows] == [6, 5, 4, 4, 3, 2, 1, 0, 0, 0]


def test_plot_draws_an_svg(tmp_path):
    # matplotlib is the optional `plot` extra; `make install` (and so CI) installs it, so this test runs there.
    from django.core.management import call_command

    svg = tmp_path / "run.svg"
    call_command("replay", str(HAIZEA / "tests-1.0/wait.lwf"), "--config", str(CONFIG_A), "--plot", str(svg))
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "queued leases" in text or "queued" in text


def test_plot_without_matplotlib_says_how_to_install_it_before_replaying(monkeypatch, tmp_path):
    from django.core.management import CommandError, call_command

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(CommandError, match=r"slotkeeper\[plot\]"):
        call_command("replay", str(HAIZEA / "tests-1.0/wait.lwf"), "--plot", str(tmp_path / "x.svg"))
    assert not (tmp_path / "x.svg").exists()


def test_the_forecast_accuracy_compares_each_estimate_with_the_actual_start():
    # Two one-node best-effort leases of an hour on one node, the second submitted while the first runs: planned
    # (backfilling's future reservation) to start when the first's hour is over. With exact run times it starts
    # then (error 0); when the first really ends after 10 minutes, it starts 50 minutes before its estimate.
    from leases.replay import ForecastAccuracy

    node = Res(100, 1024)
    leases = [
        TraceLease(1, "best_effort", 0.0, None, None, 3600.0, 600.0, (node,)),
        TraceLease(2, "best_effort", 60.0, None, None, 3600.0, 600.0, (node,)),
    ]
    trace = Trace("two.lwf", "two", (node,), tuple(leases))
    capacities, config = setup(trace, None)
    exact, early = ForecastAccuracy(), ForecastAccuracy()
    replay(trace, capacities, config, accuracy=exact, exact_runtimes=True)
    replay(trace, capacities, config, accuracy=early)
    assert exact.summary()["leases"] == 2 and exact.summary()["p90_abs_error_s"] == 0
    assert early.summary()["leases"] == 2 and early.summary()["within_1_min"] == 0.5
    assert early.summary()["p90_abs_error_s"] == pytest.approx(3000, abs=120)
    assert early.late == [0.0, pytest.approx(-3000, abs=120)]  # it started earlier than estimated
