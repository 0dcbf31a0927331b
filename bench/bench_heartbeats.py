"""Benchmark heartbeat ingest: heartbeats accepted per second through the API on PostgreSQL.

Target (issue 2): at least 2,000 heartbeats/s on this 2-core machine, i.e. 10,000 nodes reporting every 5 s.

Makes a fresh PostgreSQL database (`slotkeeper_bench`: dropped, recreated, migrated), registers N online nodes,
then runs each phase for a fixed time and prints accepted heartbeats/s with p50/p99 latency:

- db floor: a raw psycopg UPDATE of the node row, INSERT of a health sample and COMMIT per heartbeat, from
  several threads. What the database allows with no Django at all.
- api in-process: POST /api/nodes/{id}/heartbeat through DRF's APIClient from several threads: every
  middleware, the node-token auth, the serializer, `do_heartbeat`, the database; no HTTP, no Daphne.
- http floor: GET /healthz over keep-alive HTTP/1.1 against Daphne on loopback. What Daphne and Django's
  ASGI handler allow before any view or query runs.
- api over http: the heartbeat against the same Daphne (the full run also tries two Daphne processes,
  the distributed deployment's shape, with the connections split between them).
- the same with DB_POOL=0 ("no pool"): a new PostgreSQL connection per request, as before the connection pool
  (issue 12, item 5); CONN_MAX_AGE is 0 in both (persistent connections piled up one per Daphne thread until
  PostgreSQL refused clients: the 500s of the first run in docs/benchmarks/heartbeats.md).

A steady fleet revisits each node every few seconds, so a heartbeat usually finds its node's token in the web
process's cache (slotkeeper.auth.node_tokens, 30 s); with many nodes and a short phase every heartbeat is a first
contact instead. `--nodes 200` measures the steady state, the default 10,000 the cold one.

The HTTP client is a small asyncio loop over raw keep-alive sockets rather than `requests`: on two cores every
client CPU cycle is taken from the server, and `requests` costs about as much per call as the view does.
Daphne runs with EMBEDDED_LOOP=0 (the periodic sweep is not what is measured; in the distributed run it lives in
Celery anyway). The other benchmarks of Django code import the database set-up from here.

    .venv/bin/python bench/bench_heartbeats.py [--quick] [--nodes 10000] [--seconds 15] [--profile]
        [--database slotkeeper_bench]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
BENCH_DB = "slotkeeper_bench"
TARGET_PER_S = 2000.0
BODY = {"mem_total_mib": 61440, "mem_used_mib": 6144, "disk_free_gib": 400.0, "cpu_pct": 12.5, "load1": 0.5}


def fresh_postgres(name: str = BENCH_DB) -> str:
    """Drops and recreates the benchmark database, so every run starts from the same empty schema."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_SERVER}/{name}"


def fresh_sqlite(path: Path) -> str:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def bench_env(database_url: str) -> dict[str, str]:
    """The environment both this process and a Daphne child run Django with."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "slotkeeper.settings",
        "DATABASE_URL": database_url,
        "EMBEDDED_LOOP": "0",
        "LOG_LEVEL": "WARNING",
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
        "SECRET_KEY": "bench-only-not-secret",
    }


def start_django(database_url: str) -> None:
    """Configures Django on `database_url` in this process and migrates it; then, start-up done, tunes the
    garbage collector as a server process does (slotkeeper/collector.py; SLOTKEEPER_GC_THRESHOLD=0 in the
    environment keeps CPython's defaults, here and in the Daphne and worker processes a benchmark starts)."""
    os.environ.update(bench_env(database_url))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from slotkeeper.collector import tune_from_settings

    tune_from_settings()


def use_collector(choice: str) -> None:
    """`--collector default`: CPython's collector settings in this process and the ones it starts."""
    if choice == "default":
        os.environ["SLOTKEEPER_GC_THRESHOLD"] = "0"


COLLECTOR_HELP = (
    "the garbage collector as a server process sets it (slotkeeper/collector.py), or CPython's defaults"
)


@dataclass
class Run:
    """What one phase measured: heartbeats accepted, refused, latencies (s, one per request or per flushed
    batch), wall time."""

    accepted: int = 0
    refused: Counter[int] = field(default_factory=Counter)  # by status code; 0 = connection dropped
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0

    def ok(self, latency: float, count: int = 1) -> None:
        self.accepted += count
        self.latencies.append(latency)

    def merge(self, other: Run) -> None:
        self.accepted += other.accepted
        self.refused.update(other.refused)
        self.latencies.extend(other.latencies)

    @property
    def per_s(self) -> float:
        return self.accepted / self.elapsed if self.elapsed else 0.0


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, in the values' unit; 0 when there are none."""
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


def line(name: str, run: Run, target: float | None = None) -> str:
    ms = [x * 1000 for x in run.latencies]
    verdict = (
        "" if target is None else ("  PASS" if run.per_s >= target else f"  FAIL (target {target:,.0f}/s)")
    )
    return (
        f"  {name:<34}{run.per_s:>9,.0f}/s  p50 {pct(ms, 50):7.2f} ms  p99 {pct(ms, 99):7.2f} ms"
        f"  ({run.accepted:,} ok{refused(run)}){verdict}"
    )


def refused(run: Run) -> str:
    return "".join(f", {n} x {code or 'dropped'}" for code, n in sorted(run.refused.items()))


def threaded(threads: int, seconds: float, work: Callable[[int, float], Run]) -> Run:
    """Runs `work(k, deadline)` on `threads` threads and merges what they measured."""
    results: list[Run] = []
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    pool = [threading.Thread(target=lambda k=k: results.append(work(k, deadline))) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    total = Run(elapsed=time.perf_counter() - started)
    for r in results:
        total.merge(r)
    return total


# --- the fleet ---------------------------------------------------------------------------------------------------


def register_nodes(n: int) -> list[tuple[int, str]]:
    """N online nodes that heartbeated a moment ago; returns (id, raw token) pairs. Bulk-created: registration is
    not what is measured, and 10,000 audited registrations would take longer than the benchmark itself."""
    from django.utils import timezone

    from fleet.models import Node, NodeStatus
    from slotkeeper.models import hash_token, new_token

    now = timezone.now()
    tokens = [new_token("skn") for _ in range(n)]
    rows = [
        Node(
            name=f"node-{i:05d}",
            cpu_cores=32,
            mem_total_mib=61440,
            disk_total_gib=500,
            capabilities=["kvm"],
            status=NodeStatus.ONLINE,
            status_changed_at=now,
            last_heartbeat_at=now,
            obs_mem_total_mib=61440,
            obs_mem_used_mib=6144,
            obs_disk_free_gib=400.0,
            obs_cpu_pct=10.0,
            obs_load1=0.5,
            token_digest=hash_token(tok),
        )
        for i, tok in enumerate(tokens)
    ]
    Node.objects.bulk_create(rows, batch_size=1000)
    ids = Node.objects.order_by("name").values_list("id", flat=True)
    return list(zip(ids, tokens, strict=True))


# --- phases ------------------------------------------------------------------------------------------------------


UPDATE_ONE = (
    "UPDATE fleet_node SET last_heartbeat_at = now(), obs_mem_total_mib = %s, obs_mem_used_mib = %s,"
    " obs_disk_free_gib = %s, obs_cpu_pct = %s, obs_load1 = %s, reported_instances = '[]' WHERE id = %s"
)
INSERT_ONE = (
    "INSERT INTO fleet_healthsample (node_id, at, mem_total_mib, mem_used_mib, disk_free_gib, cpu_pct, load1)"
    " VALUES (%s, now(), %s, %s, %s, %s, %s)"
)
UPDATE_MANY = (
    "UPDATE fleet_node AS n SET last_heartbeat_at = now(), obs_mem_used_mib = v.used, reported_instances = '[]'"
    " FROM unnest(%s::bigint[], %s::int[]) AS v(id, used) WHERE n.id = v.id"
)
INSERT_MANY = (
    "INSERT INTO fleet_healthsample (node_id, at, mem_total_mib, mem_used_mib, disk_free_gib, cpu_pct, load1)"
    " SELECT id, now(), 61440, used, 400.0, 12.5, 0.5 FROM unnest(%s::bigint[], %s::int[]) AS v(id, used)"
)


def db_floor(database_url: str, nodes: list[tuple[int, str]], threads: int, seconds: float) -> Run:
    """One transaction per heartbeat, as the API does it. Each thread owns every threads-th node, so no two
    transactions wait on one row."""
    import psycopg

    def work(k: int, deadline: float) -> Run:
        run, mine = Run(), [node_id for node_id, _ in nodes[k::threads]]
        with psycopg.connect(database_url) as conn:
            for i in range_until(deadline):
                node_id = mine[i % len(mine)]
                t = time.perf_counter()
                conn.execute(UPDATE_ONE, (61440, 6144, 400.0, 12.5, 0.5, node_id))
                conn.execute(INSERT_ONE, (node_id, 61440, 6144, 400.0, 12.5, 0.5))
                conn.commit()
                run.ok(time.perf_counter() - t)
        return run

    return threaded(threads, seconds, work)


def db_batched(database_url: str, nodes: list[tuple[int, str]], batch: int, seconds: float) -> Run:
    """The ceiling of a buffered ingest: `batch` heartbeats per transaction (two set-based statements), from two
    threads. Not what the API does today; measured so the suggested fix has a number."""
    import psycopg

    threads = 2

    def work(k: int, deadline: float) -> Run:
        run, mine = Run(), [node_id for node_id, _ in nodes[k::threads]]
        with psycopg.connect(database_url) as conn:
            for i in range_until(deadline):
                ids = [mine[(i * batch + j) % len(mine)] for j in range(batch)]
                used = [6144 + j for j in range(batch)]
                t = time.perf_counter()
                conn.execute(UPDATE_MANY, (ids, used))
                conn.execute(INSERT_MANY, (ids, used))
                conn.commit()
                run.ok(time.perf_counter() - t, batch)
        return run

    return threaded(threads, seconds, work)


def range_until(deadline: float) -> Iterator[int]:
    """0, 1, 2, ... for as long as the deadline has not passed."""
    i = 0
    while time.perf_counter() < deadline:
        yield i
        i += 1


def api_in_process(nodes: list[tuple[int, str]], threads: int, seconds: float) -> Run:
    from django.db import connections
    from rest_framework.test import APIClient

    def work(k: int, deadline: float) -> Run:
        run, client, mine = Run(), APIClient(), nodes[k::threads]
        try:
            for i in range_until(deadline):
                node_id, token = mine[i % len(mine)]
                t = time.perf_counter()
                resp = client.post(
                    f"/api/nodes/{node_id}/heartbeat",
                    BODY,
                    format="json",
                    HTTP_AUTHORIZATION=f"Bearer {token}",
                )
                if resp.status_code == 200:
                    run.ok(time.perf_counter() - t)
                else:
                    run.refused[resp.status_code] += 1
        finally:
            connections.close_all()
        return run

    return threaded(threads, seconds, work)


# --- over HTTP ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHIM = Path("/tmp/slotkeeper_bench_settings")


def daphne_env(database_url: str, conn_max_age: int | None, pool: bool = True) -> dict[str, str]:
    """The project's settings, or with `conn_max_age` a settings module written for this run that changes only
    CONN_MAX_AGE: how the suggested fix for the connection pile-up was measured without touching the project.
    `pool=False`: without the connection pool (DB_POOL=0)."""
    env = bench_env(database_url)
    # Said either way: a benchmark process may have turned the pool off for itself (the burst does, to copy its
    # template database), and a Daphne inheriting that ran without the pool the project configures by default.
    env["DB_POOL"] = "1" if pool else "0"
    if conn_max_age is None:
        return env
    SHIM.mkdir(exist_ok=True)
    (SHIM / "bench_settings.py").write_text(
        f'from slotkeeper.settings import *  # noqa: F403\nDATABASES["default"]["CONN_MAX_AGE"] = {conn_max_age}\n'
    )
    return {**env, "DJANGO_SETTINGS_MODULE": "bench_settings", "PYTHONPATH": str(SHIM)}


def start_daphne(
    database_url: str, log: Path, conn_max_age: int | None, pool: bool = True, repo: Path = ROOT
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = daphne_env(database_url, conn_max_age, pool)
    if repo != ROOT:
        # Another checkout's code (the baseline), so that both are measured by the same client in the same run.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "slotkeeper.asgi:application"],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"Daphne did not answer /healthz within 30 s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    """Sends one request on a keep-alive connection and reads the whole response; returns its status code."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        while size := int((await reader.readline()).strip(), 16):
            await reader.readexactly(size + 2)
        await reader.readexactly(2)
    elif m := CONTENT_LENGTH.search(head):
        await reader.readexactly(int(m.group(1)))
    return int(head[9:12])


def heartbeat_request(node_id: int, token: str) -> bytes:
    body = json.dumps({**BODY, "instances": []}).encode()
    return (
        f"POST /api/nodes/{node_id}/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def http_load(ports: list[int], requests: list[bytes], connections: int, seconds: float) -> Run:
    """`connections` keep-alive connections spread over `ports`, each sending the next request as soon as the
    previous answer is in; a connection the server drops is reopened."""
    total = Run()
    deadline = time.perf_counter() + seconds

    async def connection(k: int) -> None:
        port, i = ports[k % len(ports)], k
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            try:
                status = await exchange(reader, writer, requests[i % len(requests)])
            except (asyncio.IncompleteReadError, ConnectionError):
                total.refused[0] += 1
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            if status == 200:
                total.ok(time.perf_counter() - t)
            else:
                total.refused[status] += 1
            i += connections
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection(k) for k in range(connections)))
    total.elapsed = time.perf_counter() - started
    return total


class ConnectionPeak:
    """Samples how many server connections the benchmark database holds, twice a second, in a thread: Django keeps
    one per thread (CONN_MAX_AGE), and under ASGI every request runs on a fresh thread, so the count is worth
    watching next to the throughput."""

    def __init__(self, database_url: str) -> None:
        self.url, self.peak, self._stop = database_url, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(0.5):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                ).fetchone()
                self.peak = max(self.peak, row[0] - 1 if row else 0)

    def __enter__(self) -> ConnectionPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class HttpResult:
    floor: Run | None
    beats: Run
    cpu_ms: float  # Daphne CPU (user + system) per accepted heartbeat
    peak_connections: int
    stored: tuple[int, int] = (0, 0)
    client_cpu_ms: float = 0.0  # this benchmark's own CPU per accepted heartbeat (the HTTP client)  # nodes whose row holds a heartbeat of this phase, of the nodes sent one


@dataclass(frozen=True)
class Server:
    processes: int
    conn_max_age: int | None = None  # None: the project's settings
    pool: bool = True  # False: DB_POOL=0
    repo: Path = ROOT  # the checkout Daphne runs (--baseline: another one)
    name: str = ""

    @property
    def label(self) -> str:
        return (
            (f"{self.name} " if self.name else "")
            + f"x{self.processes}"
            + ("" if self.conn_max_age is None else f" CONN_MAX_AGE={self.conn_max_age}")
            + ("" if self.pool else " no pool")
        )


def over_http(
    database_url: str, nodes: list[tuple[int, str]], server: Server, connections: int, seconds: float
) -> HttpResult:
    """GET /healthz (with the project's settings only), then heartbeats, against Daphne processes started for the
    purpose."""
    import psutil

    log = Path("/tmp/slotkeeper_bench_daphne.log")
    started = [
        start_daphne(database_url, log, server.conn_max_age, server.pool, server.repo)
        for _ in range(server.processes)
    ]
    ports = [port for _, port in started]
    try:
        floor = None
        if server.conn_max_age is None and server.pool:
            floor = asyncio.run(http_load(ports, [HEALTHZ], connections, seconds))
        requests = [heartbeat_request(node_id, token) for node_id, token in nodes]
        procs = [psutil.Process(p.pid) for p, _ in started]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
        phase_start, client0 = time.time(), time.process_time()
        with ConnectionPeak(database_url) as peak:
            beats = asyncio.run(http_load(ports, requests, connections, seconds))
        cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu0
        client = time.process_time() - client0
    finally:
        for proc, _ in started:
            stop(proc)  # SIGTERM: a buffering server flushes what it holds before it exits
    return HttpResult(
        floor,
        beats,
        1000 * cpu / max(1, beats.accepted),
        peak.peak,
        stored_since(database_url, phase_start),
        1000 * client / max(1, beats.accepted),
    )


def stored_since(database_url: str, since: float) -> tuple[int, int]:
    """How many nodes' rows hold a heartbeat from this phase (after the servers stopped), of all nodes: with every
    node sent several heartbeats, anything short of all of them is a heartbeat answered 200 and never written."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE last_heartbeat_at >= to_timestamp(%s)), count(*) FROM fleet_node",
            (since,),
        ).fetchone()
    return (row[0], row[1]) if row else (0, 0)


def profile(nodes: list[tuple[int, str]], count: int) -> None:
    """Where one in-process heartbeat spends its time: cProfile over `count` sequential calls."""
    import cProfile
    import pstats

    from rest_framework.test import APIClient

    client = APIClient()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(count):
        node_id, token = nodes[i % len(nodes)]
        client.post(
            f"/api/nodes/{node_id}/heartbeat", BODY, format="json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
    prof.disable()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, 4 s a phase, one Daphne")
    parser.add_argument("--nodes", type=int, default=None, help="default 10,000 (1,000 with --quick)")
    parser.add_argument("--seconds", type=float, default=None, help="per phase; default 15 (4 with --quick)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of 2,000 in-process heartbeats"
    )
    parser.add_argument(
        "--database", default=BENCH_DB, help=f"the database to drop and recreate (default {BENCH_DB})"
    )
    parser.add_argument("--http-only", action="store_true", help="skip the database and in-process phases")
    parser.add_argument(
        "--processes",
        default=None,
        help="Daphne processes per server, e.g. '2' or '1,2' (default 1,2; 1 --quick)",
    )
    parser.add_argument("--pool-only", action="store_true", help="skip the no-pool variants")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout (e.g. a clean export of main): each server is run from it and from this one, "
        "alternating, --rounds times",
    )
    parser.add_argument("--rounds", type=int, default=1, help="with --baseline: rounds of the pair")
    args = parser.parse_args()
    n = args.nodes or (1000 if args.quick else 10_000)
    seconds = args.seconds or (4.0 if args.quick else 15.0)

    url = fresh_postgres(args.database)
    start_django(url)
    nodes = register_nodes(n)
    from django.db import connection

    print(f"heartbeats on PostgreSQL {connection.pg_version // 10000}, {n:,} nodes, {os.cpu_count()} cores")
    print(
        f"  {args.threads} threads in-process, {args.connections} connections over HTTP, {seconds:g} s a phase"
    )
    if args.profile:
        profile(nodes, 2000)
        return
    print(f"  {'phase':<34}{'accepted':>11}  {'latency':>12}")
    if not args.http_only:
        print(line("db floor (raw psycopg)", db_floor(url, nodes, args.threads, seconds)))
        print(line("db batched x100 (per flush)", db_batched(url, nodes, 100, seconds)))
        print(line("api in-process", api_in_process(nodes, args.threads, seconds), TARGET_PER_S))
        try:
            from slotkeeper.auth import node_tokens  # this branch's token cache; absent before it
        except ImportError:
            pass
        else:
            print(
                f"  {'':<34}node tokens from the cache: {node_tokens.hits:,} of {node_tokens.hits + node_tokens.misses:,}"
            )
    counts = [int(x) for x in (args.processes or ("1" if args.quick else "1,2")).split(",")]
    variants = [True] if args.pool_only else [True, False]
    servers = [Server(n, pool=pool) for n in counts for pool in variants]
    if args.baseline is not None:
        base = args.baseline.resolve()
        servers = [
            replace(server, repo=repo, name=name)
            for _ in range(args.rounds)
            for server in servers
            for repo, name in ((base, "baseline"), (ROOT, "this"))
        ]
    for server in servers:
        print(f"  ... Daphne {server.label} ({server.repo})", file=sys.stderr)
        http = over_http(url, nodes, server, args.connections, seconds)
        if http.floor:
            print(line(f"http floor /healthz {server.label}", http.floor))
        share = f" ({http.beats.per_s / http.floor.per_s:.2f} of /healthz)" if http.floor else ""
        print(line(f"api over http {server.label}", http.beats, TARGET_PER_S) + share)
        print(
            f"  {'':<34}Daphne CPU {http.cpu_ms:.2f} ms per heartbeat (client {http.client_cpu_ms:.2f}), "
            f"peak {http.peak_connections} database connections, "
            f"stored {http.stored[0]:,} of {http.stored[1]:,} nodes, load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
