"""Benchmark each replacement of framework behaviour (docs/overrides.md) against the framework's own path, in one run.

Each override is measured on the path it speeds, with it and without it (`SLOTKEEPER_OVERRIDES_OFF=<name>`),
alternating on/off and off/on round by round so that a drift of the shared machine falls on both:

- over HTTP, one Daphne started for each half of a round (PostgreSQL, the connection pool, 16 keep-alive
  connections, `--seconds` a request): the Daphne's CPU and its PostgreSQL backends' CPU (from /proc) divided by
  the requests answered, and the rate. handler, renderer, release_rendered, collector, statements, prepared,
  raw_body and heartbeat_route.
- in this process, lease requests one after another through `leases.actions.do_submit_lease` (each its own
  planning pass: the fleet read, the scheduler, the writes), then in arrays of `--array`
  (`do_submit_leases`: one pass decides the array, as a burst's group commit does), this thread's CPU and its
  backend's per lease: statements and bulk (a pass's writes are what bulk replaces).

Set-up (not timed): `--nodes` nodes bulk-created online with node tokens (bench_heartbeats.register_nodes), an
operator's API token, one lease placed on them. Health never goes stale during the run (HEALTH_MAX_AGE_S and the
offline and dead thresholds are a day). The database is `slotkeeper_overrides`, dropped and recreated.

    .venv/bin/python bench/bench_overrides.py [--only handler,bulk] [--rounds 3] [--seconds 3] [--nodes 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_burst import workload  # noqa: E402
from bench.bench_heartbeats import (  # noqa: E402
    HEALTHZ,
    fresh_postgres,
    heartbeat_request,
    http_load,
    register_nodes,
    start_daphne,
    start_django,
    stop,
)

DB = "slotkeeper_overrides"
LOG = Path("/tmp/slotkeeper_bench_overrides.log")
CONNECTIONS = 16
OPERATOR = "overrides-bench"
PREVIEW_BODY = {"mem_mib": 8192, "disk_gib": 12, "cpu_cores": 2.0, "capabilities": ["kvm"], "count": 1}

# The requests each HTTP-measured override is timed on: the path it speeds.
HTTP = {
    "handler": ["alerts", "lease"],
    "handler_threads": ["alerts", "lease"],
    "handler_one_hop": ["alerts", "lease"],
    "renderer": ["lease"],
    "release_rendered": ["lease", "preview"],
    "collector": ["lease", "preview"],
    "statements": ["alerts", "lease"],
    "prepared": ["alerts", "lease"],
    "raw_body": ["heartbeat", "preview"],
    "heartbeat_route": ["heartbeat"],
}
IN_PROCESS = ["statements", "bulk"]


def requests(token: str, lease_id: int, nodes: list[tuple[int, str]]) -> dict[str, list[bytes]]:
    auth = f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
    body = json.dumps(PREVIEW_BODY).encode()
    return {
        "healthz": [HEALTHZ],
        "alerts": [f"GET /api/alerts/?limit=1 HTTP/1.1\r\n{auth}\r\n".encode()],
        "lease": [f"GET /api/leases/{lease_id}/ HTTP/1.1\r\n{auth}\r\n".encode()],
        "preview": [
            f"POST /api/placement/preview HTTP/1.1\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        ],
        "heartbeat": [heartbeat_request(node_id, raw) for node_id, raw in nodes],
    }


def backends(url: str) -> dict[int, float]:
    """CPU seconds (user + system) of every PostgreSQL backend connected to the benchmark's database."""
    import psutil
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [DB]
            )
        ]
    out = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out[pid] = sum(psutil.Process(pid).cpu_times()[:2])
    return out


def over_http(url: str, off: str, asks: dict[str, list[bytes]], names: list[str], seconds: float) -> dict:
    """Per request name: (answered a second, Daphne CPU ms a request, its backends' CPU ms a request, refused)."""
    import psutil

    if off:
        os.environ["SLOTKEEPER_OVERRIDES_OFF"] = off
    try:
        proc, port = start_daphne(url, LOG, None)
    finally:
        os.environ.pop("SLOTKEEPER_OVERRIDES_OFF", None)
    try:
        daphne = psutil.Process(proc.pid)
        for name in names:  # warm: imports, first queries, the token caches
            asyncio.run(http_load([port], asks[name], 4, 0.5))
        out = {}
        for name in names:
            pg0 = backends(url)
            cpu0 = sum(daphne.cpu_times()[:2])
            run = asyncio.run(http_load([port], asks[name], CONNECTIONS, seconds))
            cpu = sum(daphne.cpu_times()[:2]) - cpu0
            pg1 = backends(url)
            pg = sum(v - pg0.get(pid, 0.0) for pid, v in pg1.items())
            answered = max(1.0, run.per_s * run.elapsed)
            out[name] = (run.per_s, cpu / answered * 1000, pg / answered * 1000, dict(run.refused))
        return out
    finally:
        stop(proc)


def in_process(user, url: str, off: str, count: int, first: int, array: int = 0) -> tuple[float, float]:
    """`count` lease requests one after another, or in arrays of `array` (each array one planning pass); (this
    thread's CPU ms, its backend's CPU ms) a lease."""
    import psutil
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from leases.actions import BatchItem, do_submit_lease, do_submit_leases

    settings.OVERRIDES_OFF = frozenset([off] if off else [])
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = psutil.Process(cursor.fetchone()[0])
        asks = workload(first + count, seed=49)[first:]
        pg0, cpu0 = sum(backend.cpu_times()[:2]), time.thread_time()
        if array:
            for i in range(0, count, array):
                now = timezone.now()
                do_submit_leases(user, [BatchItem(a.spec(now)) for a in asks[i : i + array]], now=now)
        for ask in [] if array else asks:
            now = timezone.now()
            do_submit_lease(user, ask.spec(now), now=now)
        cpu = time.thread_time() - cpu0
        pg = sum(backend.cpu_times()[:2]) - pg0
        return cpu / count * 1000, pg / count * 1000
    finally:
        settings.OVERRIDES_OFF = frozenset()


def json_text(url: str, rounds: int, inserts: int = 200) -> None:
    """fleet.models.JSONTextField: the verdicts of the 1,000-node report this run stored, inserted `inserts` times
    into a text column (as stored) and into a jsonb column (Django's JSONField on PostgreSQL), alternating; the
    backend's CPU a row. Not switchable at run time (it is the column's type), so measured on the statement."""
    import psutil
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        (doc,) = conn.execute(
            "SELECT verdicts FROM fleet_placementreport ORDER BY id DESC LIMIT 1"
        ).fetchone()
        backend = psutil.Process(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        conn.execute("CREATE TEMP TABLE as_text (v text)")
        conn.execute("CREATE TEMP TABLE as_jsonb (v jsonb)")
        on, off = [], []
        for r in range(rounds):
            for table in ("as_text", "as_jsonb") if r % 2 == 0 else ("as_jsonb", "as_text"):
                cpu0 = sum(backend.cpu_times()[:2])
                for _ in range(inserts):
                    conn.execute(f"INSERT INTO {table} (v) VALUES (%s)", [doc])
                ms = (sum(backend.cpu_times()[:2]) - cpu0) / inserts * 1000
                (on if table == "as_text" else off).append(ms)
                print(
                    f"  json_text        round {r + 1} {table:<8} {len(doc):,} bytes  PostgreSQL {ms:6.3f} ms a row"
                )
    print(
        f"= json_text        report row  PostgreSQL CPU ms an INSERT: text {spread(on)}, jsonb {spread(off)}; "
        f"gain {gain(on, off)} of the INSERT",
        flush=True,
    )


def twisted_parse(rounds: int, n: int = 3000) -> None:
    """raw_body on Twisted alone: a heartbeat's POST fed to an HTTPChannel and answered, with the request class's
    parsePOSTFormSubmission off (as RawBodyRequest) and on (Twisted's default); this thread's CPU a request. The
    HTTP figures carry the whole request's noise; this is the part the override removes."""
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    body = json.dumps({"mem_total_mib": 61440, "mem_used_mib": 6144, "disk_free_gib": 400.0, "instances": []})
    raw = (
        f"POST /api/nodes/7/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer skn_x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()

    def per_request(parse: bool) -> float:
        class Answered(http.Request):
            def __init__(self, *a, **k):
                super().__init__(*a, **{**k, "parsePOSTFormSubmission": parse})

            def process(self):
                self.setResponseCode(200)
                self.finish()

        channel, transport = http.HTTPChannel(), StringTransport()
        channel.requestFactory = Answered
        channel.makeConnection(transport)
        began = time.thread_time()
        for _ in range(n):
            channel.dataReceived(raw)
            transport.clear()
        return (time.thread_time() - began) / n * 1000

    on, off = [], []
    for r in range(rounds):
        for parse in (False, True) if r % 2 == 0 else (True, False):
            (off if parse else on).append(per_request(parse))
    print(
        f"= raw_body         Twisted    CPU ms a heartbeat POST parsed and answered: raw {spread(on, '{:.4f}')}, "
        f"parsed {spread(off, '{:.4f}')}; {(statistics.median(off) - statistics.median(on)) * 1000:.0f} us less",
        flush=True,
    )


def gain(on: list[float], off: list[float]) -> str:
    a, b = statistics.median(on), statistics.median(off)
    return f"{(b - a) / b * 100:+.1f} %" if b else "n/a"


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0, help="each request's phase over HTTP")
    parser.add_argument("--rounds", type=int, default=3, help="on/off pairs, alternating which comes first")
    parser.add_argument("--leases", type=int, default=40, help="in-process lease requests a half-round")
    parser.add_argument(
        "--array", type=int, default=50, help="in process: also arrays of this many, two a half"
    )
    parser.add_argument("--only", default="", help="comma-separated override names (default: every one)")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n] or [*sorted(set(HTTP) | set(IN_PROCESS)), "json_text"]

    # Nothing goes stale while the benchmark runs: placement sees the same fleet in every half.
    for name in ("HEALTH_MAX_AGE_S", "OFFLINE_AFTER_S", "DEAD_AFTER_S"):
        os.environ[f"SLOTKEEPER_{name}"] = "86400"
    url = fresh_postgres(DB)
    start_django(url)
    nodes = register_nodes(args.nodes)
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.utils import timezone

    from leases.actions import do_submit_lease
    from slotkeeper.management.commands.issue_token import issue

    token = issue(OPERATOR, "operator", "overrides benchmark")
    user = get_user_model().objects.get(username=OPERATOR)
    first = workload(1, seed=49)[0]
    lease_id = do_submit_lease(user, first.spec(timezone.now()), now=timezone.now()).lease.pk
    connections.close_all()
    asks = requests(token, lease_id, nodes)
    print(
        f"overrides on PostgreSQL, {args.nodes:,} nodes; over HTTP one Daphne, {CONNECTIONS} connections, "
        f"{args.seconds:g} s a request; {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    started = 1
    for name in only:
        if name in HTTP:
            figures: dict[str, dict[str, list]] = {}
            for r in range(args.rounds):
                order = ("", name) if r % 2 == 0 else (name, "")
                for off in order:
                    label = "off" if off else "on"
                    got = over_http(url, off, asks, HTTP[name], args.seconds)
                    for req, (per_s, cpu, pg, refused) in got.items():
                        row = figures.setdefault(req, {"on": [], "off": [], "on_s": [], "off_s": []})
                        row[label].append(cpu + pg)
                        row[label + "_s"].append(per_s)
                        bad = f"  other answers {refused}" if refused else ""
                        print(
                            f"  {name:<16} round {r + 1} {label:<3} {req:<10} {per_s:8,.0f}/s  "
                            f"Daphne {cpu:6.3f} + PostgreSQL {pg:6.3f} ms a request{bad}",
                            flush=True,
                        )
            for req, row in figures.items():
                print(
                    f"= {name:<16} {req:<10} server CPU ms a request: on {spread(row['on'])}, off {spread(row['off'])}"
                    f"; gain {gain(row['on'], row['off'])};  rate on {spread(row['on_s'], '{:,.0f}')}/s, "
                    f"off {spread(row['off_s'], '{:,.0f}')}/s",
                    flush=True,
                )
        for array in [0, args.array] if name in IN_PROCESS else []:
            kind = f"arrays of {array}" if array else "one by one"
            count = 2 * array if array else args.leases
            on, off_ = [], []
            for r in range(args.rounds):
                order = ("", name) if r % 2 == 0 else (name, "")
                for off in order:
                    cpu, pg = in_process(user, url, off, count, started, array)
                    started += count
                    (off_ if off else on).append(cpu + pg)
                    print(
                        f"  {name:<16} round {r + 1} {'off' if off else 'on':<3} {kind:<14} "
                        f"this thread {cpu:6.3f} + PostgreSQL {pg:6.3f} ms a lease",
                        flush=True,
                    )
            print(
                f"= {name:<16} {kind:<14} CPU ms a lease request: on {spread(on)}, off {spread(off_)}; "
                f"gain {gain(on, off_)}",
                flush=True,
            )
    if "raw_body" in only:
        twisted_parse(max(args.rounds, 5))
    if "json_text" in only:
        json_text(url, args.rounds)
    print(f"done; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
