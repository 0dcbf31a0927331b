"""The demo's integration (`make run`): leases submitted through the real API at a pace that follows the fleet, and an
operator's day now and then (a node lost and recovered, a node drained and back), so that a newcomer watching the
console for an hour sees a scheduler at work (placements, preemptions, recoveries, drains) rather than a jam.

The load aims at a committed share of the fleet's cores between LOW and HIGH: below, more leases; above, none but
the odd advance reservation; and never more best-effort leases than MAX_QUEUE waiting. `load_step` decides, from
what the API says, and is tested without a server (tests/test_demo_load.py); `run` does the HTTP.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

log = logging.getLogger(__name__)
# What every fault the demo injects says first, so its own outcomes can be told from real ones (management/demo.py).
DEMO_REASON = "demo:"

LOW, HIGH = 0.70, 0.85
MAX_QUEUE = 6
EVERY_S = 8.0
# An operator's day: a node lost every LOSS_EVERY_S (its proposals approved APPROVE_AFTER_S later, the node
# re-admitted READMIT_AFTER_S later), and a node drained with a deadline every DRAIN_EVERY_S, undrained after.
FIRST_LOSS_S, LOSS_EVERY_S, APPROVE_AFTER_S, READMIT_AFTER_S = 8 * 60, 20 * 60, 60, 4 * 60
FIRST_DRAIN_S, DRAIN_EVERY_S, DRAIN_DEADLINE_S, UNDRAIN_AFTER_S = 14 * 60, 20 * 60, 3 * 60, 5 * 60
# The nodes the day happens to: common shapes, not the measured machines or the only accelerators.
CHAOS_NODES = ("batch-01", "batch-02", "batch-03", "small-01", "small-02")


@dataclass(frozen=True)
class Look:
    """What the API says of the fleet at one moment: committed and allocatable cores over the live nodes, and how
    many best-effort leases wait in the queue."""

    committed_cores: float
    allocatable_cores: float
    queued: int

    @property
    def share(self) -> float:
        return self.committed_cores / self.allocatable_cores if self.allocatable_cores else 1.0


def load_step(look: Look, rng: random.Random, n: int) -> list[dict[str, Any]]:
    """The lease bodies to submit now: up to two below LOW, one in two between LOW and HIGH, none above but an
    advance reservation now and then (which preempts best-effort work: the demo should show that too); an
    immediate lease only where it is likely to fit; no best-effort lease while MAX_QUEUE wait."""
    share = look.share
    if share < LOW:
        count = 2
    elif share < HIGH:
        count = 1 if rng.random() < 0.5 else 0
    else:
        count = 0
    bodies = []
    for i in range(count):
        kind = rng.choices(
            ["best_effort", "advance_reservation", "immediate"], [6, 2, 2 if share < 0.75 else 0]
        )[0]
        if kind == "best_effort" and look.queued >= MAX_QUEUE:
            continue
        bodies.append(_body(rng, f"demo-{n}-{i}", kind))
    if share >= HIGH and rng.random() < 0.05:
        bodies.append(_body(rng, f"demo-{n}-ar", "advance_reservation"))
    return bodies


def _body(rng: random.Random, name: str, kind: str) -> dict[str, Any]:
    duration = rng.choice([120, 300, 600, 900])
    body: dict[str, Any] = {
        "name": name,
        "type": kind,
        "duration_s": duration,
        "nodes": [
            {"cpu_cores": rng.choice([1, 2, 4]), "mem_mib": rng.choice([2048, 4096, 8192]), "disk_gib": 5}
        ]
        * rng.randint(1, 3),
        "real_duration_s": duration * rng.uniform(0.5, 1.0) if rng.random() < 0.3 else None,
    }
    if kind == "advance_reservation":
        start = datetime.now(UTC) + timedelta(minutes=rng.randint(3, 30))
        body["start"] = start.replace(second=0, microsecond=0).isoformat()
    return body


@dataclass
class Day:
    """The operator's day, as times (seconds since the demo started) at which each step is due."""

    started: float
    next_loss: float = 0.0
    next_drain: float = 0.0
    pending: list[tuple[float, str, int]] = field(default_factory=list)  # (due, what, node id)

    def __post_init__(self) -> None:
        self.next_loss = self.started + FIRST_LOSS_S
        self.next_drain = self.started + FIRST_DRAIN_S

    def due(self, now: float) -> list[tuple[str, int | None]]:
        """What to do now: ("lose", None) / ("drain", None) when one is due, then the follow-ups whose time came."""
        out: list[tuple[str, int | None]] = []
        if now >= self.next_loss:
            self.next_loss = now + LOSS_EVERY_S
            out.append(("lose", None))
        if now >= self.next_drain:
            self.next_drain = now + DRAIN_EVERY_S
            out.append(("drain", None))
        ready = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        out.extend((what, node) for _, what, node in ready)
        return out

    def after_loss(self, now: float, node: int) -> None:
        self.pending += [(now + APPROVE_AFTER_S, "approve", node), (now + READMIT_AFTER_S, "readmit", node)]

    def after_drain(self, now: float, node: int) -> None:
        self.pending.append((now + UNDRAIN_AFTER_S, "undrain", node))


def run(server: str, operator_token: str, admin_token: str, stop: threading.Event) -> None:
    """Submits leases as `load_step` says and lives the operator's day until `stop` is set."""
    import time

    import requests

    operator, admin = requests.Session(), requests.Session()
    operator.headers["Authorization"] = f"Bearer {operator_token}"
    admin.headers["Authorization"] = f"Bearer {admin_token}"
    rng = random.Random()
    day = Day(time.monotonic())
    n = 0
    while not stop.is_set():
        n += 1
        # The server may be shutting down, or answer slowly under the demo's own load: the loop goes on.
        with contextlib.suppress(requests.RequestException, ValueError, KeyError):
            look = _look(server, operator)
            for body in load_step(look, rng, n):
                operator.post(f"{server}/api/leases/", json=body, timeout=10)
            for what, node in day.due(time.monotonic()):
                _operator_step(server, operator, admin, day, what, node, rng)
        stop.wait(EVERY_S)


def _look(server: str, session) -> Look:
    nodes = session.get(f"{server}/api/nodes/?limit=1000", timeout=10).json()["results"]
    live = [n for n in nodes if n["status"] in ("online", "draining")]
    committed = sum(n["committed"]["cpu_cores"] for n in live)
    allocatable = sum(n["allocatable"]["cpu_cores"] for n in live)
    queued = session.get(f"{server}/api/leases/?state=queued&limit=1", timeout=10).json()["count"]
    return Look(committed, allocatable, queued)


def _operator_step(server: str, operator, admin, day: Day, what: str, node: int | None, rng) -> None:
    import time

    now = time.monotonic()
    if what in ("lose", "drain"):
        nodes = operator.get(f"{server}/api/nodes/?limit=1000", timeout=10).json()["results"]
        online = [n for n in nodes if n["name"] in CHAOS_NODES and n["status"] == "online"]
        if not online:
            return
        pick = rng.choice(online)
        if what == "lose":
            reason = f"{DEMO_REASON} power supply failed (the demo re-admits it in a few minutes)"
            admin.post(f"{server}/api/nodes/{pick['id']}/declare-dead", json={"reason": reason}, timeout=10)
            day.after_loss(now, pick["id"])
            log.info("demo: node declared dead", extra={"node": pick["name"]})
        else:
            deadline = (datetime.now(UTC) + timedelta(seconds=DRAIN_DEADLINE_S)).isoformat()
            body = {"reason": "demo: kernel upgrade", "deadline": deadline, "max_parallel": 2}
            operator.post(f"{server}/api/nodes/{pick['id']}/drain", json=body, timeout=10)
            day.after_drain(now, pick["id"])
            log.info("demo: node draining", extra={"node": pick["name"]})
    elif what == "approve":
        pending = operator.get(f"{server}/api/reschedules/?status=pending&limit=1000", timeout=10).json()
        ids = [p["id"] for p in pending["results"] if p["proposed_node"]]
        if ids:
            operator.post(f"{server}/api/reschedules/approve", json={"ids": ids}, timeout=30)
    elif what == "readmit" and node is not None:
        admin.post(
            f"{server}/api/nodes/{node}/readmit", json={"reason": "demo: power supply replaced"}, timeout=10
        )
    elif what == "undrain" and node is not None:
        operator.post(f"{server}/api/nodes/{node}/undrain", json={"reason": "demo: upgrade done"}, timeout=10)
