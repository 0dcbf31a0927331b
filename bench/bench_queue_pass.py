"""Benchmark one lease request at a time against a 1,000-node fleet as it fills and a queue forms: the CPU a
request costs with leases queued, against the same run's requests before any queued (the baseline).

Each request is its own planning pass (nothing else is waiting), so whatever a pass does per queued lease is paid
by every request. Requests go through the API in process (DRF's APIClient, `Prefer: return=minimal`) on a fresh
PostgreSQL database with bench_preview's fleet (1,000 nodes, 0-6 running instances each, a few draining, dead or
stale); bench_burst's workload, each VM's memory times `--mem-scale` so the fleet fills within a few hundred
requests. `--mode fresh` keeps the heartbeats fresh (the fleet's own few stale nodes stay excluded); `--mode
stale` lets every heartbeat age past the 30 s health limit, so every node is excluded a little way in (a network
split, the web processes down); its memory scale defaults to 1, so the queue forms because no node is usable, not
because the fleet is full.

Prints, every `--step` requests, the wall and CPU milliseconds a request and the leases queued, then the CPU a
request once the queue formed against before it.

    .venv/bin/python bench/bench_queue_pass.py [--quick] [--mode fresh|stale] [--leases 900] [--mem-scale N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_heartbeats import fresh_postgres, start_django, use_collector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 requests")
    parser.add_argument("--mode", choices=["fresh", "stale"], default="fresh")
    parser.add_argument("--leases", type=int, default=900)
    parser.add_argument("--mem-scale", type=int, help="default: 4 with --mode fresh, 1 with stale")
    parser.add_argument("--step", type=int, default=50)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    count = 500 if args.quick else args.leases
    if args.mem_scale is None:
        args.mem_scale = 4 if args.mode == "fresh" else 1

    start_django(fresh_postgres())
    use_collector("service")
    import bench_burst
    import bench_preview
    from django.db.models import Count
    from django.utils import timezone
    from rest_framework.test import APIClient

    from leases.models import Lease
    from slotkeeper.management.commands.issue_token import issue

    bench_preview.build_fleet(1000, random.Random(7))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue('otto', 'operator')}")
    print(
        f"one lease request at a time, 1,000 nodes, {count} requests, heartbeats {args.mode}, memory x{args.mem_scale}",
        flush=True,
    )
    before: list[float] = []
    queued_cpu: list[tuple[int, float]] = []
    wall, cpu = time.perf_counter(), time.thread_time()
    for i, ask in enumerate(bench_burst.workload(count, seed=args.seed)):
        if args.mode == "fresh" and i % 10 == 0:
            bench_preview.keep_fresh()
        body = ask.body(timezone.now())
        for vm in body["nodes"]:
            vm["mem_mib"] *= args.mem_scale
        answer = client.post("/api/leases/", body, format="json", HTTP_PREFER="return=minimal")
        if answer.status_code not in (201, 409):
            raise SystemExit(f"lease request answered {answer.status_code}: {answer.content[:300]!r}")
        if (i + 1) % args.step == 0:
            states = dict(Lease.objects.values_list("state").annotate(n=Count("id")))
            queued = states.get("queued", 0)
            per_wall = 1e3 * (time.perf_counter() - wall) / args.step
            per_cpu = 1e3 * (time.thread_time() - cpu) / args.step
            print(
                f"  {i + 1:5d} requests  {per_wall:7.1f} ms wall  {per_cpu:7.1f} ms CPU a request  "
                f"queued {queued:4d}  active {states.get('active', 0)}",
                flush=True,
            )
            if queued:
                queued_cpu.append((queued, per_cpu))
            else:
                before.append(per_cpu)
            wall, cpu = time.perf_counter(), time.thread_time()
    if not before or not queued_cpu:
        print("  no queue formed (or it formed at once): raise --leases or --mem-scale")
        return
    base = sorted(before)[len(before) // 2]
    worst = max(c for _, c in queued_cpu)
    last_queued, last = queued_cpu[-1]
    print(
        f"  CPU a request: {base:.1f} ms before any queued (median); with a queue at most {worst:.1f} ms "
        f"({worst / base:.1f}x), {last:.1f} ms at {last_queued} queued ({last / base:.1f}x)"
    )


if __name__ == "__main__":
    main()
