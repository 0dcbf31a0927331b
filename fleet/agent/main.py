"""`slotkeeper-agent`: the command line, JSON-lines logging, and the in-process fleet of simulated agents.

Exit codes: 0 stopped by a signal (or `--once` succeeded), 1 `--once` could not reach the server, 2 bad flags
or missing identity, 3 the server refused this node (token revoked, another node's token, node deleted),
4 the state file is unreadable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import requests

from fleet.agent.agent import EXIT_REFUSED, Agent
from fleet.agent.client import (
    NodeRefused,
    RequestRejected,
    ServerClient,
    ServerUnavailable,
    Transport,
    register,
)
from fleet.agent.drivers import Driver, ProcessDriver, SimDriver
from fleet.agent.health import SimulatedHealth, host_size, read_host_health
from fleet.agent.state import StateStore, StateUnreadable

logger = logging.getLogger("slotkeeper.agent")

EXIT_UNREACHABLE = 1
EXIT_USAGE = 2
EXIT_STATE = 4
TOKEN_FILE = "node-token"
NODE_ID_FILE = "node-id"


class SimProfile(NamedTuple):
    name: str
    mem_total_mib: int
    cpu_cores: int
    disk_free_gib: float


# Sizes of the machines measured in seed 001 (memory MiB, free disk GiB), so the demo fleet looks like a real
# one and its placement numbers can be checked by hand against the placer's tests. Core counts are assumed.
SIM_PROFILES = (
    SimProfile("tank", 61440, 16, 869.0),
    SimProfile("architect", 61440, 16, 388.0),
    SimProfile("morpheus", 31757, 8, 312.0),
)


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: what log shippers on the nodes ingest without a parsing rule."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slotkeeper-agent", description="Slotkeeper node agent")
    parser.add_argument("--server", required=True, help="base URL, e.g. http://console:8000")
    parser.add_argument("--node-id", type=int, help=f"default: <work-dir>/{NODE_ID_FILE}")
    parser.add_argument(
        "--token", help="node token (prefer --token-file or SLOTKEEPER_TOKEN: argv is public)"
    )
    parser.add_argument("--token-file", type=Path, help=f"default: <work-dir>/{TOKEN_FILE}")
    parser.add_argument("--register", metavar="NAME", help="create this node on the server, save its token")
    parser.add_argument("--operator-token", help="for --register (or SLOTKEEPER_OPERATOR_TOKEN)")
    parser.add_argument("--capability", action="append", default=[], help="for --register; repeatable")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".local/state/slotkeeper-agent")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between heartbeats (default 5)")
    parser.add_argument("--once", action="store_true", help="one heartbeat + reconcile, then exit")
    parser.add_argument("--driver-default", choices=["process", "sim"], default="process")
    parser.add_argument("--log-tail-lines", type=int, default=20)
    return parser


def main(argv: Sequence[str] | None = None, transport: Transport | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    try:
        node_id, token = _identity(args, transport)
    except (ValueError, OSError) as exc:
        logger.error("bad-identity", extra={"fields": {"error": str(exc)}})
        return EXIT_USAGE
    except NodeRefused as exc:
        logger.error("node-refused", extra={"fields": {"error": str(exc)}})
        return EXIT_REFUSED
    except ServerUnavailable as exc:
        logger.error("server-unavailable", extra={"fields": {"error": str(exc)}})
        return EXIT_UNREACHABLE
    state = StateStore(args.work_dir)
    try:
        state.load()
    except StateUnreadable as exc:
        logger.error("state-unreadable", extra={"fields": {"error": str(exc)}})
        return EXIT_STATE
    agent = Agent(
        ServerClient(args.server, node_id, token, transport),
        {"process": ProcessDriver(args.work_dir), "sim": SimDriver()},
        state,
        lambda: read_host_health(args.work_dir),
        args.work_dir,
        default_driver=args.driver_default,
        log_tail_lines=args.log_tail_lines,
    )
    agent.recover()
    return _run_once(agent) if args.once else _run_forever(agent, args.interval)


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to sys.stderr as it is now: main() called again in one process (tests, embedding) must not write
    to a stream an earlier caller swapped in and has since closed."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _configure_logging() -> None:
    if any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        return
    handler = _CurrentStderr()
    handler.setFormatter(JsonLineFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _identity(args: argparse.Namespace, transport: Transport | None) -> tuple[int, str]:
    if args.register:
        return _register(args, transport)
    node_id = (
        args.node_id if args.node_id is not None else _read_saved(args.work_dir / NODE_ID_FILE, "--node-id")
    )
    token = args.token or os.environ.get("SLOTKEEPER_TOKEN")
    if not token:
        token = _read_saved(args.token_file or args.work_dir / TOKEN_FILE, "--token-file")
    return int(node_id), token


def _read_saved(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist: pass {flag}, or --register a new node") from None


def _register(args: argparse.Namespace, transport: Transport | None) -> tuple[int, str]:
    token_path = args.work_dir / TOKEN_FILE
    if token_path.exists():
        # A second registration from the same work dir makes a second node for the same machine; the first
        # would go offline, and the placer would count this machine's capacity twice until someone noticed.
        raise ValueError(
            f"{token_path} exists: this work dir is already registered; remove it to register again"
        )
    operator_token = args.operator_token or os.environ.get("SLOTKEEPER_OPERATOR_TOKEN")
    if not operator_token:
        raise ValueError("--register needs --operator-token (or SLOTKEEPER_OPERATOR_TOKEN)")
    fields = {"name": args.register, **host_size(args.work_dir), "capabilities": args.capability}
    done = register(transport or requests.Session(), args.server, operator_token, fields)
    (args.work_dir / NODE_ID_FILE).write_text(f"{done.id}\n", encoding="utf-8")
    _write_private(token_path, done.token + "\n")
    print(json.dumps({"id": done.id, "name": done.name, "token": done.token, "token_file": str(token_path)}))
    return done.id, done.token


def _write_private(path: Path, text: str) -> None:
    """Created 0600 from the start: a token briefly world-readable is one any local user may have copied."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _run_once(agent: Agent) -> int:
    try:
        agent.step()
    except NodeRefused as exc:
        logger.error("node-refused", extra={"fields": {"error": str(exc)}})
        return EXIT_REFUSED
    except ServerUnavailable as exc:
        logger.error("server-unavailable", extra={"fields": {"error": str(exc)}})
        return EXIT_UNREACHABLE
    except RequestRejected as exc:
        logger.error("request-rejected", extra={"fields": {"error": str(exc)}})
        return EXIT_UNREACHABLE
    return 0


def _run_forever(agent: Agent, interval: float) -> int:
    stop = threading.Event()
    # Stopping the agent leaves `process` instances running (they are in their own session) so an agent
    # upgrade or restart does not restart the fleet's workloads; the next agent re-adopts them.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logger.info("agent-started", extra={"fields": {"node": agent.client.node_id, "interval_s": interval}})
    return agent.run(stop, interval)


def run_simulated_agents(
    server: str,
    nodes: Sequence[tuple[int, str]],
    stop_event: threading.Event,
    interval: float = 5.0,
    work_root: Path | None = None,
    transport_factory: Callable[[], Transport] = requests.Session,
    sizes: Mapping[int, SimProfile] | None = None,
) -> list[threading.Thread]:
    """Start one sim-driver agent per (node id, token) in daemon threads; they stop when `stop_event` is set.

    For `make run`: a demo fleet in the web process. Only the sim driver is enabled, so a `process` assignment
    is reported as failed instead of running real commands on the console's host. `sizes`: each node's size as
    it was registered, which its simulated machine then reports (a machine reporting another size than it
    declared makes the placer and the scheduler disagree about it); nodes without one take a measured profile.
    """
    root = work_root or Path(tempfile.mkdtemp(prefix="slotkeeper-sim-"))
    threads = []
    for node_id, token in nodes:
        profile = (sizes or {}).get(node_id) or SIM_PROFILES[node_id % len(SIM_PROFILES)]
        agent = _simulated_agent(
            server, node_id, token, root / f"node-{node_id}", transport_factory(), profile
        )
        thread = threading.Thread(
            target=_run_staggered,
            args=(agent, stop_event, interval),
            name=f"sim-agent-{node_id}",
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    return threads


def _simulated_agent(
    server: str, node_id: int, token: str, work_dir: Path, transport: Transport, profile: SimProfile
) -> Agent:
    work_dir.mkdir(parents=True, exist_ok=True)
    health = SimulatedHealth(profile.mem_total_mib, profile.cpu_cores, profile.disk_free_gib, seed=node_id)
    state = StateStore(work_dir)
    state.load()
    drivers: dict[str, Driver] = {"sim": SimDriver()}
    client = ServerClient(server, node_id, token, transport)
    agent = Agent(client, drivers, state, health, work_dir, default_driver="sim")
    health.claims = agent.running_claims
    agent.recover()
    return agent


def _run_staggered(agent: Agent, stop_event: threading.Event, interval: float) -> None:
    # Agents started together would otherwise heartbeat in the same instant forever, which hides the load
    # pattern a real fleet has and makes the console's "updated N s ago" identical on every row.
    if stop_event.wait(random.uniform(0, interval)):
        return
    agent.run(stop_event, interval)
