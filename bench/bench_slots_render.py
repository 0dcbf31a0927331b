"""Benchmark the server render of the slot table page (nodes x time as SVG) at console scale.

Target: p95 <= 300 ms for 1,000 nodes x 24 h x 10,000 reservations. Also 200 nodes x 24 h (2,000 reservations,
the same density).

Builds a fresh database (PostgreSQL by default), writes the rows directly with the ORM (Node, Lease,
Reservation, Allocation: one lease and one single-node reservation per bar, laid end to end on each node across
the window, some already done, some active, most scheduled), signs in a viewer with the Django test client and
times GET /slots/?zoom=24h&from=<window start>, as a full page and as the htmx fragment the live updates
re-fetch. Baseline in the same run: the same view, same nodes, over a window a week earlier that holds no
reservations, so the difference is what the bars cost.

Prints p50/p95 wall and CPU milliseconds, the bytes sent and the queries run.

    .venv/bin/python bench/bench_slots_render.py [--quick] [--db postgres|sqlite] [--repeat 20]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_heartbeats import fresh_postgres, fresh_sqlite, pct, start_django

TARGET_P95_MS = 300.0
SQLITE_PATH = Path("/tmp/slotkeeper_bench_slots.sqlite3")
DAY = timedelta(hours=24)
KINDS = ["vm"] * 8 + ["suspend", "resume"]


def build(nodes: int, reservations: int, start: datetime, now: datetime, rng: random.Random) -> None:
    """Replaces whatever is in the tables with `nodes` nodes and `reservations` bars inside [start, start + 24 h)."""
    from fleet.models import Node
    from leases.models import Allocation, Lease, Reservation
    from slotkeeper.models import hash_token

    Lease.objects.all().delete()
    Node.objects.all().delete()
    Node.objects.bulk_create(
        [
            Node(
                name=f"node-{i:04d}",
                cpu_cores=32,
                mem_total_mib=61440,
                disk_total_gib=500,
                status="draining" if i % 50 == 7 else "online",
                drain_reason="disk replacement" if i % 50 == 7 else "",
                token_digest=hash_token(f"skn_bench_{i}"),
            )
            for i in range(nodes)
        ],
        batch_size=500,
    )
    node_ids = list(Node.objects.order_by("name").values_list("id", flat=True))
    bars = [bar(k, node_ids, reservations, start, now, rng) for k in range(reservations)]
    leases = Lease.objects.bulk_create([b[0] for b in bars], batch_size=1000)
    for lease, (_, res, _) in zip(leases, bars, strict=True):
        res.lease = lease
    Reservation.objects.bulk_create([b[1] for b in bars], batch_size=1000)
    for _, res, alloc in bars:
        alloc.reservation = res
    Allocation.objects.bulk_create([b[2] for b in bars], batch_size=1000)


def bar(k: int, node_ids: list[int], total: int, start: datetime, now: datetime, rng: random.Random):
    """The k-th bar: node k mod N, its (k div N)-th slot of the day, with a random gap before its end."""
    from leases.models import Allocation, Lease, Reservation

    per_node = max(1, total // len(node_ids))
    node_id, slot = node_ids[k % len(node_ids)], k // len(node_ids)
    width = DAY / per_node
    s = start + width * slot
    e = s + width * rng.uniform(0.5, 0.95)
    status = "done" if e <= now else "active" if s <= now else "scheduled"
    kind = rng.choice(KINDS)
    lease = Lease(
        name=f"job-{k}",
        type=rng.choice(["best_effort", "best_effort", "advance_reservation", "immediate"]),
        state={"done": "done", "active": "active", "scheduled": "scheduled"}[status],
        submitted_at=start - timedelta(hours=1),
        requested_start=s,
        duration_s=(e - s).total_seconds(),
        vnodes=[{"cpu_cores": 2, "mem_mib": 8192, "disk_gib": 12}],
    )
    res = Reservation(rid=k + 1, kind=kind, start=s, end=e, status=status, nodes={"1": node_id})
    alloc = Allocation(node_id=node_id, start=s, end=e, live=status != "done", cpu=200, mem_mib=8192)
    return lease, res, alloc


def viewer_client():
    from django.contrib.auth import get_user_model
    from django.test import Client

    from slotkeeper.management.commands.issue_token import issue

    issue("vera", "viewer")
    client = Client()
    client.force_login(get_user_model().objects.get(username="vera"))
    return client


def time_view(client, url: str, repeat: int, htmx: bool) -> tuple[list[float], list[float], int]:
    """Wall and CPU ms of `repeat` renders (after one warm-up), and the size of the last response."""
    headers = {"HX-Request": "true"} if htmx else {}
    wall, cpu, size = [], [], 0
    for i in range(repeat + 1):
        t, c = time.perf_counter(), time.thread_time()
        resp = client.get(url, headers=headers)
        if resp.status_code != 200:
            raise SystemExit(f"{url} answered {resp.status_code}")
        if i:
            wall.append(1000 * (time.perf_counter() - t))
            cpu.append(1000 * (time.thread_time() - c))
        size = len(resp.content)
    return wall, cpu, size


def queries(client, url: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    return len(captured.captured_queries)


def report(client, nodes: int, reservations: int, start: datetime, repeat: int, target: float | None) -> None:
    loaded = f"/slots/?zoom=24h&from={start.isoformat()}".replace("+", "%2B")
    empty = f"/slots/?zoom=24h&from={(start - 7 * DAY).isoformat()}".replace("+", "%2B")
    print(f"{nodes:,} nodes x 24 h x {reservations:,} reservations, {repeat} renders each")
    print(
        f"  {'view':<34}{'wall p50':>9}{'wall p95':>10}{'cpu p50':>9}{'cpu p95':>9}{'KiB':>7}{'queries':>9}"
    )
    for label, url, htmx in [
        ("page, 0 reservations (baseline)", empty, False),
        ("page", loaded, False),
        ("htmx fragment, 0 reservations", empty, True),
        ("htmx fragment", loaded, True),
    ]:
        wall, cpu, size = time_view(client, url, repeat, htmx)
        print(
            f"  {label:<34}{pct(wall, 50):9.1f}{pct(wall, 95):10.1f}{pct(cpu, 50):9.1f}{pct(cpu, 95):9.1f}"
            f"{size / 1024:7.0f}{queries(client, url):9d}"
        )
        if target is not None and label == "page":
            verdict = "PASS" if pct(wall, 95) <= target else "FAIL"
            print(f"  {'':<34}page p95 {pct(wall, 95):.0f} ms wall: {verdict} against {target:g} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 renders per view instead of 20")
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    repeat = args.repeat or (5 if args.quick else 20)

    start_django(fresh_postgres() if args.db == "postgres" else fresh_sqlite(SQLITE_PATH))
    from django.utils import timezone

    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(hours=4)
    client = viewer_client()
    print(f"slot table render on {args.db}")
    for nodes, reservations, target in [(1000, 10_000, TARGET_P95_MS), (200, 2_000, None)]:
        print(f"  ... writing {nodes} nodes and {reservations} reservations", file=sys.stderr)
        build(nodes, reservations, start, now, random.Random(args.seed))
        report(client, nodes, reservations, start, repeat, target)


if __name__ == "__main__":
    main()
