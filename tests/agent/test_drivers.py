"""The process driver runs real commands (exit codes, logs, SIGTERM then SIGKILL); the sim driver pretends."""

import sys
import time

import pytest

from fleet.agent.assignments import Assignment, SimSpec, Spec
from fleet.agent.drivers import ProcessDriver, SimDriver, StartFailed, read_tail


def process(command: list[str], generation: int = 0, **spec) -> Assignment:
    return Assignment("7-1-0", generation, "running", "process", Spec(command=tuple(command), **spec))


def python(code: str, **spec) -> Assignment:
    return process([sys.executable, "-c", code], **spec)


def wait_until_ended(handle, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        observation = handle.poll(time.monotonic())
        if observation.ended:
            return observation
        time.sleep(0.02)
    raise AssertionError("the process did not end")


def wait_for_log(handle, text: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in handle.log_tail(50) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_process_that_exits_3_reports_exit_code_3_and_its_log_tail(tmp_path):
    code = "import sys\nfor i in range(30): print(f'line {i}')\nprint('boom', file=sys.stderr)\nsys.exit(3)"
    handle = ProcessDriver(tmp_path).start(python(code), time.monotonic())
    observation = wait_until_ended(handle)
    assert (observation.status, observation.exit_code) == ("exited", 3)
    assert observation.detail == "exit code 3"
    assert handle.log_tail(3) == ["line 28", "line 29", "boom"], "stderr lands in the same log, in order"
    assert (tmp_path / "instances" / "7-1-0" / "g0.log").exists()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)"
    handle = ProcessDriver(tmp_path).start(python(code), time.monotonic())
    wait_for_log(handle, "ready")
    started = time.monotonic()
    handle.request_stop(started, grace_s=0.3)
    assert handle.poll(started).status == "running", "SIGTERM alone does not end it"
    observation = wait_until_ended(handle)
    assert time.monotonic() - started >= 0.3, "SIGKILL waits for the grace"
    assert (observation.status, observation.exit_code) == ("stopped", -9)
    assert observation.detail == "killed by SIGKILL: still running 0.3 s after SIGTERM"


def test_a_process_that_honours_sigterm_stops_within_the_grace(tmp_path):
    handle = ProcessDriver(tmp_path).start(
        python("import time\nprint('ready', flush=True)\ntime.sleep(60)"), 0.0
    )
    wait_for_log(handle, "ready")
    handle.request_stop(time.monotonic(), grace_s=30)
    observation = wait_until_ended(handle)
    assert (observation.status, observation.exit_code, observation.detail) == (
        "stopped",
        -15,
        "killed by SIGTERM",
    )


def test_env_and_cwd_reach_the_process(tmp_path):
    workdir = tmp_path / "here"
    workdir.mkdir()
    code = "import os\nprint(os.environ['K'], os.environ['SLOTKEEPER_INSTANCE_ID'], os.getcwd())"
    handle = ProcessDriver(tmp_path).start(python(code, env={"K": "V"}, cwd=str(workdir)), 0.0)
    wait_until_ended(handle)
    assert handle.log_tail(1) == [f"V 7-1-0 {workdir}"]


@pytest.mark.parametrize(
    ("command", "cwd", "error"),
    [
        (["slotkeeper-no-such-command-xyz"], None, "No such file or directory"),
        ([sys.executable, "-c", "pass"], "/nonexistent/slotkeeper", "No such file or directory"),
        (["{tmp}/not-executable"], None, "Permission denied"),
    ],
)
def test_a_command_that_cannot_start_is_a_failed_start_with_the_os_error(tmp_path, command, cwd, error):
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    command = [part.format(tmp=tmp_path) for part in command]
    with pytest.raises(StartFailed, match=error) as failure:
        ProcessDriver(tmp_path).start(process(command, cwd=cwd), 0.0)
    assert str(failure.value).startswith("start failed: ")


def test_a_running_process_is_adopted_by_a_new_driver_after_an_agent_restart(tmp_path):
    first = ProcessDriver(tmp_path).start(python("import time\nprint('up', flush=True)\ntime.sleep(60)"), 0.0)
    try:
        adopted = ProcessDriver(tmp_path).adopt("7-1-0", 0, first.pid, first.pid_started_at)
        assert adopted is not None and adopted.pid == first.pid
        wait_for_log(adopted, "up")
        assert adopted.log_tail(1) == ["up"], "the log file outlives the agent that opened it"
        adopted.request_stop(time.monotonic(), grace_s=5)
        wait_until_ended(first)
        assert adopted.poll(time.monotonic()).status == "stopped"
    finally:
        first.request_stop(0.0, 0.0)
        first.poll(1.0)


def test_a_pid_with_a_different_start_time_is_not_adopted(tmp_path):
    handle = ProcessDriver(tmp_path).start(python("import time\ntime.sleep(60)"), 0.0)
    try:
        assert ProcessDriver(tmp_path).adopt("7-1-0", 0, handle.pid, handle.pid_started_at - 3600) is None
        assert ProcessDriver(tmp_path).adopt("7-1-0", 0, None, None) is None
    finally:
        handle.request_stop(0.0, 0.0)
        wait_until_ended(handle)


def test_the_log_tail_reads_only_the_last_lines_and_cuts_long_ones(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"{i}\n" for i in range(100_000)) + "y" * 1000 + "\n")
    assert read_tail(log, 2) == ["99999", "y" * 400]
    assert read_tail(tmp_path / "missing.log", 5) == []


def test_a_nul_byte_in_the_log_reaches_the_server_as_a_replacement_character(tmp_path):
    # The server refuses NUL in a heartbeat (400): left in, one binary write would fail every heartbeat of the node.
    log = tmp_path / "x.log"
    log.write_bytes(b"ok\nbinary\x00junk\n")
    assert read_tail(log, 2) == ["ok", "binary\ufffdjunk"]


def sim(crash_after_s: float | None = None) -> Assignment:
    return Assignment(
        "9-0-0", 0, "running", "sim", Spec(sim=SimSpec(crash_after_s=crash_after_s, exit_code=2))
    )


def test_a_sim_instance_runs_until_stopped():
    handle = SimDriver().start(sim(), now=100.0)
    assert handle.poll(100_000.0).status == "running"
    handle.request_stop(100_001.0, grace_s=10)
    assert handle.poll(100_001.0).status == "stopped"


def test_a_sim_instance_with_crash_after_s_exits_with_its_code_when_the_time_comes():
    handle = SimDriver().start(sim(crash_after_s=5), now=100.0)
    assert handle.poll(104.9).status == "running"
    observation = handle.poll(105.0)
    assert (observation.status, observation.exit_code) == ("exited", 2)
    assert handle.log_tail(5)[-1] == "sim: crashing after 5 s with exit code 2"
    assert SimDriver().adopt("9-0-0", 0, None, None) is None, (
        "a simulated instance does not outlive its agent"
    )
