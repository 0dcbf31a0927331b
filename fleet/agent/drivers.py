"""How an instance runs on this node: the driver interface, the `process` driver and the `sim` driver.

A driver starts an instance and hands back a handle; the agent polls handles with its own clock. Stopping is
asynchronous (SIGTERM now, SIGKILL once the grace has passed on a later poll) so that one instance ignoring
SIGTERM cannot freeze the heartbeat of the whole node for its grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from fleet.agent.assignments import Assignment, SimSpec

LOG_TAIL_BYTES = 64 * 1024
LOG_LINE_MAX_CHARS = 400


@dataclass(frozen=True)
class Observation:
    """What an instance is doing now, in the heartbeat's words."""

    status: str  # "running" | "exited" | "stopped" (an ended instance we asked to stop)
    exit_code: int | None = None
    detail: str = ""

    @property
    def ended(self) -> bool:
        return self.status != "running"


class StartFailed(Exception):
    """The instance could not be started; the message is the detail reported to the server."""


class Handle(Protocol):
    pid: int | None
    pid_started_at: float | None

    def poll(self, now: float) -> Observation: ...

    def request_stop(self, now: float, grace_s: float) -> None: ...

    def log_tail(self, lines: int) -> list[str]: ...


class Driver(Protocol):
    name: str

    def start(self, assignment: Assignment, now: float) -> Handle: ...

    def adopt(
        self, instance_id: str, generation: int, pid: int | None, pid_started_at: float | None
    ) -> Handle | None:
        """Re-attach to an instance started before the agent restarted, or None when it is gone."""
        ...


def instance_dir(work_dir: Path, instance_id: str) -> Path:
    return work_dir / "instances" / instance_id


def log_path(work_dir: Path, instance_id: str, generation: int) -> Path:
    return instance_dir(work_dir, instance_id) / f"g{generation}.log"


def read_tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a log, reading only the final 64 KiB so a chatty instance costs nothing."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            # NUL becomes U+FFFD like any undecodable byte: the server refuses NUL in a heartbeat (PostgreSQL cannot
            # store it), and one binary write to stdout would otherwise fail every heartbeat of the node.
            text = f.read().decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    except FileNotFoundError:
        return []
    return [line[:LOG_LINE_MAX_CHARS] for line in text.splitlines()[-lines:]] if lines > 0 else []


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown (the process ended while the agent was not its parent)"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class ProcessHandle:
    """A process started in its own session, so signals reach its whole process group and not the agent's."""

    def __init__(self, process: psutil.Process, popen: subprocess.Popen[bytes] | None, log: Path) -> None:
        self._process = process
        self._popen = (
            popen  # None for an adopted process: it is not our child any more, its exit code is lost
        )
        self._log = log
        self._kill_at: float | None = None
        self._killed = False
        self._killed_detail = ""
        self.pid: int | None = process.pid
        self.pid_started_at: float | None = process.create_time()

    def poll(self, now: float) -> Observation:
        code, ended = self._exit_status()
        if ended:
            status = "stopped" if self._kill_at is not None else "exited"
            return Observation(status, code, self._killed_detail if self._killed else describe_exit(code))
        if self._kill_at is not None and now >= self._kill_at and not self._killed:
            self._signal(signal.SIGKILL)
            self._killed = True
        return Observation("running")

    def request_stop(self, now: float, grace_s: float) -> None:
        if self._kill_at is not None:
            return
        self._kill_at = now + grace_s
        self._killed_detail = f"killed by SIGKILL: still running {grace_s:g} s after SIGTERM"
        self._signal(signal.SIGTERM)

    def log_tail(self, lines: int) -> list[str]:
        return read_tail(self._log, lines)

    def _exit_status(self) -> tuple[int | None, bool]:
        if self._popen is not None:
            code = self._popen.poll()
            return code, code is not None
        try:
            gone = self._process.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        return None, gone

    def _signal(self, sig: signal.Signals) -> None:
        # It may have ended between the poll and the signal; the next poll reports how.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)


class ProcessDriver:
    """Runs `spec.command` with `spec.env` over the agent's environment, logging to the work dir."""

    name = "process"

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir

    def start(self, assignment: Assignment, now: float) -> Handle:
        spec = assignment.spec
        log = log_path(self.work_dir, assignment.id, assignment.generation)
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **spec.env,
            "SLOTKEEPER_INSTANCE_ID": assignment.id,
            "SLOTKEEPER_GENERATION": str(assignment.generation),
        }
        try:
            with log.open("ab") as out:
                popen = subprocess.Popen(
                    list(spec.command),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=spec.cwd or log.parent,
                    env=env,
                    # Its own session: a Ctrl-C or SIGTERM aimed at the agent must not take the instances down
                    # with it (they outlive an agent restart and are re-adopted), and a stop can signal the
                    # instance's whole process group, so a shell wrapper cannot leave its children running.
                    start_new_session=True,
                )
        except OSError as exc:
            raise StartFailed(f"start failed: {exc}") from exc
        return ProcessHandle(psutil.Process(popen.pid), popen, log)

    def adopt(
        self, instance_id: str, generation: int, pid: int | None, pid_started_at: float | None
    ) -> Handle | None:
        if pid is None or pid_started_at is None:
            return None
        try:
            process = psutil.Process(pid)
            # A pid alone is not an identity: after a reboot or a long downtime the number may belong to an
            # unrelated process, which the agent would then report as ours and, on a stop, kill.
            if abs(process.create_time() - pid_started_at) > 1.0 or process.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        return ProcessHandle(process, None, log_path(self.work_dir, instance_id, generation))


class SimHandle:
    """Pretends to run: alive until stopped, or until `crash_after_s` when a demo wants a crash loop."""

    pid: int | None = None
    pid_started_at: float | None = None

    def __init__(self, sim: SimSpec, started_at: float) -> None:
        self._sim = sim
        self._started_at = started_at
        self._stopped_at: float | None = None
        self._lines = ["sim: started"]

    def poll(self, now: float) -> Observation:
        if self._stopped_at is not None:
            return Observation("stopped", 0, "exit code 0")
        crash = self._sim.crash_after_s
        if crash is not None and now - self._started_at >= crash:
            if len(self._lines) == 1:
                self._lines.append(f"sim: crashing after {crash:g} s with exit code {self._sim.exit_code}")
            return Observation("exited", self._sim.exit_code, f"exit code {self._sim.exit_code}")
        return Observation("running")

    def request_stop(self, now: float, grace_s: float) -> None:
        if self._stopped_at is None:
            self._stopped_at = now
            self._lines.append("sim: stopped on request")

    def log_tail(self, lines: int) -> list[str]:
        return self._lines[-lines:] if lines > 0 else []


class SimDriver:
    name = "sim"

    def start(self, assignment: Assignment, now: float) -> Handle:
        return SimHandle(assignment.spec.sim, now)

    def adopt(
        self, instance_id: str, generation: int, pid: int | None, pid_started_at: float | None
    ) -> Handle | None:
        # A simulated instance lives inside the agent's process: an agent restart ended it.
        return None
