"""Benchmark the pure scheduler's cost of a lease burst at fleet scale: the host order handed out lazily (idle
nodes first, the rest scored only when the mapper wants more) against the full sort of every candidate node, in
the same process, alternating.

Issue 12, item 3: "a mapper that does not score every node per VM". The workload is bench_burst's shape without
the database: 90 % best-effort, 5 % immediate, 5 % advance reservations 1-6 h ahead; 1-4 VMs (1-2 for AR/IM) of 1,
2 or 4 cores with 4 GiB a core, 1-8 h; nodes of 32 cores and 128 GiB. Requests come in batches of 100 (`--batch`) sharing one
`now` (as a group-commit pass takes them: `submit(..., defer=True)`, then the queue processed once a batch).
Prints the CPU seconds of each variant, the milliseconds a lease, and checks that both end in the same plan
(same lease states and the same reservations).

`--reports` also explains every lease of a batch once the batch is planned, as a pass's placement reports do
(`Scheduler.explain` over the VM reservation it got, or over its window from the batch's `now`), and prints those
CPU seconds apart: the reports' pure share, outside the scheduler's figure.

    .venv/bin/python bench/bench_mapper.py [--nodes 1000] [--leases 10000] [--rounds 2] [--batch 100] [--reports]
        [--workload mapper|burst] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.scheduling import mapper
from leases.slottable import Res

BATCH = 100
T0 = 1.8e9


Ask = tuple[str, tuple[Res, ...], float, float]  # kind, vnodes, duration, an AR's start after its submission


def workload(count: int, seed: int) -> list[Ask]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        roll = rng.random()
        kind = "best_effort" if roll < 0.9 else "immediate" if roll < 0.95 else "advance_reservation"
        vms = rng.randint(1, 4 if kind == "best_effort" else 2)
        cores = rng.choice([1, 2, 4])
        vnodes = (Res(cores * 100, cores * 4096),) * vms
        out.append((kind, vnodes, rng.randint(1, 8) * 3600, rng.randint(1, 6) * 3600))
    return out


def burst_workload(count: int) -> list[Ask]:
    """bench_burst.py's own requests: VMs of mixed sizes within a lease, and advance reservations starting any
    second 1-6 h ahead (each asks about a start of its own), where `workload` starts them on the hour."""
    from bench.bench_burst import workload as asked

    return [
        (a.type, tuple(Res(int(c * 100), m, d) for c, m, d in a.vnodes), a.duration_s, a.start_in_s or 0.0)
        for a in asked(count)
    ]


def run(
    nodes: int, asks: list, lazy: bool, reports: bool = False, batch: int = BATCH
) -> tuple[float, str, dict[str, int], float]:
    """The scheduler's CPU seconds, the plan's digest, the leases by state, and the reports' CPU seconds."""
    mapper.LAZY_NODES = 256 if lazy else 1 << 30
    s = Scheduler({n: Res(3200, 131072, 2000, 0, 0) for n in range(1, nodes + 1)}, SchedulerConfig())
    explained = 0.0
    cpu = time.process_time()
    for k in range(0, len(asks), batch):
        now = T0 + k * 0.01
        for i in range(k, min(k + batch, len(asks))):
            kind, vnodes, duration, ahead = asks[i]
            req = LeaseRequest(
                i + 1,
                kind,
                now,
                now + ahead if kind == "advance_reservation" else None,
                duration,
                vnodes,
                preemptible=kind == "best_effort",
            )
            s.submit(req, now, defer=True)
        # One small lease submitted without `defer` runs the queue once for the batch.
        s.submit(LeaseRequest(10**7 + k, "best_effort", now, None, 60, (Res(100, 1024),)), now)
        if reports:
            started = time.process_time()
            explain_batch(s, range(k + 1, min(k + batch, len(asks)) + 1), now)
            explained += time.process_time() - started
    spent = time.process_time() - cpu - explained
    states: dict[str, int] = {}
    for rec in s.leases.values():
        states[rec.state.value] = states.get(rec.state.value, 0) + 1
    rows = sorted(
        (lid, r.kind, r.start, r.end, sorted(r.nodes.items()))
        for lid, rec in s.leases.items()
        for r in rec.reservations
        if r.status != "cancelled"
    )
    return spent, hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:12], states, explained


def explain_batch(s: Scheduler, lease_ids: range, now: float) -> None:
    """Every node's verdict for each lease, as its placement report asks (leases/planning/reporting.py,
    placement_report)."""
    for lease_id in lease_ids:
        rec = s.leases[lease_id]
        vm = rec.current_vm()
        if vm is not None:
            s.explain(rec.request, vm.start, vm.end, chosen=s.alloc_of(rec, vm), now=now)
        else:
            start = rec.request.start if rec.request.start is not None else now
            s.explain(rec.request, start, start + rec.request.duration, now=now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2, help="each variant this many times, alternating")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--batch",
        type=int,
        default=BATCH,
        help="requests sharing a `now` (a pass takes up to 1,000: intents.MAX_BATCH)",
    )
    parser.add_argument("--reports", action="store_true", help="also explain every lease, as its report does")
    parser.add_argument(
        "--workload",
        choices=["mapper", "burst"],
        default="mapper",
        help="burst: bench_burst.py's requests (mixed VM sizes, AR starts to the second)",
    )
    parser.add_argument("--profile", action="store_true", help="profile one lazy run instead")
    args = parser.parse_args()
    asks = burst_workload(args.leases) if args.workload == "burst" else workload(args.leases, args.seed)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(args.nodes, asks, lazy=True, reports=args.reports, batch=args.batch)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        return
    print(
        f"pure scheduler, {args.nodes:,} nodes, {args.leases:,} leases in batches of {args.batch}", flush=True
    )
    digests = set()
    for r in range(args.rounds):
        for lazy in (False, True):
            spent, digest, states, explained = run(args.nodes, asks, lazy, args.reports, args.batch)
            digests.add(digest)
            name = "lazy order" if lazy else "full sort (before)"
            per = 1e3 * explained / args.leases
            shown = f"  reports {explained:6.2f} s CPU  {per:5.2f} ms a lease" if args.reports else ""
            print(
                f"  round {r + 1}  {name:<20} {spent:7.2f} s CPU  {1e3 * spent / args.leases:6.2f} ms a lease  "
                f"plan {digest}{shown}  {states}",
                flush=True,
            )
    print(f"  same plan in every run: {'yes' if len(digests) == 1 else 'NO'}")
    if len(digests) != 1:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
