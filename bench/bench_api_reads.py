"""Benchmark what one API request costs a Daphne process, this tree against a baseline ref in the same run.

Three requests, each sent for a few seconds over 16 keep-alive connections to one Daphne (the asyncio client of the
heartbeat benchmark), the process's CPU time divided by the requests answered:

- `GET /healthz`: the floor, answered before any middleware;
- `GET /api/alerts/?limit=1`: an API read that does almost nothing (token check, role, one page query): what the
  request cycle itself costs, and, as a share of `/healthz`'s rate in the same round, the ceiling on that share
  for any request Django's request cycle answers (issue 12's lease-request target is stated as such a share);
- `GET /api/leases/{id}/`: a lease whose placement report holds 1,000 nodes' verdicts.

Before those, the first `GET /api/alerts/?limit=1` a fresh Daphne answers (once it answers `/healthz`) and the one
after it, each timed alone on a new connection: what the first client after a start or a deploy waits.

Set-up (not timed): the lease burst's fleet (1,000 nodes registered and heartbeated through the actions, an operator
token) and one lease submitted in process. The baseline is a `git archive` of `--baseline-ref` (default `main`), served
by its own Daphne on the same database, so its schema must be this tree's; the two alternate `--rounds` times.

    .venv/bin/python bench/bench_api_reads.py [--nodes 1000] [--seconds 4] [--rounds 2] [--baseline-ref main]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_burst import BURST_DB, OPERATOR, build_fleet, workload  # noqa: E402
from bench.bench_heartbeats import (  # noqa: E402
    CONTENT_LENGTH,
    HEALTHZ,
    fresh_postgres,
    http_load,
    start_daphne,
    start_django,
    stop,
)
from bench.bench_slot_page import export  # noqa: E402

LOG = Path("/tmp/slotkeeper_bench_api_reads.log")
CONNECTIONS = 16
FIRST = "GET /api/alerts/?limit=1"


def requests(token: str, lease_id: int) -> dict[str, bytes]:
    auth = f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    return {
        "GET /healthz": HEALTHZ,
        FIRST: f"GET /api/alerts/?limit=1 HTTP/1.1\r\n{auth}".encode(),
        "GET /api/leases/{id}/ (1,000-node report)": f"GET /api/leases/{lease_id}/ HTTP/1.1\r\n{auth}".encode(),
    }


def answered_in(port: int, request: bytes) -> float:
    """Seconds from sending `request` alone on a new connection to its whole answer; the answer must be a 200."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        began = time.perf_counter()
        s.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            head += _more(s)
        header, _, body = head.partition(b"\r\n\r\n")
        length = int(CONTENT_LENGTH.search(header + b"\r\n").group(1))
        while len(body) < length:
            body += _more(s)
        took = time.perf_counter() - began
    assert header.startswith(b"HTTP/1.1 200"), header[:40]
    return took


def _more(s: socket.socket) -> bytes:
    chunk = s.recv(65536)
    if not chunk:
        raise SystemExit("Daphne closed the connection before its answer was complete")
    return chunk


def measure(database_url: str, tree: Path, asks: dict[str, bytes], seconds: float) -> dict[str, tuple]:
    """Per request: (answered a second, Daphne CPU ms a request, statuses other than 200); and under "first" the
    first and second answers' times after the start, in ms."""
    import psutil

    proc, port = start_daphne(database_url, LOG, None, repo=tree)
    try:
        daphne = psutil.Process(proc.pid)
        first = [answered_in(port, asks[FIRST]) * 1000 for _ in range(2)]
        asyncio.run(http_load([port], [next(iter(asks.values()))], 4, 1.0))  # warm: imports, first queries
        out: dict[str, tuple] = {"first": tuple(first)}
        for name, request in asks.items():
            before = sum(daphne.cpu_times()[:2])
            run = asyncio.run(http_load([port], [request], CONNECTIONS, seconds))
            answered = run.per_s * run.elapsed
            cpu = sum(daphne.cpu_times()[:2]) - before
            out[name] = (run.per_s, cpu / max(answered, 1) * 1000, dict(run.refused))
        return out
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=4.0, help="each request's phase")
    parser.add_argument("--rounds", type=int, default=2, help="this tree and the baseline, alternating")
    parser.add_argument("--baseline-ref", default="main")
    args = parser.parse_args()
    os.environ.setdefault("DB_POOL", "0")  # this process only: build_fleet copies the database as a template
    url = fresh_postgres(BURST_DB)
    start_django(url)
    token = build_fleet(args.nodes)
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.utils import timezone

    from leases.actions import do_submit_lease

    ask = workload(1)[0]
    user = get_user_model().objects.get(username=OPERATOR)
    lease_id = do_submit_lease(user, ask.spec(timezone.now()), now=timezone.now()).lease.pk
    connections.close_all()
    baseline = export(args.baseline_ref, ROOT)
    asks = requests(token, lease_id)
    print(
        f"API reads on PostgreSQL, {args.nodes:,} nodes, one Daphne, {CONNECTIONS} connections, "
        f"{args.seconds:g} s a request; load average {os.getloadavg()[0]:.2f}"
    )
    for r in range(args.rounds):
        for label, tree in (("this tree", ROOT), (args.baseline_ref, baseline)):
            got = measure(url, tree, asks, args.seconds)
            first, second = got.pop("first")
            print(
                f"  round {r + 1}  {label:<12} {'first ' + FIRST + ' after the start':<44} {first:7.1f} ms, the next {second:.1f} ms"
            )
            floor = got["GET /healthz"][0]
            for name, (per_s, cpu_ms, refused) in got.items():
                bad = f"  other answers {refused}" if refused else ""
                share = f"  {per_s / floor:5.3f} of /healthz" if name != "GET /healthz" and floor else ""
                print(
                    f"  round {r + 1}  {label:<12} {name:<44} {per_s:7,.0f}/s  {cpu_ms:6.2f} ms CPU{share}{bad}"
                )


if __name__ == "__main__":
    main()
