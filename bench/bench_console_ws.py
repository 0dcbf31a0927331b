"""Benchmark the console's live updates: commit-to-browser latency with 100 websocket clients at 1,000 changes/s.

Target (issue 5): p99 <= 100 ms from a change to every open console, with 100 consoles and 1,000 changes a
second, and far fewer messages than changes per console (the consumer coalesces for 50 ms, so a burst is a few
batches rather than a storm).

The distributed shape, started by the run: a redis-server on a free loopback port (the channel layer), two Daphne
processes with REDIS_URL and SECRET_KEY on a fresh PostgreSQL database (`slotkeeper_bench_ws`: its own, so the
other Django benchmarks' database is left alone), and 100 websocket clients in one asyncio loop in this process,
spread over the Daphne processes, each with its own session of a viewer user (made with the test client's
`force_login`: the cookie a browser would hold after signing in, without 100 password hashes). A producer process
(this script with --produce) makes the changes, paced to the rate, in batches of 1..20 changes (mean 10.5):

- group_send (baseline): each batch as one `group_send` on the channel layer from one event loop. No database,
  no transaction, no `async_to_sync`: what Redis, Daphne and the consumer cost on their own.
- commits: each batch as one transaction that UPDATEs the changed nodes and calls `send_on_commit` per change,
  as `actions.py` does; the events leave as one `group_send` after the commit.
- ping/pong (baseline): a client's "ping" answered "pong" by the consumer, one at a time over all clients with
  nothing else running, then every 50 ms during each phase (how long the Daphne event loops take to answer).

Every event carries a sequence number and the wall-clock time it was made ("t", before its commit). For each
batch it receives, a client records the receive time minus the earliest "t" in it (the change that waited
longest), counts the message and notes each sequence number, so an event lost is one sent and never seen. A
phase ends when no console has received anything for 1 s (at most 30 s after the producer stops), so an event
that is only late counts as late, not lost.

The whole run is repeated for each variant: the project as it is, then a change applied by a module the run
writes to /tmp (the project's files are not touched): the channels_redis pub/sub layer (no per-message expiry:
the project's core layer discards a group message still queued for its process after `expiry`, 10 s, and the
pub/sub layer queues without bound instead), and a ConsoleConsumer whose `dispatch` skips Channels'
per-message `close_old_connections` thread hop for console events (about 0.2 ms of CPU per message per
consumer), both, and a per-process fan-out hub (one group member per Daphne process that coalesces and
serialises once and writes the same text to each of its consoles: the suggested fix).

    .venv/bin/python bench/bench_console_ws.py [--quick] [--clients 100] [--rate 1000] [--seconds 10]
                                               [--variants project,pubsub,nohop,both,hub]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_heartbeats import ROOT, bench_env, free_port, fresh_postgres, pct, start_django, stop

TARGET_P99_MS = 100.0
BENCH_DB = "slotkeeper_bench_ws"
MAX_BATCH = 20
PHASE = 10_000_000  # sequence numbers of phase k start at k * PHASE, so a late event is never counted twice
NODES = 1000
DAPHNE_LOG = Path("/tmp/slotkeeper_bench_console_ws_daphne.log")
VIEWER = "bench-viewer"
SEED = 7  # the batch sizes, the same in every phase and variant


# --- the producer (a process of its own: its CPU must not be taken from the clients' loop) --------------------


def batches(rate: float, seconds: float, first: int, seed: int) -> Iterator[tuple[float, range]]:
    """(due offset in s, sequence numbers) for each batch, so both producers send the same shape."""
    rng, seq, end = random.Random(seed), first, first + int(rate * seconds)
    while seq < end:
        size = min(rng.randint(1, MAX_BATCH), end - seq)
        yield (seq - first) / rate, range(seq, seq + size)
        seq += size


@dataclass
class Produced:
    sent: int = 0
    batches: int = 0
    elapsed: float = 0.0
    cpu: float = 0.0
    late_max: float = 0.0  # how far behind its schedule the producer fell, s
    broadcasts: list[float] = field(default_factory=list)  # s, each after-commit group_send (commits only)

    def pace(self, started: float, due: float) -> float:
        """Seconds to sleep before the batch due at `due`; records how late it is when there is none."""
        wait = started + due - time.perf_counter()
        self.late_max = max(self.late_max, -wait)
        return wait


def event(seq: int, nodes: list[int]) -> dict:
    return {"event": "node-changed", "node": nodes[seq % len(nodes)], "seq": seq, "t": time.time()}


def produce_commits(rate: float, seconds: float, first: int) -> Produced:
    from django.db import transaction
    from django.db.models import F

    from fleet.models import Node
    from slotkeeper import events
    from slotkeeper.events import send_on_commit

    out = Produced()
    send_batch = events.send_batch

    def timed_send_batch(batch: list[dict]) -> None:
        # Measurement only: the flush after commit looks send_batch up in its module, so this times every
        # broadcast the commits make without changing what they send.
        t = time.perf_counter()
        send_batch(batch)
        out.broadcasts.append(time.perf_counter() - t)

    events.send_batch = timed_send_batch
    nodes = list(Node.objects.order_by("id").values_list("id", flat=True))
    started = time.perf_counter()
    for due, seqs in batches(rate, seconds, first, SEED):
        if (wait := out.pace(started, due)) > 0:
            time.sleep(wait)
        with transaction.atomic():
            ids = [nodes[s % len(nodes)] for s in seqs]
            Node.objects.filter(id__in=ids).update(obs_load1=F("obs_load1") + 0.01)
            for s in seqs:
                send_on_commit(**event(s, nodes))
        out.sent, out.batches = out.sent + len(seqs), out.batches + 1
    out.elapsed = time.perf_counter() - started
    return out


async def produce_direct(rate: float, seconds: float, first: int) -> Produced:
    from channels.layers import get_channel_layer

    from fleet.models import Node
    from slotkeeper.events import CONSOLE_GROUP

    nodes = [n async for n in Node.objects.order_by("id").values_list("id", flat=True)]
    layer = get_channel_layer()
    out, started = Produced(), time.perf_counter()
    for due, seqs in batches(rate, seconds, first, SEED):
        if (wait := out.pace(started, due)) > 0:
            await asyncio.sleep(wait)
        await layer.group_send(
            CONSOLE_GROUP, {"type": "console.event", "events": [event(s, nodes) for s in seqs]}
        )
        out.sent, out.batches = out.sent + len(seqs), out.batches + 1
    out.elapsed = time.perf_counter() - started
    return out


def producer_main(args: argparse.Namespace) -> None:
    os.environ.update(variant_env(args.database_url, VARIANTS[args.variant]))
    sys.path.insert(0, str(SHIM))  # PYTHONPATH is read at start-up only
    import django

    django.setup()
    cpu0 = time.process_time()
    if args.produce == "commits":
        out = produce_commits(args.rate, args.seconds, args.first)
    else:
        out = asyncio.run(produce_direct(args.rate, args.seconds, args.first))
    out.cpu = time.process_time() - cpu0
    print(json.dumps(out.__dict__), flush=True)


# --- the services -------------------------------------------------------------------------------------------------

SHIM = Path("/tmp/slotkeeper_bench_ws_settings")
# Suggested fix 1 as the benchmark measures it: one group member per Daphne process that receives each console
# event once, coalesces and serialises once per 50 ms, and writes the same text to every console of the process.
HUB_MODULE = """import asyncio
import json

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from slotkeeper.asgi import application  # noqa: F401
from slotkeeper.consumers import COALESCE_S, ConsoleConsumer
from slotkeeper.events import CONSOLE_GROUP
from slotkeeper.roles import role_of


class Hub:
    def __init__(self):
        self.consoles, self.pending, self.receiver, self.flusher = set(), {}, None, None

    async def join(self, console):
        self.consoles.add(console)
        if self.receiver is None:
            layer = get_channel_layer()
            channel = await layer.new_channel()
            await layer.group_add(CONSOLE_GROUP, channel)
            self.receiver = asyncio.create_task(self.receive(layer, channel))

    async def receive(self, layer, channel):
        while True:
            message = await layer.receive(channel)
            for payload in message.get("events") or []:
                self.pending[tuple(sorted((k, str(v)) for k, v in payload.items()))] = payload
            if self.flusher is None or self.flusher.done():
                self.flusher = asyncio.create_task(self.flush())

    async def flush(self):
        await asyncio.sleep(COALESCE_S)
        batch, self.pending = list(self.pending.values()), {}
        text = json.dumps({"event": "batch", "events": batch})
        for console in list(self.consoles):
            await console.send(text_data=text)


HUB = Hub()


async def connect(self):
    user = self.scope.get("user")
    role = await database_sync_to_async(role_of)(user) if user is not None else None
    if role is None:
        await self.close(code=4401)
        return
    await self.accept()
    await self.send(text_data=json.dumps({"event": "hello", "role": role}))
    await HUB.join(self)


async def disconnect(self, code):
    HUB.consoles.discard(self)


ConsoleConsumer.connect = connect
ConsoleConsumer.disconnect = disconnect
"""

SHIM_FILES = {
    "bench_ws_pubsub.py": """from slotkeeper.settings import *  # noqa: F403

CHANNEL_LAYERS = {
    "default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
}
""",
    "bench_ws_asgi.py": """from channels.consumer import AsyncConsumer

from slotkeeper.asgi import application  # noqa: F401
from slotkeeper.consumers import ConsoleConsumer


async def dispatch(self, message):
    # Channels runs close_old_connections in a worker thread before every handler; console events touch no
    # database, so they go straight to their handler.
    if message["type"] == "console.event":
        await self.console_event(message)
    else:
        await AsyncConsumer.dispatch(self, message)


ConsoleConsumer.dispatch = dispatch
""",
    "bench_ws_hub.py": HUB_MODULE,
    # The project with the 50 ms coalescing window it had before issue 13 item 6 (what the window costs).
    "bench_ws_window.py": """from slotkeeper.asgi import application  # noqa: F401 (first: it sets Django up)
from slotkeeper import consumers

consumers.COALESCE_S = 0.05
""",
    # Not a fix: the project as it is, under cProfile, each Daphne writing its profile when it stops (how the
    # costs per console message in docs/benchmarks/console-ws.md were found). Read with pstats.
    "bench_ws_profile.py": """import atexit
import cProfile
import os

from slotkeeper.asgi import application  # noqa: F401

os.makedirs("/tmp/slotkeeper_bench_ws_profile", exist_ok=True)
_profile = cProfile.Profile()
_profile.enable()


@atexit.register
def _dump():
    _profile.disable()
    _profile.dump_stats(f"/tmp/slotkeeper_bench_ws_profile/daphne-{os.getpid()}.prof")
""",
}


@dataclass(frozen=True)
class Variant:
    """What the Daphne processes (and, for the layer, the producer) run: the project as it is, or with one of the
    suggested fixes applied by a module written to /tmp for the run, so the project's files stay as they are."""

    name: str
    settings: str
    app: str
    label: str


VARIANTS = {
    v.name: v
    for v in (
        Variant(
            "project", "slotkeeper.settings", "slotkeeper.asgi", "the project: channels_redis core layer"
        ),
        Variant("pubsub", "bench_ws_pubsub", "slotkeeper.asgi", "variant 1: channels_redis pub/sub layer"),
        Variant(
            "nohop", "slotkeeper.settings", "bench_ws_asgi", "variant 2: no thread hop per console event"
        ),
        Variant("both", "bench_ws_pubsub", "bench_ws_asgi", "variants 1 + 2"),
        Variant(
            "hub", "slotkeeper.settings", "bench_ws_hub", "variant 3: one group member per process (a hub)"
        ),
        Variant("window50", "slotkeeper.settings", "bench_ws_window", "the project with a 50 ms window"),
        Variant("profile", "slotkeeper.settings", "bench_ws_profile", "the project under cProfile"),
    )
}


def variant_env(database_url: str, variant: Variant) -> dict[str, str]:
    SHIM.mkdir(exist_ok=True)
    for name, text in SHIM_FILES.items():
        (SHIM / name).write_text(text)
    env = bench_env(database_url)
    return {**env, "DJANGO_SETTINGS_MODULE": variant.settings, "PYTHONPATH": str(SHIM)}


def start_daphnes(database_url: str, variant: Variant, count: int) -> list[tuple[subprocess.Popen, int]]:
    started = []
    for _ in range(count):
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            f"{variant.app}:application",
        ]
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=variant_env(database_url, variant),
            stdout=subprocess.DEVNULL,
            stderr=DAPHNE_LOG.open("ab"),
        )
        started.append((proc, port))
    for proc, port in started:
        wait_until_listening(proc, port)
    return started


def wait_until_listening(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"Daphne did not listen on port {port} within 30 s; see {DAPHNE_LOG}")


def start_redis() -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"redis-server did not answer on port {port} within 15 s")


def viewer_sessions(count: int) -> list[str]:
    """`count` session ids of one viewer, each as a browser would hold it after signing in."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    user = get_user_model().objects.create_user(VIEWER)
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    sessions = []
    for _ in range(count):
        client = Client()
        client.force_login(user)
        sessions.append(client.cookies["sessionid"].value)
    return sessions


# --- the clients ----------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What one client saw of one phase."""

    latencies: list[float] = field(default_factory=list)  # s, one per batch
    messages: int = 0
    seen: set[int] = field(default_factory=set)
    first: float = 0.0  # when the first and the last batch arrived (time.time())
    last: float = 0.0


class Console:
    """One signed-in console: reads every message, tallies batches by phase, answers its own pings."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.tallies: dict[int, Tally] = {}
        self.pong: asyncio.Future[float] | None = None
        self.last = 0.0  # when the last batch arrived (time.time())

    async def read(self) -> None:
        async for raw in self.ws:
            now = time.time()
            if raw == "pong":
                if self.pong is not None and not self.pong.done():
                    self.pong.set_result(time.perf_counter())
                continue
            message = json.loads(raw)
            changed = message.get("changed")
            if changed is not None:  # grouped by kind (slotkeeper/livewire.py)
                events = [e for items in changed.values() for e in items]
            else:  # one list, as before (the old variants, main before issue 13 item 6)
                events = message.get("events") or []
            if events:
                self.last = now
                tally = self.tallies.setdefault(events[0]["seq"] // PHASE, Tally())
                tally.messages += 1
                tally.first, tally.last = tally.first or now, now
                tally.latencies.append(now - min(e["t"] for e in events))
                tally.seen.update(e["seq"] for e in events)

    async def ping(self) -> float:
        self.pong = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        await self.ws.send("ping")
        return await asyncio.wait_for(self.pong, 10) - sent


async def open_console(port: int, session: str) -> Console:
    from websockets.asyncio.client import connect

    base = f"127.0.0.1:{port}"
    ws = await connect(
        f"ws://{base}/ws/console/",
        origin=f"http://{base}",
        additional_headers={"Cookie": f"sessionid={session}"},
        open_timeout=30,
    )
    hello = json.loads(await ws.recv())
    if hello.get("event") != "hello" or hello.get("role") != "viewer":
        raise SystemExit(f"console on port {port} did not say hello as a viewer: {hello}")
    return Console(ws)


async def ping_all(consoles: list[Console], rounds: int) -> list[float]:
    return [await c.ping() for _ in range(rounds) for c in consoles]


async def ping_while(consoles: list[Console], done: asyncio.Event) -> list[float]:
    """A ping every 50 ms from the next console in turn until `done`: the Daphne loops' lag under the load."""
    rtts, i = [], 0
    while not done.is_set():
        rtts.append(await consoles[i % len(consoles)].ping())
        i += 1
        await asyncio.sleep(0.05)
    return rtts


class LocalClients:
    """The consoles in this process's loop (the benchmark as it was first written, and its default)."""

    def __init__(self, consoles: list[Console]) -> None:
        self.consoles = consoles
        self.pids: list[int] = []
        self.pinger: asyncio.Task | None = None
        self.done = asyncio.Event()

    async def ping_all(self, rounds: int) -> list[float]:
        return await ping_all(self.consoles, rounds)

    def start_pinging(self) -> None:
        self.done = asyncio.Event()
        self.pinger = asyncio.create_task(ping_while(self.consoles, self.done))

    async def stop_pinging(self) -> list[float]:
        self.done.set()
        assert self.pinger is not None
        return await self.pinger

    async def last(self) -> float:
        return max(c.last for c in self.consoles)

    async def tally(self, index: int, sent: int) -> dict:
        return tally(self.consoles, index, sent)

    async def close(self) -> None:
        for c in self.consoles:
            await c.ws.close()


def tally(consoles: list[Console], index: int, sent_count: int) -> dict:
    sent = set(range(index * PHASE, index * PHASE + sent_count))
    tallies = [c.tallies.get(index, Tally()) for c in consoles]
    return {
        "latencies": [x * 1000 for t in tallies for x in t.latencies],
        "messages": sum(t.messages for t in tallies),
        "lost": sum(len(sent - t.seen) for t in tallies),
        "received": sum(len(t.seen & sent) for t in tallies),
        "delivering": sum(t.last - t.first for t in tallies),
        "clients": len(tallies),
    }


class WorkerClients:
    """The consoles spread over processes of their own (`--client-procs N`): each reads and parses its share in a
    loop of its own, so one loop's queue of 100 sockets is not in the latency, and the clients can use both cores.
    They still share the two cores with Daphne, Redis and the producer. Driven by one-line commands on stdin."""

    def __init__(self, procs: list[asyncio.subprocess.Process]) -> None:
        self.procs = procs
        self.pids = [p.pid for p in procs]

    @classmethod
    async def start(cls, count: int, ports: list[int], sessions: list[str]) -> WorkerClients:
        procs = []
        for w in range(count):
            share = [(ports[i % len(ports)], s) for i, s in enumerate(sessions) if i % count == w]
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--clients-worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 26,
            )
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(share) + "\n").encode())
            procs.append(proc)
        self = cls(procs)
        await asyncio.gather(*(self.answer(p) for p in procs))  # each says it opened its consoles
        return self

    async def answer(self, proc: asyncio.subprocess.Process) -> dict:
        assert proc.stdout is not None
        line = await proc.stdout.readline()
        if not line:
            raise SystemExit("a client worker exited early")
        return json.loads(line)

    async def ask(self, command: str, procs: list | None = None) -> list[dict]:
        procs = self.procs if procs is None else procs
        for p in procs:
            assert p.stdin is not None
            p.stdin.write((command + "\n").encode())
        return list(await asyncio.gather(*(self.answer(p) for p in procs)))

    async def ping_all(self, rounds: int) -> list[float]:
        # One console at a time over all of them, as in one process: worker after worker.
        return [x for p in self.procs for x in (await self.ask(f"ping {rounds}", [p]))[0]["rtts"]]

    def start_pinging(self) -> None:
        proc = self.procs[0]
        assert proc.stdin is not None
        proc.stdin.write(b"pinging\n")

    async def stop_pinging(self) -> list[float]:
        return (await self.ask("stop-pinging", self.procs[:1]))[0]["rtts"]

    async def last(self) -> float:
        return max(a["last"] for a in await self.ask("last"))

    async def tally(self, index: int, sent: int) -> dict:
        parts = await self.ask(f"tally {index} {sent}")
        out = {"latencies": [x for a in parts for x in a["latencies"]]}
        for name in ("messages", "lost", "received", "delivering", "clients"):
            out[name] = sum(a[name] for a in parts)
        return out

    async def close(self) -> None:
        await self.ask("close")
        for p in self.procs:
            await p.wait()


async def clients_worker() -> None:
    """A client process: opens its share of consoles (a JSON list of [port, session] on the first line of stdin),
    reads them all, and answers the parent's commands."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    share = json.loads(await reader.readline())
    consoles = list(await asyncio.gather(*(open_console(port, session) for port, session in share)))
    readers = [asyncio.create_task(c.read()) for c in consoles]
    local = LocalClients(consoles)
    say({"opened": len(consoles)})
    while line := (await reader.readline()).decode().split():
        command, rest = line[0], [int(x) for x in line[1:]]
        if command == "ping":
            say({"rtts": await local.ping_all(rest[0])})
        elif command == "pinging":
            local.start_pinging()
        elif command == "stop-pinging":
            say({"rtts": await local.stop_pinging()})
        elif command == "last":
            say({"last": await local.last()})
        elif command == "tally":
            say(await local.tally(rest[0], rest[1]))
        elif command == "close":
            await local.close()
            for r in readers:
                r.cancel()
            say({"closed": True})
            return


# --- phases --------------------------------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    name: str
    produced: Produced
    latencies: list[float]  # ms
    messages: int
    lost: int
    received: int
    pings: list[float]  # ms
    cpu: dict[str, float]  # CPU seconds spent in the phase (sending and draining), by process
    delivering: float  # s from the first batch a client received to the last, averaged over the clients
    wall: float = 0.0  # s from the producer's start until the consoles fell quiet


class Cpu:
    """CPU time (user + system) of the named processes, sampled around a phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        import psutil

        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.start = self.sample()

    def sample(self) -> dict[str, float]:
        return {name: sum(p.cpu_times()[:2]) for name, p in self.procs.items()}

    def spent(self) -> dict[str, float]:
        end = self.sample()
        return {name: end[name] - self.start[name] for name in end}


async def run_phase(
    index: int,
    name: str,
    variant: Variant,
    clients: LocalClients | WorkerClients,
    args: argparse.Namespace,
    pids: dict[str, int],
) -> PhaseResult:
    first = index * PHASE
    argv = [
        sys.executable,
        __file__,
        "--produce",
        name,
        "--variant",
        variant.name,
        "--database-url",
        args.database_url,
    ]
    argv += ["--rate", str(args.rate), "--seconds", str(args.seconds), "--first", str(first)]
    client_pids = {"clients (this process)": os.getpid()}
    client_pids |= {f"clients {i}": pid for i, pid in enumerate(clients.pids)}
    cpu = Cpu({**pids, **client_pids})
    started = time.perf_counter()
    producer = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    clients.start_pinging()
    out, _ = await producer.communicate()
    await quiet(clients)
    pings = await clients.stop_pinging()
    spent = cpu.spent()
    produced = Produced(**json.loads(out.decode().strip().splitlines()[-1]))
    seen = await clients.tally(index, produced.sent)
    result = PhaseResult(
        name=name,
        produced=produced,
        latencies=seen["latencies"],
        messages=seen["messages"],
        lost=seen["lost"],
        received=seen["received"],
        pings=[x * 1000 for x in pings],
        cpu={**spent, "producer": produced.cpu},
        delivering=seen["delivering"] / max(1, seen["clients"]),
    )
    result.wall = time.perf_counter() - started
    return result


async def quiet(clients: LocalClients | WorkerClients, still: float = 1.0, limit: float = 30.0) -> None:
    """Waits until no console has received a batch for `still` seconds: an event that is merely late (queued in
    the channel layer) is then counted as late, not lost."""
    deadline = time.time() + limit
    while time.time() < deadline and time.time() - await clients.last() < still:
        await asyncio.sleep(0.1)


# --- report --------------------------------------------------------------------------------------------------------


def ms_line(values: list[float]) -> str:
    top = max(values) if values else 0.0
    return (
        f"p50 {pct(values, 50):7.1f}  p95 {pct(values, 95):7.1f}  p99 {pct(values, 99):7.1f}  max {top:7.1f}"
    )


def report(result: PhaseResult, clients: int, idle: float) -> None:
    p, seconds = result.produced, result.produced.elapsed or 1.0
    expected = p.sent * clients
    print(f"  {result.name}")
    print(
        f"    sent {p.sent:,} changes in {p.batches:,} batches over {p.elapsed:.2f} s ({p.sent / seconds:,.0f}/s),"
        f" producer at most {p.late_max * 1000:.0f} ms behind its schedule"
    )
    print(f"    latency (ms)  {ms_line(result.latencies)}  ({len(result.latencies):,} batches)")
    print(
        f"    messages per client {result.messages / clients:,.0f} over {result.delivering:.1f} s"
        f" ({result.messages / clients / max(result.delivering, 1e-9):.1f}/s),"
        f" events per message {result.received / max(1, result.messages):.1f};"
        f" lost {result.lost:,} of {expected:,} ({100 * result.lost / max(1, expected):.2f} %)"
    )
    print(f"    ping under load (ms) {ms_line(result.pings)}  ({len(result.pings)} pings)")
    if p.broadcasts:
        ms = [x * 1000 for x in p.broadcasts]
        print(f"    after-commit broadcast in the producer (ms) {ms_line(ms)}  ({len(ms)} transactions)")
    print("    CPU s: " + ", ".join(f"{name} {v:.2f}" for name, v in result.cpu.items()))
    print(daphne_cost(result, clients, idle))


def daphne_cost(result: PhaseResult, clients: int, idle: float) -> str:
    """Daphne's CPU per layer message a consumer handles (one per batch per client), less what the processes
    burn idle (`idle` CPU s per s), and the cores that cost makes at the rate sent: the number that says whether
    two cores can keep up at all."""
    daphne = sum(v for name, v in result.cpu.items() if name.startswith("daphne")) - idle * result.wall
    handled = result.produced.batches * clients
    per_message = daphne / max(1, handled)
    cores = per_message * result.produced.batches / max(result.produced.elapsed, 1e-9) * clients
    rate = result.produced.sent / max(result.produced.elapsed, 1e-9)
    return (
        f"    Daphne {per_message * 1e6:.0f} us CPU per consumer message"
        f" ({1e6 * daphne / max(1, result.received):.0f} us per event delivered):"
        f" {cores:.2f} cores at {rate:,.0f} changes/s"
    )


def verdict(result: PhaseResult, variant: Variant) -> str:
    p99 = pct(result.latencies, 99)
    lost = f", {result.lost:,} events lost" if result.lost else ""
    word = "PASS" if p99 <= TARGET_P99_MS and not result.lost else "FAIL"
    return f"{variant.label}: commit-to-browser p99 {p99:.1f} ms{lost}: {word} against p99 <= {TARGET_P99_MS:.0f} ms"


async def idle_cpu(pids: dict[str, int], seconds: float = 2.0) -> float:
    """What the Daphne processes burn with the consoles open and nothing sent (the channel layer's receive
    loops), so the per-message cost does not count it."""
    cpu = Cpu({name: pid for name, pid in pids.items() if name.startswith("daphne")})
    await asyncio.sleep(seconds)
    return sum(cpu.spent().values()) / seconds


async def measure(args: argparse.Namespace, variant: Variant, ports: list[int], pids: dict[str, int]) -> str:
    opened = time.perf_counter()
    sessions = args.sessions
    readers: list[asyncio.Task] = []
    clients: LocalClients | WorkerClients
    if args.client_procs:
        clients = await WorkerClients.start(args.client_procs, ports, sessions)
        where = f"in {args.client_procs} processes of their own"
    else:
        consoles = await asyncio.gather(
            *(open_console(ports[i % len(ports)], s) for i, s in enumerate(sessions))
        )
        readers = [asyncio.create_task(c.read()) for c in consoles]
        clients = LocalClients(list(consoles))
        where = "in this process"
    print(
        f"  {len(sessions)} consoles ({where}) signed in and said hello in {time.perf_counter() - opened:.2f} s"
    )
    rtts = [x * 1000 for x in await clients.ping_all(5)]
    print(f"  ping/pong idle, one at a time (ms)  {ms_line(rtts)}  ({len(rtts)} round trips)")
    idle = await idle_cpu(pids)
    print(f"  Daphne CPU idle with the consoles open: {idle:.3f} s per s (all processes)")
    results = []
    for index, name in enumerate(("direct", "commits"), start=1):
        results.append(await run_phase(index, name, variant, clients, args, pids))
        report(results[-1], len(sessions), idle)
    await clients.close()
    for r in readers:
        r.cancel()
    return verdict(results[-1], variant)


def run_variant(args: argparse.Namespace, variant: Variant, redis: subprocess.Popen) -> str:
    started = start_daphnes(args.database_url, variant, args.daphnes)
    try:
        pids = {f"daphne{i}": proc.pid for i, (proc, _) in enumerate(started)} | {"redis": redis.pid}
        print(
            f"{variant.label}: {args.clients} clients over {args.daphnes} Daphne, load {os.getloadavg()[0]:.2f}"
        )
        return asyncio.run(measure(args, variant, [port for _, port in started], pids))
    finally:
        for proc, _ in started:
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s a phase")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rate", type=float, default=1000.0, help="changes per second")
    parser.add_argument("--seconds", type=float, default=None, help="per phase; default 10 (3 with --quick)")
    parser.add_argument("--daphnes", type=int, default=2)
    parser.add_argument(
        "--variants",
        default="project,pubsub,nohop,both,hub",
        help=f"some of {','.join(VARIANTS)} (default: all but profile)",
    )
    parser.add_argument(
        "--client-procs",
        type=int,
        default=0,
        help="run the consoles in N processes of their own (default 0: in this process, as the earlier runs did)",
    )
    parser.add_argument("--clients-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--produce", choices=["direct", "commits"], help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, default="project", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    if args.clients_worker:
        asyncio.run(clients_worker())
        return
    if args.produce:
        producer_main(args)
        return

    redis, redis_port = start_redis()
    try:
        os.environ["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        args.database_url = fresh_postgres(BENCH_DB)
        start_django(args.database_url)
        from bench_heartbeats import register_nodes

        register_nodes(NODES)
        args.sessions = viewer_sessions(args.clients)
        print(
            f"console live updates on PostgreSQL and Redis, {os.cpu_count()} cores: {args.rate:,.0f} changes/s"
            f" for {args.seconds:g} s a phase, batches of 1..{MAX_BATCH} changes, {NODES:,} nodes"
        )
        verdicts = [run_variant(args, VARIANTS[name], redis) for name in args.variants.split(",")]
        for line in verdicts:
            print(line)
    finally:
        stop(redis)


if __name__ == "__main__":
    main()
