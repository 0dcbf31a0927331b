"""Benchmark a burst of lease requests on PostgreSQL: 10,000 requests at once against 1,000 nodes, two workers.

Target (issue 6): every lease placed or queued with a start time, time to done <= 10 s, zero overcommit.

Set-up (not timed): a fresh database, N nodes registered and heartbeated through `fleet.actions`, an operator with an
API token. That fleet is copied aside as a template database, so every variant starts from the same one
(`CREATE DATABASE ... TEMPLATE`, a second instead of re-registering). While a variant runs, a thread stamps every
node's `last_heartbeat_at` each 5 s with one UPDATE: the agents' heartbeats, at database cost only, so no node
turns "no recent health" half-way through a long burst (real heartbeats through the API would take the cores the
burst needs; see the heartbeat benchmark).

The workload (seeded, the same for every variant): 90 % best-effort, 5 % immediate, 5 % advance reservations
1 to 6 hours ahead; 1 to 4 VMs each of 1, 2 or 4 cores with 4 GiB per core; 1 to 8 hours. It asks for about 1.5
times the fleet's cores, so the fleet fills and the rest queues; some immediate leases are rejected (409), which
is a decided answer too.

Variants, each from the same fleet:

- in-process x W: W worker processes (default 2; the full run also measures 1) each call `do_submit_lease` for
  every W-th request, all released together. No HTTP; what the plan applier and the database allow.
  With `--threads T` also in-process x W x T: each worker submits from T threads, so up to W x T requests wait
  at once and the plan applier's group commit can plan them in one pass.
- http x 2: two Daphne processes (the distributed deployment's shape) receive `POST /api/leases/` from a pool of
  keep-alive connections (the asyncio client of the heartbeat benchmark), all requests queued at once. Before
  the burst the same processes answer `GET /healthz` for 5 s over the same connections: the requests a second
  are also printed as a share of that rate (issue 12's target: at least 0.25).
- http x 2 minimal: the same, every request sent with `Prefer: return=minimal` (the answer carries its report's
  summary, counts and link instead of every node's verdict).

- stored: every request stored as an intent at once (a lease in state `new`, as `do_submit_lease` stores it),
  then planning passes run, as the tick runs them, until none is left: the application's own group commit at its
  largest batches (`intents.MAX_BATCH`), with every report, audit row, alert and event, and none of the requests'
  own costs (the intent's transaction, the wait, the answer). The floor under every concurrent variant.
- batched xB (`--batched B`): the suggested group commit, approximated from outside the application: B requests
  share one planning pass. No audit row, report or event per lease, so it is a ceiling for that fix (see
  `batched_ceiling`).

"Done" is the moment the last request has its answer: `do_submit_lease` decides synchronously, so every answered
request is already placed, queued or rejected. After each variant the database is checked: one lease per request,
leases by state, how many hold a live reservation, how many queued leases have a planned start, and the overcommit
query of the concurrency tests (`tests/leases/invariants.py`), which must return no rows.

`--stale` instead fills the fleet with the workload's best-effort leases, makes every node's heartbeat an hour old
and times one advance reservation's request (see `stale_fleet`).

`--profile` instead runs cProfile over sequential in-process submissions, once with the scheduler cache kept (one
worker) and once with it dropped before every call (what each of two alternating workers sees: the other one's
commit bumped the version), and prints the top functions and queries per submission.

    .venv/bin/python bench/bench_burst.py [--quick] [--nodes 1000] [--leases 10000] [--workers 2] [--threads T] [--only VARIANT] [--batched B] [--profile N] [--stale] [--reuse-fleet]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_heartbeats import (  # noqa: E402
    CONTENT_LENGTH,
    HEALTHZ,
    PG_SERVER,
    bench_env,
    exchange,
    fresh_postgres,
    http_load,
    pct,
    start_daphne,
    start_django,
    stop,
)

# This tree's migrations: the fleet template is kept per schema, so two trees measured in turn (a baseline and a
# change) each start from a template their code can write, without registering the fleet again.
MIGRATIONS = {(p.parent.parent.name, p.stem) for p in ROOT.glob("*/migrations/0*.py")}
BURST_DB = "slotkeeper_bench_burst"
FLEET_DB = "slotkeeper_bench_burst_fleet_" + hashlib.sha256(repr(sorted(MIGRATIONS)).encode()).hexdigest()[:8]
TARGET_S = 10.0
# Issue 12: lease requests answered per second over HTTP, as a share of the same servers' /healthz rate.
TARGET_SHARE = 0.25
FLOOR_S = (
    5.0  # how long the /healthz floor is measured, on the burst's own Daphne processes, before the burst
)
OPERATOR = "burst-operator"
NODE_CORES, NODE_MEM_MIB, NODE_DISK_GIB = 32, 131072, 2000
HEARTBEAT_EVERY_S = 5.0
LOG = Path("/tmp/slotkeeper_bench_burst_daphne.log")


# --- the workload ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    """One lease request, independent of when it is sent (an AR's start is relative to the send time)."""

    name: str
    type: str
    duration_s: float
    vnodes: tuple[tuple[float, int, int], ...]  # (cpu_cores, mem_mib, disk_gib)
    start_in_s: float | None = None

    def nodes(self) -> list[dict]:
        return [{"cpu_cores": c, "mem_mib": m, "disk_gib": d} for c, m, d in self.vnodes]

    def start(self, now: datetime) -> datetime | None:
        return None if self.start_in_s is None else now + timedelta(seconds=self.start_in_s)

    def spec(self, now: datetime):
        """The request as `do_submit_lease` takes it."""
        from leases import actions

        return actions.LeaseSpec(
            name=self.name,
            type=self.type,
            duration_s=self.duration_s,
            vnodes=self.nodes(),
            start=self.start(now),
        )

    def intent(self, now: datetime, actor):
        """The request stored as `do_submit_lease` stores it before it waits (an unsaved Lease in state `new`)."""
        from leases.models import Lease

        return Lease(
            name=self.name,
            type=self.type,
            submitted_at=now,
            requested_start=self.start(now),
            duration_s=self.duration_s,
            vnodes=self.nodes(),
            submitted_by=actor,
        )

    def body(self, now: datetime) -> dict:
        start = self.start(now)
        return {
            "name": self.name,
            "type": self.type,
            "duration_s": self.duration_s,
            "nodes": self.nodes(),
            "start": start.isoformat() if start else None,
        }


def workload(count: int, seed: int = 6) -> list[Ask]:
    rng = random.Random(seed)
    asks = []
    for i in range(count):
        kind = rng.choices(["best_effort", "immediate", "advance_reservation"], [90, 5, 5])[0]
        vms = []
        for _ in range(rng.randint(1, 4) if kind == "best_effort" else rng.randint(1, 2)):
            cores = rng.choices([1, 2, 4], [5, 3, 2])[0]
            vms.append((float(cores), cores * 4096, 20))
        start_in = rng.uniform(3600, 6 * 3600) if kind == "advance_reservation" else None
        asks.append(Ask(f"burst-{i:05d}", kind, rng.randint(1, 8) * 3600.0, tuple(vms), start_in))
    return asks


def demand_line(asks: list[Ask], nodes: int) -> str:
    cores = sum(c for a in asks for c, _, _ in a.vnodes)
    kinds = Counter(a.type for a in asks)
    mix = ", ".join(f"{n:,} {k}" for k, n in sorted(kinds.items()))
    vms = sum(len(a.vnodes) for a in asks)
    return (
        f"  {len(asks):,} leases ({mix}), {vms:,} VMs asking {cores:,.0f} cores;"
        f" the fleet has {nodes * NODE_CORES:,} ({cores / (nodes * NODE_CORES):.2f}x)"
    )


# --- the fleet ---------------------------------------------------------------------------------------------------


def build_fleet(nodes: int) -> str:
    """Registers and heartbeats `nodes` nodes through the actions, issues the operator's token, and copies the
    database aside as the template every variant starts from. Returns the operator's raw token."""
    from django.db import connections
    from django.utils import timezone

    from fleet import actions as fleet_actions
    from leases.instances.actions import nodes as node_actions
    from slotkeeper.management.commands.issue_token import issue

    now = timezone.now()
    report = fleet_actions.HealthReport(NODE_MEM_MIB, 8192, NODE_DISK_GIB * 0.9, 5.0, 0.5)
    for i in range(nodes):
        node, _ = fleet_actions.do_register_node(
            None,
            name=f"burst-{i:04d}",
            cpu_cores=NODE_CORES,
            mem_total_mib=NODE_MEM_MIB,
            disk_total_gib=NODE_DISK_GIB,
            capabilities=["kvm"],
            now=now,
        )
        node_actions.do_heartbeat(node, report, now=now)
    token = issue(OPERATOR, "operator", "burst benchmark")
    connections.close_all()
    admin(
        f'DROP DATABASE IF EXISTS "{FLEET_DB}" WITH (FORCE)',
        f'CREATE DATABASE "{FLEET_DB}" TEMPLATE "{BURST_DB}"',
    )
    return token


def fleet_size() -> int | None:
    """Nodes in the fleet template an earlier run left for this tree's schema, or None when there is none."""
    import psycopg

    try:
        with psycopg.connect(f"{PG_SERVER}/{FLEET_DB}", autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM fleet_node").fetchone()[0]
    except psycopg.Error:
        return None


def admin(*statements: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def reset_fleet() -> None:
    """The burst database back to the freshly built fleet (Django reconnects on its next query)."""
    from django.db import connections

    connections.close_all()
    admin(
        f'DROP DATABASE IF EXISTS "{BURST_DB}" WITH (FORCE)',
        f'CREATE DATABASE "{BURST_DB}" TEMPLATE "{FLEET_DB}"',
    )


class Heartbeats:
    """Stamps every node's last heartbeat each few seconds while a variant runs (see the module docstring)."""

    def __init__(self, database_url: str) -> None:
        self.url, self._stop = database_url, threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while True:
                conn.execute("UPDATE fleet_node SET last_heartbeat_at = now()")
                if self._stop.wait(HEARTBEAT_EVERY_S):
                    return

    def __enter__(self) -> Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- what a variant measured -------------------------------------------------------------------------------------


@dataclass
class Burst:
    """Answers by outcome ("accepted", "rejected", or an error name / HTTP status), latencies in s, wall time, and
    the CPU the submitting processes used."""

    answers: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    cpu_s: float = 0.0
    floor_per_s: float = 0.0  # the same servers' GET /healthz rate (the http variant only)
    passes: int = 0  # planning passes committed during the burst (the http variant only)
    # Where the machine's CPU went, in ms a request, for the burst and for its /healthz floor (the http variant only)
    split: dict[str, float] = field(default_factory=dict)
    floor_split: dict[str, float] = field(default_factory=dict)
    # From the Daphnes' /metrics over the burst, in ms: a pass's CPU by part, and the collector by generation.
    pass_parts: dict[str, float] = field(default_factory=dict)
    gc_ms: dict[str, float] = field(default_factory=dict)

    def merge(self, other: Burst) -> None:
        self.answers.update(other.answers)
        self.latencies.extend(other.latencies)
        self.cpu_s += other.cpu_s

    def line(self, name: str) -> str:
        ms = [x * 1000 for x in self.latencies]
        n = sum(self.answers.values())
        verdict = "PASS" if self.elapsed <= TARGET_S else f"FAIL (target {TARGET_S:g} s)"
        answers = ", ".join(f"{k} {v:,}" for k, v in sorted(self.answers.items()))
        out = (
            f"  {name:<16} done in {self.elapsed:8.1f} s  {n / self.elapsed:7.1f}/s"
            f"  p50 {pct(ms, 50):8.1f} ms  p99 {pct(ms, 99):8.1f} ms  CPU {self.cpu_s:6.1f} s  {verdict}\n"
            f"  {'':<16} answers: {answers}"
        )
        if self.floor_per_s:
            share = n / self.elapsed / self.floor_per_s
            out += (
                f"\n  {'':<16} the same servers' /healthz {self.floor_per_s:,.0f}/s: lease requests at "
                f"{share:.3f} of it, {'PASS' if share >= TARGET_SHARE else 'FAIL'} (target >= {TARGET_SHARE:g})"
            )
        if self.passes:
            out += f"\n  {'':<16} {self.passes:,} planning passes, {n / self.passes:.1f} requests a pass on average"
            if self.pass_parts:
                parts = ", ".join(f"{k} {v / self.passes:.2f}" for k, v in self.pass_parts.items())
                total = sum(self.pass_parts.values()) / self.passes
                out += f"\n  {'':<16} a pass's CPU, ms: {parts}; whole {total:.2f}"
        if self.gc_ms and self.cpu_s:
            spent = sum(self.gc_ms.values())
            parts = ", ".join(f"gen {k} {v:,.0f}" for k, v in self.gc_ms.items())
            out += (
                f"\n  {'':<16} garbage collector, ms: {parts}; "
                f"{100 * spent / (1000 * self.cpu_s):.1f} % of the Daphnes' CPU"
            )
        for label, split in (("a lease request", self.split), ("a /healthz", self.floor_split)):
            if split:
                parts = ", ".join(f"{k} {v:.2f}" for k, v in split.items())
                out += f"\n  {'':<16} machine CPU for {label}, ms: {parts}"
        if self.passes and self.pass_parts and self.split and self.floor_split:
            # The share's ceiling were the request cycle free: a request still costs its part of the passes and the
            # database's work; a /healthz what its Daphne, database and client spend (not the machine's other load).
            planned = sum(self.pass_parts.values()) / n + self.split["PostgreSQL"]
            floor = sum(v for k, v in self.floor_split.items() if k != "machine")
            out += (
                f"\n  {'':<16} its passes and PostgreSQL alone, ms: {planned:.2f} a request against {floor:.2f} "
                f"a /healthz: with a free request cycle, a share of at most {floor / planned:.3f}"
            )
        return out


class CpuMeter:
    """CPU used between `start` and `stop`, in ms a request: the Daphne processes; PostgreSQL's processes alive at
    the end (the servers' backends, the WAL writer; one that started in between counts whole); this process (the
    HTTP client); and the whole machine (every core's busy time: what the three leave is everything else)."""

    def __init__(self, daphnes: list) -> None:
        import psutil

        self.psutil = psutil
        self.daphnes = daphnes
        self.marks: tuple = ()

    def _now(self) -> tuple:
        psutil = self.psutil
        postgres = {}
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] == "postgres":
                with contextlib.suppress(psutil.Error):
                    postgres[proc.pid] = sum(proc.cpu_times()[:2])
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        return sum(sum(p.cpu_times()[:2]) for p in self.daphnes), postgres, time.process_time(), busy

    def start(self) -> None:
        self.marks = self._now()

    def stop(self, requests: int) -> dict[str, float]:
        (d0, pg0, c0, m0), (d1, pg1, c1, m1) = self.marks, self._now()
        pg = sum(cpu - pg0.get(pid, 0.0) for pid, cpu in pg1.items())
        ms = 1000 / max(requests, 1)
        split = {"Daphne": (d1 - d0) * ms, "PostgreSQL": pg * ms, "client": (c1 - c0) * ms}
        split["machine"] = (m1 - m0) * ms
        return split


def check(requested: int) -> tuple[bool, str]:
    """What the database holds after a burst, and whether it passes: one lease per request, every lease decided
    (placed, queued or rejected), no placed lease without a live reservation, and no overcommit at any instant."""
    from django.db.models import Count

    from leases.models import LIVE_RESERVATION_STATUSES, Lease, Reservation
    from tests.leases.invariants import overcommitted_instants

    states = dict(Lease.objects.values_list("state").annotate(n=Count("id")).order_by())
    holding = set(
        Reservation.objects.filter(status__in=LIVE_RESERVATION_STATUSES).values_list("lease_id", flat=True)
    )
    queued = set(Lease.objects.filter(state="queued").values_list("id", flat=True))
    placed_states = {"scheduled", "preparing", "ready", "active"}
    placed = set(Lease.objects.filter(state__in=placed_states).values_list("id", flat=True))
    undecided = sum(n for s, n in states.items() if s not in placed_states | {"queued", "rejected"})
    over = overcommitted_instants()
    total = sum(states.values())
    ok = total == requested and not undecided and placed <= holding and not over
    text = (
        f"  {'':<16} leases {total:,} of {requested:,}: "
        + ", ".join(f"{s} {n:,}" for s, n in sorted(states.items()))
        + f"; placed without a live reservation {len(placed - holding)}"
        + f"; queued with a planned start {len(queued & holding)} of {len(queued):,}"
        + f"; overcommitted instants {len(over)}"
        + ("" if ok else "  CHECK FAILED")
    )
    return ok, text


# --- in-process: W processes calling do_submit_lease -------------------------------------------------------------


def submit_worker(database_url: str, asks: list[Ask], threads: int, ready: Barrier, out: Queue) -> None:
    """One worker process: set Django up, wait for the others, submit its share from `threads` threads (each one
    request at a time, as a server thread serves one request), report what it measured."""
    os.environ.update(bench_env(database_url))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.utils import timezone

    from leases import actions

    actor = get_user_model().objects.get(username=OPERATOR)
    burst = Burst()
    lock = threading.Lock()

    def run(share: list[Ask]) -> None:
        for ask in share:
            t = time.perf_counter()
            now = timezone.now()
            spec = ask.spec(now)
            try:
                done = actions.do_submit_lease(actor, spec, now=now)
                outcome = "accepted" if done.decision.accepted else "rejected"
            except Exception as exc:  # a failed request is counted and shown, not allowed to stop the burst
                outcome = type(exc).__name__
            with lock:
                burst.answers[outcome] += 1
                burst.latencies.append(time.perf_counter() - t)
        connections.close_all()

    ready.wait()
    cpu = time.process_time()
    if threads == 1:
        run(asks)
    else:
        pool = [threading.Thread(target=run, args=(asks[k::threads],)) for k in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    burst.cpu_s = time.process_time() - cpu
    connections.close_all()
    out.put(burst)


def in_process(database_url: str, asks: list[Ask], workers: int, threads: int = 1) -> Burst:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [
        ctx.Process(target=submit_worker, args=(database_url, asks[k::workers], threads, ready, out))
        for k in range(workers)
    ]
    for p in procs:
        p.start()
    ready.wait()
    started = time.perf_counter()
    total = Burst()
    for _ in procs:
        total.merge(out.get())
    total.elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
    return total


def batched_ceiling(asks: list[Ask], batch: int) -> Burst:
    """The suggested group commit, approximated from outside the application: `batch` requests share one
    `passes.planning` pass (one lock, one fleet read, one journal write), each submitted with `defer=True` and the
    queue processed once. It writes the Lease rows and the journal as the action does, but no audit row, no
    PlacementReport and no event per lease, so it is a ceiling for that fix, not what the API does."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from leases.models import Lease
    from leases.planning import passes, records

    actor = get_user_model().objects.get(username=OPERATOR)
    burst = Burst()
    started, cpu = time.perf_counter(), time.process_time()
    for k in range(0, len(asks), batch):
        t = time.perf_counter()
        now = timezone.now()
        with passes.planning(now) as plan:
            rows = Lease.objects.bulk_create(a.intent(now, actor) for a in asks[k : k + batch])
            for lease in rows:
                decision = plan.scheduler.submit(records.request_of(lease), plan.t, plan.excluded, defer=True)
                burst.answers["accepted" if decision.accepted else "rejected"] += 1
            plan.scheduler.advance(plan.t, plan.excluded)
        # Every request of a batch waits for the whole batch.
        burst.latencies.extend([time.perf_counter() - t] * len(rows))
    burst.elapsed, burst.cpu_s = time.perf_counter() - started, time.process_time() - cpu
    return burst


def stored_ceiling(asks: list[Ask]) -> Burst:
    """Every request stored as an intent first, then planning passes until every one is decided (see the module
    docstring). A request's latency is the time from the start to the commit of the pass that decided it."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from leases.models import Lease, LeaseState
    from leases.planning import passes

    actor = get_user_model().objects.get(username=OPERATOR)
    now = timezone.now()
    Lease.objects.bulk_create(a.intent(now, actor) for a in asks)
    burst = Burst()
    started, cpu = time.perf_counter(), time.process_time()
    waiting = len(asks)
    while waiting:
        with passes.planning(timezone.now()):
            pass
        left = Lease.objects.filter(state=LeaseState.NEW).count()
        burst.latencies.extend([time.perf_counter() - started] * (waiting - left))
        waiting = left
    burst.elapsed, burst.cpu_s = time.perf_counter() - started, time.process_time() - cpu
    decided = Lease.objects.exclude(state=LeaseState.NEW).values_list("state", flat=True)
    burst.answers.update("rejected" if state == LeaseState.REJECTED else "accepted" for state in decided)
    return burst


def stale_fleet(asks: list[Ask], url: str) -> None:
    """The workload's best-effort requests placed or queued (stored, then passes), every node's last heartbeat
    then an hour old (the agents went quiet, so every node is excluded), and one advance reservation requested
    through `do_submit_lease`, twice. Nothing can take it and the answer is a rejection; its time is how long
    its pass held the plan lock, which every other request waits for."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from leases import actions
    from leases.models import Lease

    with Heartbeats(url):
        stored_ceiling([a for a in asks if a.type == "best_effort"])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE fleet_node SET last_heartbeat_at = now() - interval '1 hour'")
    running = Lease.objects.filter(state__in=["active", "ready"]).count()
    actor = get_user_model().objects.get(username=OPERATOR)
    ask = Ask("stale-fleet-ar", "advance_reservation", 3600, ((4, 16384, 10),) * 2, 7200)
    for _ in range(2):
        now = timezone.now()
        started = time.perf_counter()
        got = actions.do_submit_lease(actor, ask.spec(now), now=now)
        print(
            f"  every node stale, {running:,} leases running: an advance reservation answered in "
            f"{time.perf_counter() - started:.2f} s ({'accepted' if got.decision.accepted else 'rejected'})",
            flush=True,
        )


# --- over HTTP: two Daphne processes -----------------------------------------------------------------------------


def lease_request(ask: Ask, token: str, minimal: bool = False) -> bytes:
    from django.utils import timezone

    body = json.dumps(ask.body(timezone.now())).encode()
    prefer = "Prefer: return=minimal\r\n" if minimal else ""
    return (
        f"POST /api/leases/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{prefer}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def http_burst(
    ports: list[int], asks: list[Ask], token: str, connections: int, minimal: bool = False
) -> Burst:
    """Every request queued at once; `connections` keep-alive connections spread over `ports` each take the next
    one as soon as their previous answer is in."""
    burst, pending = Burst(), list(reversed(asks))

    async def connection(k: int) -> None:
        port = ports[k % len(ports)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while pending:
            ask = pending.pop()
            t = time.perf_counter()
            try:
                status = await exchange(reader, writer, lease_request(ask, token, minimal))
            except (asyncio.IncompleteReadError, ConnectionError):
                burst.answers["dropped"] += 1
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            burst.answers[{201: "accepted", 409: "rejected"}.get(status, f"HTTP {status}")] += 1
            burst.latencies.append(time.perf_counter() - t)
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection(k) for k in range(connections)))
    burst.elapsed = time.perf_counter() - started
    return burst


ARRAY = 1000  # the batch endpoint's most items a request


def batch_request(asks: list[Ask], token: str) -> bytes:
    from django.utils import timezone

    now = timezone.now()
    body = json.dumps({"leases": [ask.body(now) for ask in asks]}).encode()
    return (
        f"POST /api/leases/batch HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Prefer: return=minimal\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def exchange_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple:
    """One request on a keep-alive connection; its status and its JSON body."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    body = b""
    if b"transfer-encoding: chunked" in head.lower():
        while size := int((await reader.readline()).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readexactly(2)
    elif m := CONTENT_LENGTH.search(head):
        body = await reader.readexactly(int(m.group(1)))
    return int(head[9:12]), json.loads(body) if body else None


async def http_arrays(ports: list[int], asks: list[Ask], token: str, connections: int) -> Burst:
    """The same leases as lease arrays of ARRAY items (`POST /api/leases/batch`), every array queued at once on
    up to `connections` keep-alive connections; every item's own status is counted, and a latency is an array's."""
    burst = Burst()
    pending = [asks[i : i + ARRAY] for i in range(0, len(asks), ARRAY)][::-1]
    count = min(connections, len(pending))

    async def connection(k: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[k % len(ports)])
        while pending:
            chunk = pending.pop()
            t = time.perf_counter()
            status, answer = await exchange_json(reader, writer, batch_request(chunk, token))
            burst.latencies.append(time.perf_counter() - t)
            if status != 200:
                burst.answers[f"array HTTP {status}"] += len(chunk)
                continue
            results = answer["results"]
            if len(results) != len(chunk):
                burst.answers["items unanswered"] += len(chunk) - len(results)
            for item in results:
                burst.answers[
                    {201: "accepted", 409: "rejected"}.get(item["status"], f"item {item['status']}")
                ] += 1
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection(k) for k in range(count)))
    burst.elapsed = time.perf_counter() - started
    return burst


def plan_version() -> int:
    from leases.models import SchedulerState

    return SchedulerState.objects.filter(pk=1).values_list("version", flat=True).first() or 0


PASS_CPU = "slotkeeper_plan_pass_cpu_seconds_total{"
GC_SECONDS = "slotkeeper_gc_seconds_total{"


def scraped(port: int) -> dict[str, float]:
    """A Daphne's /metrics (unauthenticated, as probes are): its pass-CPU and collector counters by line."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        key: float(value)
        for key, _, value in (line.rpartition(" ") for line in text.splitlines())
        if key.startswith((PASS_CPU, GC_SECONDS))
    }


def over_http(
    database_url: str,
    asks: list[Ask],
    token: str,
    processes: int,
    connections: int,
    minimal: bool = False,
    arrays: bool = False,
) -> Burst:
    import psutil

    started = [start_daphne(database_url, LOG, None) for _ in range(processes)]
    try:
        procs = [psutil.Process(p.pid) for p, _ in started]
        ports = [port for _, port in started]
        # The floor first, on the same processes and connections: what these servers answer when a request
        # does nothing (the issue's yardstick for lease requests a second).
        meter = CpuMeter(procs)
        meter.start()
        floor = asyncio.run(http_load(ports, [HEALTHZ], connections, FLOOR_S))
        floor_split = meter.stop(floor.accepted)
        cpu, version = sum(sum(p.cpu_times()[:2]) for p in procs), plan_version()
        meter.start()
        counted = [scraped(port) for port in ports]
        if arrays:
            burst = asyncio.run(http_arrays(ports, asks, token, connections))
        else:
            burst = asyncio.run(http_burst(ports, asks, token, connections, minimal))
        burst.split = meter.stop(len(asks))
        after = [scraped(port) for port in ports]
        spent = {
            k: sum(a.get(k, 0.0) - b.get(k, 0.0) for a, b in zip(after, counted, strict=True))
            for k in after[0]
        }
        burst.pass_parts = {k.split('"')[1]: 1000 * v for k, v in spent.items() if k.startswith(PASS_CPU)}
        burst.gc_ms = {k.split('"')[1]: 1000 * v for k, v in spent.items() if k.startswith(GC_SECONDS)}
        burst.floor_split = floor_split
        burst.cpu_s = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu
        # The batch the group commit made of the burst: each pass bumps the version once (these Daphnes run no
        # tick, so every bump is a pass that planned requests).
        burst.passes = plan_version() - version
        burst.floor_per_s = floor.per_s
    finally:
        for proc, _ in started:
            stop(proc)
    return burst


# --- profile -----------------------------------------------------------------------------------------------------


# Where a submission's time goes: (label, file suffix, function) for pstats' cumulative times. The lines overlap
# (planning contains load and apply); each is a share of the whole submission.
PARTS = [
    ("do_submit_lease (the whole submission)", "leases/actions.py", "do_submit_lease"),
    ("  passes.planning: lock, version, nodes, write-back", "leases/planning/passes.py", "planning"),
    ("    restore.load: every live lease re-read", "leases/planning/restore.py", "load"),
    ("    placement.read_fleet: every node's row", "fleet/placement.py", "read_fleet"),
    ("    applying.apply: the journal written", "leases/planning/applying.py", "apply"),
    ("      _sync_instances", "leases/planning/applying.py", "_sync_instances"),
    ("  Scheduler.submit (pure planning)", "leases/scheduler.py", "submit"),
    ("  _report: a PlacementReport, a verdict per node", "leases/actions.py", "_report"),
    ("  _group_exclusions", "leases/actions.py", "_group_exclusions"),
    ("  audit.record", "slotkeeper/audit.py", "record"),
    ("  refresh_from_db", "django/db/models/base.py", "refresh_from_db"),
]


def shares(prof: object, calls: int) -> list[str]:
    """Each part of PARTS as milliseconds per submission and as a share of the whole submission."""
    import pstats

    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    cums = [
        sum(v[3] for (f, _, fn), v in stats.items() if fn == name and f.endswith(suffix))
        for _, suffix, name in PARTS
    ]
    whole = cums[0] or 1.0
    return [
        f"   {label:<52}{1000 * cum / calls:8.1f} ms  {100 * cum / whole:4.0f} %"
        for (label, _, _), cum in zip(PARTS, cums, strict=True)
    ]


def fleet_read_ms(times: int = 20) -> float:
    """What `planning` pays on every call before it plans: every Node row of the fleet as a model instance."""
    from fleet.models import Node

    started = time.perf_counter()
    for _ in range(times):
        list(Node.objects.order_by("id"))
    return 1000 * (time.perf_counter() - started) / times


def profile(asks: list[Ask], keep_cache: bool) -> None:
    """cProfile over sequential submissions in this process, with the queries each one runs."""
    import cProfile
    import pstats

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from leases import actions
    from leases.planning import restore

    actor = get_user_model().objects.get(username=OPERATOR)
    prof, queries = cProfile.Profile(), []
    count = [0]

    def counted(execute, sql, params, many, context):
        count[0] += 1
        return execute(sql, params, many, context)

    started = time.perf_counter()
    with connection.execute_wrapper(counted):
        for ask in asks:
            now = timezone.now()
            spec = ask.spec(now)
            if not keep_cache:
                restore.drop_cache()
            count[0] = 0
            prof.enable()
            actions.do_submit_lease(actor, spec, now=now)
            prof.disable()
            queries.append(count[0])
    elapsed = time.perf_counter() - started
    label = (
        "cache kept (one worker)"
        if keep_cache
        else "cache dropped before each call (two alternating workers)"
    )
    print(f"\n== {len(asks):,} sequential submissions, {label}: {elapsed:.1f} s, {len(asks) / elapsed:.1f}/s")
    print(
        f"   queries per submission: first {queries[0]}, median {sorted(queries)[len(queries) // 2]},"
        f" last {queries[-1]}, max {max(queries)}"
    )
    print(f"   {'part (cumulative, per submission)':<52}{'time':>11}  {'share':>5}")
    print("\n".join(shares(prof, len(asks))))
    print(f"   for scale, outside the profiler: {fleet_read_ms():.1f} ms to read the fleet's Node rows once")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(15)


# --- main --------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 nodes, 1,000 leases, two workers only")
    parser.add_argument("--nodes", type=int, default=None, help="default 1,000 (100 with --quick)")
    parser.add_argument("--leases", type=int, default=None, help="default 10,000 (1,000 with --quick)")
    parser.add_argument("--workers", type=int, default=2, help="submitting processes in every variant")
    parser.add_argument("--connections", type=int, default=32, help="HTTP keep-alive connections")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="submitting threads in each in-process worker (more than 1 lets the group commit batch)",
    )
    parser.add_argument(
        "--only",
        choices=["in-process", "threads", "http", "arrays", "stored", "batched"],
        default=None,
        help="run one variant (threads: only in-process x W x T)",
    )
    parser.add_argument(
        "--batched", type=int, default=0, metavar="B", help="also the group-commit ceiling, B requests a pass"
    )
    parser.add_argument(
        "--reuse-fleet",
        action="store_true",
        help="start from the fleet template an earlier run left, when it has as many nodes (not for http)",
    )
    parser.add_argument(
        "--stale",
        action="store_true",
        help="instead: one advance reservation on a busy fleet whose nodes are all stale",
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="profile N sequential submissions"
    )
    args = parser.parse_args()
    # The connection pool keeps connections open after close_all(), and copying the fleet's template database
    # needs none open: the benchmark runs without it (DB_POOL=0) unless told otherwise.
    os.environ.setdefault("DB_POOL", "0")
    nodes = args.nodes or (100 if args.quick else 1000)
    count = args.leases or (1000 if args.quick else 10_000)
    asks = workload(count)

    t = time.perf_counter()
    if args.reuse_fleet and fleet_size() == nodes:
        if args.only in (None, "http"):
            parser.error("--reuse-fleet keeps no API token: run the http variant without it")
        admin(
            f'DROP DATABASE IF EXISTS "{BURST_DB}" WITH (FORCE)',
            f'CREATE DATABASE "{BURST_DB}" TEMPLATE "{FLEET_DB}"',
        )  # reset_fleet without Django, which is not set up yet
        url = f"{PG_SERVER}/{BURST_DB}"
        start_django(url)
        token, built = "", "copied from the last run's template"
    else:
        url = fresh_postgres(BURST_DB)
        start_django(url)
        token, built = build_fleet(nodes), "registered and heartbeated"
    load = os.getloadavg()
    print(f"lease burst on PostgreSQL, {nodes:,} nodes of {NODE_CORES} cores, {os.cpu_count()} cores here")
    print(f"  fleet {built} in {time.perf_counter() - t:.1f} s; load average {load[0]:.2f}")
    print(demand_line(asks, nodes))
    if args.stale:
        reset_fleet()
        stale_fleet(asks, url)
        return
    if args.profile:
        for keep in (True, False):
            reset_fleet()
            with Heartbeats(url):
                profile(asks[: args.profile], keep)
        return
    variants: list[tuple[str, Callable[[], Burst]]] = []
    counts = [args.workers] if args.quick or args.workers == 1 else [1, args.workers]
    if args.only in (None, "in-process"):
        variants += [(f"in-process x{w}", lambda w=w: in_process(url, asks, w)) for w in counts]
    if args.only in (None, "in-process", "threads") and args.threads > 1:
        variants += [
            (f"in-process x{w}x{args.threads}t", lambda w=w: in_process(url, asks, w, args.threads))
            for w in counts
        ]
    if args.only in (None, "http"):
        variants += [
            (
                f"http x{args.workers}{' minimal' if minimal else ''}",
                lambda minimal=minimal: over_http(url, asks, token, args.workers, args.connections, minimal),
            )
            for minimal in (False, True)
        ]
    if args.only == "arrays":
        # Issue 47's comparison: the same leases one per request over the connections, then as arrays.
        variants.append(
            (
                f"http x{args.workers} single",
                lambda: over_http(url, asks, token, args.workers, args.connections, True),
            )
        )
    if args.only in (None, "http", "arrays"):
        variants.append(
            (
                f"http x{args.workers} arrays of {ARRAY:,}",
                lambda: over_http(url, asks, token, args.workers, args.connections, arrays=True),
            )
        )
    if args.only in (None, "stored"):
        variants.append(("stored", lambda: stored_ceiling(asks)))
    if args.batched:
        variants.append((f"batched x{args.batched}", lambda: batched_ceiling(asks, args.batched)))
    passed = True
    for name, run in variants:
        reset_fleet()
        print(f"  ... {name}", file=sys.stderr, flush=True)
        with Heartbeats(url):
            burst = run()
        ok, text = check(count)
        print(burst.line(name))
        print(text)
        passed = passed and ok
    print(f"  load average after: {os.getloadavg()[0]:.2f}; database checks {'PASS' if passed else 'FAIL'}")


if __name__ == "__main__":
    main()
