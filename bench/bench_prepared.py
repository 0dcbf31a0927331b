"""Benchmark the statements every lease request runs on PostgreSQL, prepared once per connection
(settings DB_PREPARED_STATEMENTS, slotkeeper/statements.py) against the same statements bound on the client and
planned on every call (the baseline), alternating in the same run.

Four of them, as the API runs them: an API token's lookup (its user and groups joined), the fleet's distinct node
shapes (a lease request's size check, 1,000 nodes), a lease read back by id, and its placement report. Each figure
is per call: the server's CPU (this connection's backend process, from /proc/PID/schedstat) and this thread's CPU (Django
and the driver). A round runs every statement `--calls` times each way; the figure is the lowest of the rounds
(this host's speed drifts; the lowest is the least disturbed).

    .venv/bin/python bench/bench_prepared.py [--quick] [--calls 500] [--rounds 7]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_heartbeats import fresh_postgres, start_django
from bench_preview import make_node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 calls, 3 rounds")
    parser.add_argument("--calls", type=int, default=500, help="calls of each statement a round, each way")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    calls, rounds = (200, 3) if args.quick else (args.calls, args.rounds)

    start_django(fresh_postgres("slotkeeper_bench_prepared"))
    from django.db import connection
    from django.utils import timezone

    from fleet.models import Node, PlacementReport
    from leases.api.serializers import _check_sizes
    from leases.models import Lease
    from leases.reads import first_report, lease_row
    from slotkeeper import auth
    from slotkeeper.management.commands.issue_token import issue
    from slotkeeper.models import hash_token

    now, rng = timezone.now(), random.Random(12)
    nodes = [make_node(i, rng, now) for i in range(1000)]
    for node in nodes:
        node.token_digest = hash_token(f"skn_bench_{node.name}")
        # A fleet of a few machine types (make_node's idle readings would make every node a shape of its own).
        node.idle_baseline_mib = 4096
    Node.objects.bulk_create(nodes, batch_size=500)
    raw = issue("bench-operator", "operator")
    lease = Lease.objects.create(name="bench", type="best_effort", duration_s=60, submitted_at=now,
        vnodes=[{"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 1}])  # fmt: skip
    PlacementReport.objects.create(created_at=now, subject=f"lease:{lease.pk}", request={}, outcome="placed",
        message="", chosen=[], verdicts={}, requested_by="bench")  # fmt: skip
    vnodes = [{"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 1}]

    statements: list[tuple[str, Callable[[], object]]] = [
        ("an API token's lookup", lambda: auth.authenticate_token(raw)),
        ("the fleet's node shapes (1,000 nodes)", lambda: _check_sizes(vnodes)),
        ("a lease by id", lambda: lease_row(lease.pk)),
        ("its placement report", lambda: first_report(f"lease:{lease.pk}")),
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    schedstat = Path(f"/proc/{pid}/schedstat")  # the server's process: its first figure is ns on a CPU
    options = connection.settings_dict["OPTIONS"]
    assert options.get("prepare_threshold") is not None, "DB_PREPARED_STATEMENTS is off"

    def server_cpu() -> float:
        return int(schedstat.read_text().split()[0]) / 1e9

    def measure(run: Callable[[], object], prepared: bool) -> tuple[float, float]:
        with patch.dict(options, {} if prepared else {"prepare_threshold": None}):
            run()  # a first call prepares (and is not counted)
            server, client = server_cpu(), time.thread_time()
            for _ in range(calls):
                run()
            return server_cpu() - server, time.thread_time() - client

    ways = ("client-bound (baseline)", "prepared (now)")
    best = {(name, way): (float("inf"), float("inf")) for name, _ in statements for way in ways}
    for k in range(rounds):
        print(f"  round {k + 1}/{rounds}", file=sys.stderr, flush=True)
        for name, run in statements:
            for way in ways:
                server, client = measure(run, prepared=way == ways[1])
                old = best[(name, way)]
                best[(name, way)] = (min(old[0], server), min(old[1], client))

    print(
        f"the statements of a lease request on PostgreSQL, per call: lowest of {rounds} rounds of {calls} calls"
    )
    print(f"  {'statement':40s} {'way':26s} {'server CPU':>11s} {'client CPU':>11s}")
    totals = dict.fromkeys(ways, (0.0, 0.0))
    for name, _ in statements:
        for way in ways:
            server, client = (1000 * x / calls for x in best[(name, way)])
            totals[way] = (totals[way][0] + server, totals[way][1] + client)
            print(f"  {name:40s} {way:26s} {server:8.3f} ms {client:8.3f} ms")
    for way in ways:
        server, client = totals[way]
        print(f"  {'the four together':40s} {way:26s} {server:8.3f} ms {client:8.3f} ms")
    base, now_ = totals[ways[0]][0], totals[ways[1]][0]
    print(
        f"  prepared: {now_ / base:.2f} of the baseline's server CPU for the four, {base - now_:.3f} ms less a request"
    )


if __name__ == "__main__":
    main()
