"""The agent's memory across its own restarts: which (instance, generation) it started, and how each ended.

One small JSON file in the work dir, rewritten atomically (temp file, fsync, os.replace) so that a crash or a
power cut mid-write leaves either the old file or the new one, never half of each. The rule it exists for: an
(instance, generation) is started at most once on this node. A started one that is no longer running is
reported as ended, not started again; only a NEW generation from the server starts it again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

STATE_FILE = "agent-state.json"
STATE_VERSION = 1
# Records of instances the server stopped listing are kept, so a server that briefly forgets an assignment and
# then lists it again cannot get it started twice; this bound only keeps the file small on a long-lived node.
MAX_RECORDS = 2000


class StateUnreadable(Exception):
    """The state file exists but cannot be trusted; starting anything could run an instance twice."""


@dataclass(frozen=True)
class StartRecord:
    instance_id: str
    generation: int
    driver: str
    started_at: float  # wall clock, for operators reading the file
    pid: int | None = None
    pid_started_at: float | None = None
    status: str | None = None  # None while it may be running; "exited" / "stopped" / "failed" once it ended
    exit_code: int | None = None
    detail: str = ""


class StateStore:
    def __init__(self, work_dir: Path) -> None:
        self.path = work_dir / STATE_FILE
        self._records: dict[str, StartRecord] = {}

    def load(self) -> None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise StateUnreadable(self._unreadable(exc)) from exc
        try:
            if raw.get("version") != STATE_VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {STATE_VERSION}")
            self._records = {r["instance_id"]: StartRecord(**r) for r in raw["started"]}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise StateUnreadable(self._unreadable(exc)) from exc

    def _unreadable(self, exc: Exception) -> str:
        return (
            f"state file {self.path} is unreadable ({exc}); refusing to start instances that may already "
            "run. Move it aside once you have checked nothing from this node is still running."
        )

    def get(self, instance_id: str) -> StartRecord | None:
        return self._records.get(instance_id)

    def records(self) -> list[StartRecord]:
        return list(self._records.values())

    def may_start(self, instance_id: str, generation: int) -> bool:
        """True only for a generation newer than any this node has started for the instance."""
        record = self._records.get(instance_id)
        return record is None or generation > record.generation

    def record_start(self, record: StartRecord) -> None:
        self._records[record.instance_id] = record
        self._prune()
        self.save()

    def update(self, instance_id: str, **changes: Any) -> None:
        record = self._records.get(instance_id)
        if record is not None:
            self._records[instance_id] = replace(record, **changes)
            self.save()

    def save(self) -> None:
        body = {"version": STATE_VERSION, "started": [asdict(r) for r in self._records.values()]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(body, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _prune(self) -> None:
        if len(self._records) <= MAX_RECORDS:
            return
        ended = sorted(
            (r for r in self._records.values() if r.status is not None), key=lambda r: r.started_at
        )
        for record in ended[: len(self._records) - MAX_RECORDS]:
            del self._records[record.instance_id]
