"""The reconcile loop: make what runs on this node match what the server assigns, and report how it went.

One step = poll local instances, fetch assignments, start / stop to close the gap, heartbeat with health and
every instance's status. The clock is injected and the server is reached through `ServerClient` (whose
transport tests replace), so tests drive the agent one step at a time.

The agent never restarts an instance by itself: a crash is reported as `exited` with its exit code, and the
server's restart policy answers with a new generation. Two restart policies (agent and server) would fight
over the same budget and double-count restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.agent.assignments import DEFAULT_STOP_GRACE_S, Assignment, AssignmentBatch, anti_affinity_refusal
from fleet.agent.client import (
    Backoff,
    NodeFenced,
    NodeRefused,
    RequestRejected,
    ServerClient,
    ServerUnavailable,
)
from fleet.agent.drivers import Driver, Handle, Observation, log_path, read_tail
from fleet.agent.health import Health
from fleet.agent.state import StartRecord, StateStore

logger = logging.getLogger("slotkeeper.agent")
RUNNING = Observation("running")

EXIT_REFUSED = 3  # the server refused this node (401/403/404): retrying cannot help


@dataclass
class Entry:
    """One instance generation this agent process has a handle on."""

    instance_id: str
    generation: int
    handle: Handle
    started_at: float
    assignment: Assignment | None  # None for an instance adopted after a restart, until the server lists it
    last: Observation = RUNNING
    stop_reason: str | None = None

    @property
    def live(self) -> bool:
        return not self.last.ended

    @property
    def stopping(self) -> bool:
        return self.live and self.stop_reason is not None


class Agent:
    def __init__(
        self,
        client: ServerClient,
        drivers: Mapping[str, Driver],
        state: StateStore,
        health_source: Callable[[], Health],
        work_dir: Path,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        default_driver: str = "process",
        log_tail_lines: int = 20,
    ) -> None:
        self.client = client
        self.drivers = drivers
        self.state = state
        self.health_source = health_source
        self.work_dir = work_dir
        self.clock = clock
        self.wall_clock = wall_clock
        self.default_driver = default_driver
        self.log_tail_lines = log_tail_lines
        self.entries: dict[str, Entry] = {}
        self.server_status: str | None = None
        self._waiting: dict[str, str] = {}
        self._last_batch = AssignmentBatch((), ())

    # -- lifecycle -------------------------------------------------------------------------------------------

    def recover(self) -> None:
        """After an agent restart: re-adopt what still runs; mark what does not as lost (never restart it)."""
        now = self.clock()
        for record in self.state.records():
            if record.status is not None:
                continue
            driver = self.drivers.get(record.driver)
            handle = (
                driver.adopt(record.instance_id, record.generation, record.pid, record.pid_started_at)
                if driver
                else None
            )
            if handle is None:
                detail = "lost: it ended while the agent was not running; not started again"
                self.state.update(record.instance_id, status="exited", exit_code=None, detail=detail)
                self._log(
                    logging.WARNING,
                    "instance-lost",
                    instance=record.instance_id,
                    generation=record.generation,
                )
                continue
            self.entries[record.instance_id] = Entry(record.instance_id, record.generation, handle, now, None)
            self._log(logging.INFO, "instance-adopted", instance=record.instance_id, pid=record.pid)

    def step(self) -> None:
        """One heartbeat and reconcile. Raises the client's errors; `run` decides what they mean."""
        now = self.clock()
        self.poll_local(now)
        self.sync(now)

    def run(self, stop_event: threading.Event, interval: float, backoff: Backoff | None = None) -> int:
        """Loop until `stop_event` is set (exit 0) or the server refuses this node (EXIT_REFUSED)."""
        backoff = backoff or Backoff(cap_s=max(60.0, interval))
        next_sync = self.clock()
        while not stop_event.is_set():
            now = self.clock()
            self.poll_local(now)
            if now >= next_sync:
                delay = self._sync_or_delay(now, interval, backoff)
                if delay is None:
                    return EXIT_REFUSED
                next_sync = now + delay
            wait = next_sync - self.clock()
            if any(e.stopping for e in self.entries.values()):
                # A pending SIGKILL escalation must not wait for a long backoff while the server is away.
                wait = min(wait, 0.25)
            stop_event.wait(max(0.0, wait))
        return 0

    def _sync_or_delay(self, now: float, interval: float, backoff: Backoff) -> float | None:
        """Seconds until the next sync, or None when the server refused this node for good."""
        try:
            self.sync(now)
        except NodeRefused as exc:
            self._log(logging.ERROR, "node-refused", error=str(exc))
            return None
        except NodeFenced as exc:
            # Declared dead: whatever runs here may already run elsewhere, so nothing may go on running.
            if self.server_status != "fenced":
                self._log(logging.ERROR, "node-fenced", error=str(exc))
            self.server_status = "fenced"
            self.fence(now)
            return interval
        except ServerUnavailable as exc:
            delay = backoff.next_delay()
            self._log(logging.WARNING, "server-unavailable", error=str(exc), retry_in_s=round(delay, 2))
            return delay
        except RequestRejected as exc:
            self._log(logging.ERROR, "request-rejected", error=str(exc))
        except Exception as exc:
            # A bug in one step must not kill the agent: its instances keep running, the next step may pass.
            self._log(logging.ERROR, "step-crashed", error=repr(exc))
            return backoff.next_delay()
        backoff.reset()
        return interval

    # -- one step --------------------------------------------------------------------------------------------

    def poll_local(self, now: float) -> None:
        for entry in self.entries.values():
            if not entry.live:
                continue
            entry.last = entry.handle.poll(now)
            if entry.last.ended:
                self.state.update(
                    entry.instance_id,
                    status=entry.last.status,
                    exit_code=entry.last.exit_code,
                    detail=entry.last.detail,
                )
                self._log(
                    logging.INFO,
                    "instance-ended",
                    instance=entry.instance_id,
                    status=entry.last.status,
                    exit_code=entry.last.exit_code,
                )

    def sync(self, now: float) -> None:
        batch = self.client.assignments(self.default_driver)
        self.reconcile(batch, now)
        reply = self.client.heartbeat(self.heartbeat_payload())
        if reply.status != self.server_status:
            self._log(logging.INFO, "node-status", status=reply.status)
        self.server_status = reply.status

    def fence(self, now: float) -> None:
        """Stops every instance this agent runs (the server has fenced the node); starts nothing."""
        for entry in self.entries.values():
            if entry.live:
                self._stop(entry, now, "node fenced: declared dead by an operator")

    def reconcile(self, batch: AssignmentBatch, now: float) -> None:
        self._last_batch = batch
        self._waiting = {}
        assigned = {a.id: a for a in batch.valid}
        # A malformed assignment says nothing reliable about intent, so an instance it names keeps running: a
        # server bug that garbles one field must not take down a healthy workload.
        unreadable = {r.instance_id for r in batch.rejected}
        for rejected in batch.rejected:
            self._log(
                logging.WARNING, "assignment-rejected", instance=rejected.instance_id, detail=rejected.detail
            )
        for instance_id, entry in list(self.entries.items()):
            if instance_id in unreadable:
                continue
            if instance_id not in assigned:
                if entry.live:
                    self._stop(entry, now, "no longer assigned to this node")
                else:
                    del self.entries[instance_id]
            elif entry.assignment is None and entry.generation == assigned[instance_id].generation:
                entry.assignment = assigned[instance_id]
        for assignment in batch.valid:
            self._reconcile_one(assignment, now)

    def _reconcile_one(self, assignment: Assignment, now: float) -> None:
        entry = self.entries.get(assignment.id)
        live = entry is not None and entry.live
        if assignment.desired_state == "stopped":
            if entry is not None and live:
                self._stop(entry, now, "desired_state is stopped")
            return
        if entry is not None and live:
            if entry.generation < assignment.generation:
                self._stop(entry, now, f"replaced by generation {assignment.generation}")
                self._waiting[assignment.id] = f"waiting for generation {entry.generation} to stop"
            return
        if self.state.may_start(assignment.id, assignment.generation):
            self._try_start(assignment, now)

    def _try_start(self, assignment: Assignment, now: float) -> None:
        refusal = anti_affinity_refusal(assignment, self._group_members(include_stopping=False))
        if refusal is not None:
            self._record_failure(assignment, refusal)
            return
        if anti_affinity_refusal(assignment, self._group_members(include_stopping=True)) is not None:
            # The member in the way is already being stopped (a move off this node): wait for it rather than
            # fail a start that will be legal within its grace period.
            self._waiting[assignment.id] = "waiting for a group member on this node to stop"
            return
        driver = self.drivers.get(assignment.driver)
        if driver is None:
            self._record_failure(assignment, f"driver {assignment.driver!r} is not enabled on this agent")
            return
        # Recorded BEFORE the start: if the agent dies between the two, the instance is reported lost instead
        # of being started a second time. At most once is the promise; a lost start the server can re-issue.
        self.state.record_start(
            StartRecord(assignment.id, assignment.generation, assignment.driver, self.wall_clock())
        )
        try:
            handle = driver.start(assignment, now)
        except Exception as exc:
            # Any start failure (StartFailed, or a driver bug) is this instance's failure, not the agent's.
            self.state.update(assignment.id, status="failed", detail=str(exc))
            self._log(logging.WARNING, "start-failed", instance=assignment.id, detail=str(exc))
            return
        self.state.update(assignment.id, pid=handle.pid, pid_started_at=handle.pid_started_at)
        self.entries[assignment.id] = Entry(assignment.id, assignment.generation, handle, now, assignment)
        self._log(
            logging.INFO,
            "instance-started",
            instance=assignment.id,
            generation=assignment.generation,
            driver=assignment.driver,
            pid=handle.pid,
        )

    def _record_failure(self, assignment: Assignment, detail: str) -> None:
        # Recorded as this generation's outcome, so the refusal is final and the server decides what comes
        # next; an agent that retried on its own could start it just as the server placed it elsewhere.
        record = StartRecord(
            assignment.id,
            assignment.generation,
            assignment.driver,
            self.wall_clock(),
            status="failed",
            detail=detail,
        )
        self.state.record_start(record)
        self._log(logging.WARNING, "start-refused", instance=assignment.id, detail=detail)

    def _group_members(self, include_stopping: bool) -> dict[str, set[str]]:
        members: dict[str, set[str]] = {}
        for entry in self.entries.values():
            if not entry.live or entry.assignment is None or (entry.stopping and not include_stopping):
                continue
            for group in entry.assignment.groups:
                members.setdefault(group.name, set()).add(entry.instance_id)
        return members

    def _stop(self, entry: Entry, now: float, reason: str) -> None:
        if entry.stop_reason is not None:
            return
        entry.stop_reason = reason
        grace = entry.assignment.spec.stop_grace_s if entry.assignment else DEFAULT_STOP_GRACE_S
        entry.handle.request_stop(now, grace)
        self._log(logging.INFO, "instance-stopping", instance=entry.instance_id, reason=reason, grace_s=grace)

    # -- reporting -------------------------------------------------------------------------------------------

    def heartbeat_payload(self) -> dict[str, Any]:
        health: Health = self.health_source()
        reports: dict[str, dict[str, Any]] = {}
        for assignment in self._last_batch.valid:
            reports[assignment.id] = self._report(assignment.id, assignment)
        for rejected in self._last_batch.rejected:
            if rejected.instance_id is None:
                continue
            entry = self.entries.get(rejected.instance_id)
            if entry is not None and entry.live:
                line = self._report(rejected.instance_id, None)
                reports[rejected.instance_id] = {
                    **line,
                    "detail": f"{line['detail']}; {rejected.detail}".lstrip("; "),
                }
            else:
                reports[rejected.instance_id] = _line(
                    rejected.instance_id, "failed", None, [], rejected.detail
                )
        for instance_id, entry in self.entries.items():
            if entry.live and instance_id not in reports:
                reports[instance_id] = self._report(instance_id, None)
        return {**health.as_payload(), "instances": list(reports.values())}

    def _report(self, instance_id: str, assignment: Assignment | None) -> dict[str, Any]:
        entry = self.entries.get(instance_id)
        wanted = assignment.generation if assignment else None
        if instance_id in self._waiting:
            return _line(instance_id, "starting", wanted, [], self._waiting[instance_id])
        if entry is not None and wanted in (None, entry.generation):
            detail = entry.last.detail
            if entry.stopping:
                detail = f"stopping: {entry.stop_reason}"
            return _line(
                instance_id,
                entry.last.status,
                entry.generation,
                entry.handle.log_tail(self.log_tail_lines),
                detail,
                entry.last.exit_code,
            )
        record = self.state.get(instance_id)
        if record is not None and record.generation == wanted and record.status is not None:
            tail = read_tail(log_path(self.work_dir, instance_id, record.generation), self.log_tail_lines)
            return _line(instance_id, record.status, record.generation, tail, record.detail, record.exit_code)
        if assignment is not None and assignment.desired_state == "stopped":
            return _line(instance_id, "stopped", wanted, [], "not running (desired_state is stopped)")
        return _line(instance_id, "starting", wanted, [], "not started yet")

    def running_claims(self) -> list[tuple[float, float]]:
        """(mem_mib, age_s) of each live instance: what simulated health charges for."""
        now = self.clock()
        return [
            (float(e.assignment.resources.get("mem_mib", 0)) if e.assignment else 0.0, now - e.started_at)
            for e in self.entries.values()
            if e.live
        ]

    def _log(self, level: int, event: str, **fields: Any) -> None:
        logger.log(level, event, extra={"fields": {"node": self.client.node_id, **fields}})


def _line(
    instance_id: str,
    status: str,
    generation: int | None,
    log_tail: list[str],
    detail: str,
    exit_code: int | None = None,
) -> dict[str, Any]:
    return {
        "id": instance_id,
        "generation": generation,
        "status": status,
        "exit_code": exit_code,
        "log_tail": log_tail,
        "detail": detail,
    }
