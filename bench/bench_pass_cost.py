"""Benchmark what one planning pass costs by the number of requests it plans, and as the slot table fills.

Every lease request is decided by a planning pass (leases/planning/passes.py), which plans every request waiting
at once. A pass has a fixed part (the plan lock, the fleet's read, the version) and a part per request (placing it,
its 1,000-node report, its rows). This separates the two: bench_burst's fleet (1,000 nodes, PostgreSQL) and workload,
requests stored as intents as `do_submit_lease` stores them, then one pass, its CPU (`process_time`) measured.

- by batch: `--rounds` passes of each of 1, 5, 23 and 100 requests while the slot table is still nearly empty (at
  most 650 leases planned); the lowest CPU of each. 23 is the batch the HTTP burst makes over 32 connections, 100
  a large one. Beside it, the database's side, per request: the WAL the pass wrote and its PostgreSQL server
  process's CPU (the WAL the lowest of the rounds: heartbeats write some meanwhile; the CPU their mean).
- as it fills: passes of 100 requests until `--leases` are planned, every third printed.

    .venv/bin/python bench/bench_pass_cost.py [--quick] [--nodes 1000] [--leases 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_burst import BURST_DB, OPERATOR, Heartbeats, build_fleet, workload  # noqa: E402
from bench.bench_heartbeats import fresh_postgres, start_django  # noqa: E402

BATCHES = (1, 5, 23, 100)


class Passes:
    """Stores the workload's requests as intents, `count` at a time, and times the pass that plans them."""

    def __init__(self, leases: int) -> None:
        from django.contrib.auth import get_user_model

        self.asks = workload(leases)
        self.actor = get_user_model().objects.get(username=OPERATOR)
        self.taken = 0

    def one(self, count: int) -> float:
        """CPU seconds of the pass that plans the next `count` requests."""
        return self.measured(count)[0]

    def measured(self, count: int) -> tuple[float, int, float]:
        """The pass that plans the next `count` requests: its CPU seconds, the WAL bytes written while it ran, and
        its PostgreSQL server process's CPU seconds."""
        import psutil
        from django.db import connection
        from django.utils import timezone

        from leases.models import Lease, LeaseState
        from leases.planning import passes

        now = timezone.now()
        asks = self.asks[self.taken : self.taken + count]
        self.taken += len(asks)
        Lease.objects.bulk_create(a.intent(now, self.actor) for a in asks)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), pg_current_wal_lsn()")
            pid, lsn = cursor.fetchone()
        server = psutil.Process(pid)
        server_cpu = sum(server.cpu_times()[:2])
        cpu = time.process_time()
        with passes.planning(timezone.now()):
            pass
        took = time.process_time() - cpu
        server_cpu = sum(server.cpu_times()[:2]) - server_cpu
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", [lsn])
            wal = int(cursor.fetchone()[0])
        assert not Lease.objects.filter(state=LeaseState.NEW).exists(), "a pass left requests undecided"
        return took, wal, server_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 nodes, 1,000 leases, 3 rounds")
    parser.add_argument("--nodes", type=int, default=None, help="default 1,000 (200 with --quick)")
    parser.add_argument("--leases", type=int, default=None, help="default 3,000 (1,000 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="passes of each batch size (default 5)")
    args = parser.parse_args()
    nodes = args.nodes or (200 if args.quick else 1000)
    leases = args.leases or (1000 if args.quick else 3000)
    rounds = args.rounds or (3 if args.quick else 5)
    os.environ.setdefault("DB_POOL", "0")  # this process only: build_fleet copies the database as a template
    url = fresh_postgres(BURST_DB)
    start_django(url)
    build_fleet(nodes)
    passes = Passes(leases + 1 + rounds * sum(BATCHES))
    print(f"planning passes on PostgreSQL, {nodes:,} nodes; load average {os.getloadavg()[0]:.2f}")
    with Heartbeats(url):
        passes.one(1)  # the scheduler loaded, the statements compiled: not what a pass costs
        lowest = {}
        for count in BATCHES:
            runs = [passes.measured(count) for _ in range(rounds)]
            lowest[count] = min(cpu for cpu, _, _ in runs) * 1000
            wal = min(wal for _, wal, _ in runs) / count / 1024
            # The mean: the server's CPU is counted in clock ticks of 10 ms, a pass's share of a few.
            server = sum(server for _, _, server in runs) * 1000 / (count * rounds)
            print(
                f"  a pass of {count:>3}, {passes.taken:>4,} leases planned by now: {lowest[count]:6.1f} ms CPU "
                f"(lowest); PostgreSQL a request: {wal:5.1f} KiB of WAL (lowest), {server:5.2f} ms CPU (mean)"
            )
        fixed = (lowest[1] * 100 - lowest[100]) / 99
        print(f"  so about {fixed:.1f} ms a pass and {(lowest[100] - fixed) / 100:.2f} ms a request")
        step = 0
        while passes.taken + 100 <= len(passes.asks):
            cpu = passes.one(100) * 1000
            if step % 3 == 0:
                print(
                    f"  a pass of 100 with {passes.taken - 100:>5,} leases planned before: {cpu:6.1f} ms CPU"
                )
            step += 1


if __name__ == "__main__":
    main()
