"""Benchmark node-loss recovery on PostgreSQL: from nodes declared dead to every reschedule proposal ready, and bulk
approvals per second.

Target (issue 4): bulk approvals at least 500/s on PostgreSQL. The figure for "100 nodes declared dead (1,000 lost
instances) to all proposals ready" has no target in the issue; it is printed so changes can be compared.

Set-up: a fresh database, N nodes heartbeating, then leases of one VM each submitted through the action layer until
about ten instances stand on each node. Then the busiest nodes are declared dead one after another (each declare
runs the loss decision and a dry-run placement per instance), and the proposals are approved in bulk requests of
--batch ids. Baseline in the same run: the placer alone (capacity.place over the same fleet snapshot), i.e. the
floor for one dry-run placement.

    .venv/bin/python bench/bench_recovery.py [--quick] [--nodes 200] [--dead 100] [--batch 100]
        [--profile approvals.prof] [--db slotkeeper_bench_recovery]

The approval phase is also timed in CPU: this process's (process_time) and its PostgreSQL backend's (read from
/proc when the server runs on this machine and is readable), since on a shared machine the wall time says as much
about the other load as about Slotkeeper. `--profile FILE` writes a cProfile of the approval phase alone.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_heartbeats import fresh_postgres, start_django  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="40 nodes, 20 dead")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--dead", type=int, default=100)
    parser.add_argument("--per-node", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the approval phase to FILE")
    parser.add_argument(
        "--db", default="slotkeeper_bench_recovery", help="database name (dropped and created again)"
    )
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.dead = 40, 20
    start_django(fresh_postgres(args.db))

    from django.conf import settings
    from django.db.models import Count
    from django.utils import timezone

    from fleet import actions as fleet_actions
    from fleet import capacity, placement
    from leases import actions
    from leases.instances.actions import nodes as node_actions
    from leases.instances.actions import reschedules
    from leases.instances.models import Reschedule
    from leases.instances.reads import claims
    from leases.models import Instance

    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "HEALTH_MAX_AGE_S": 3600}
    now = timezone.now()
    for i in range(args.nodes):
        node, _ = fleet_actions.do_register_node(
            None,
            name=f"b{i:04d}",
            cpu_cores=64,
            mem_total_mib=262144,
            disk_total_gib=2000,
            capabilities=[],
            now=now,
        )
        node_actions.do_heartbeat(node, fleet_actions.HealthReport(262144, 4096, 1500.0, 5.0, 0.5), now=now)
    total = args.nodes * args.per_node
    print(f"submitting {total} one-VM leases to {args.nodes} nodes …", file=sys.stderr, flush=True)
    started = time.perf_counter()
    for i in range(total):
        spec = actions.LeaseSpec(
            name=f"r{i}",
            type="immediate",
            duration_s=86400,
            vnodes=[{"cpu_cores": 1, "mem_mib": 2048, "disk_gib": 1}],
        )
        actions.do_submit_lease(None, spec, now=timezone.now())
        if i and i % 500 == 0:
            print(f"  {i}/{total}", file=sys.stderr, flush=True)
    submit_s = time.perf_counter() - started
    busiest = list(
        Instance.objects.values("node_id").annotate(n=Count("id")).order_by("-n", "node_id")[: args.dead]
    )
    lost_expected = sum(row["n"] for row in busiest)

    # Baseline: the placer alone, for one instance over this fleet.
    states = placement.snapshot(timezone.now(), claims=claims())
    need = capacity.Need(mem_mib=2048, disk_gib=1, cpu_cores=1)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        capacity.place(states, need)
        times.append(time.perf_counter() - t0)
    place_ms = statistics.median(times) * 1000

    print(
        f"declaring {len(busiest)} nodes dead ({lost_expected} instances on them) …",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    for row in busiest:
        node_actions.do_declare_dead(None, row["node_id"], reason="bench", now=timezone.now())
    proposals_s = time.perf_counter() - started
    pending = list(Reschedule.objects.filter(status="pending").order_by("pk").values_list("pk", flat=True))

    print(f"approving {len(pending)} proposals in batches of {args.batch} …", file=sys.stderr, flush=True)
    profile = cProfile.Profile() if args.profile else None
    load_before = os.getloadavg()
    db_before = backend_cpu_s()
    cpu_started = time.process_time()
    started = time.perf_counter()
    applied = 0
    for i in range(0, len(pending), args.batch):
        if profile:
            profile.enable()
        results = reschedules.do_approve(None, pending[i : i + args.batch], now=timezone.now())
        if profile:
            profile.disable()
        applied += sum(r.ok for r in results)
    approve_s = time.perf_counter() - started
    approve_cpu_s = time.process_time() - cpu_started
    db_after = backend_cpu_s()
    load_after = os.getloadavg()
    if profile:
        profile.dump_stats(args.profile)
    rate = len(pending) / approve_s if approve_s else 0.0

    print(
        f"fleet: {args.nodes} nodes, {total} instances (submitted in {submit_s:.1f} s, {total / submit_s:.0f}/s)"
    )
    print(f"baseline: capacity.place over {args.nodes} nodes, p50 {place_ms:.2f} ms")
    print(
        f"node loss: {len(busiest)} nodes dead, {lost_expected} instances lost -> {len(pending)} proposals ready in "
        f"{proposals_s:.1f} s ({len(pending) / proposals_s:.0f} proposals/s, {proposals_s * 1000 / max(len(pending), 1):.1f} ms each)"
    )
    verdict = "PASS" if rate >= 500 else "FAIL"
    print(
        f"bulk approval: {len(pending)} approvals ({applied} applied) in {approve_s:.1f} s = {rate:.0f}/s "
        f"(target >= 500/s: {verdict})"
    )
    db_s = (
        f"{db_after - db_before:.2f} s" if db_before is not None and db_after is not None else "not readable"
    )
    print(
        f"  approval CPU: this process {approve_cpu_s:.2f} s ({approve_cpu_s * 1000 / max(len(pending), 1):.2f} ms "
        f"each), PostgreSQL backend {db_s}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )


def backend_cpu_s() -> float | None:
    """CPU seconds (user + system) this connection's PostgreSQL backend has used, or None when the server is not
    on this machine or its /proc entry is not readable."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
