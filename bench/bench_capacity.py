"""Benchmark the placer (fleet/capacity.py) against the work it cannot avoid and against the old placement.

Builds fleets of 100 and 1,000 nodes (fixed seed) shaped like a working fleet: most nodes online and partly
full (0-6 running 8 GiB instances, some pending), a few draining, stale, dead or lacking the capability. Then
times, on the same fleet in the same run:

- naive: the placement the seed replaced, the first online capable node (`capable.first()`): no capacity
  arithmetic, no verdicts. The floor any placer sits on.
- assess: `assess` on every node, no ranking or messages. The cost of a verdict per node.
- place: `place` for one instance, the API's preview and submit path.
- place x4 + check: `place` for four instances with an anti-affinity check, the burst path.

Prints p50/p99 in milliseconds of wall time and of this thread's CPU time. On a shared machine the wall p99
mostly measures the neighbours; the CPU p99 is what the code costs. Then says whether place's p99 leaves room in
the API's 20 ms p99 budget, which also has to pay for the database read.

    .venv/bin/python bench/bench_capacity.py [--repeat 200] [--seed 7]
"""

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet.capacity import Claim, Need, NodeState, ReasonCode, Unfit, assess, place

VM = Need(mem_mib=8192, disk_gib=12, cpu_cores=2.0, capabilities=frozenset({"kvm"}))
BURST = Need(mem_mib=8192, disk_gib=12, cpu_cores=2.0, capabilities=frozenset({"kvm"}), count=4)
BUDGET_MS = 20.0


def make_fleet(n: int, rng: random.Random) -> list[NodeState]:
    return [make_node(i, rng) for i in range(n)]


def make_node(i: int, rng: random.Random) -> NodeState:
    roll = rng.random()
    status = "draining" if roll < 0.03 else "dead" if roll < 0.05 else "online"
    running = tuple(Claim(f"n{i}-r{k}", 8192, 12, 2.0) for k in range(rng.randint(0, 6)))
    # A third of the started instances also still show as pending: the union by id must merge them.
    pending = tuple(c for c in running if rng.random() < 0.3) + tuple(
        Claim(f"n{i}-p{k}", 8192, 12, 2.0) for k in range(rng.randint(0, 1))
    )
    total = rng.choice([31744, 61440, 61440, 131072])
    return NodeState(
        id=i,
        name=f"node-{i:04d}",
        status=status,
        capabilities=frozenset(
            {"kvm", "gpu"} if rng.random() < 0.2 else {"kvm"} if rng.random() < 0.95 else ()
        ),
        cpu_cores=rng.choice([16, 32, 64]),
        mem_total_mib=total,
        disk_total_gib=1000,
        health_age_s=rng.uniform(0, 60) if rng.random() < 0.05 else rng.uniform(0, 10),
        observed_mem_total_mib=total,
        observed_mem_used_mib=rng.randint(3000, 8000) + 1024 * len(running),
        disk_free_gib=rng.uniform(30, 900),
        cpu_pct=rng.uniform(0, 100),
        idle_baseline_mib=rng.randint(3000, 8000),
        running=running,
        pending=pending,
    )


def naive_first(nodes: Sequence[NodeState], need: Need) -> str | None:
    """The old placement: the first online node holding the capabilities, with no capacity check."""
    return next((n.name for n in nodes if n.status == "online" and need.capabilities <= n.capabilities), None)


def anti_affinity(node: NodeState, need: Need, chosen: Sequence[str]) -> Unfit | None:
    return Unfit(ReasonCode.ANTI_AFFINITY, "group member already here") if node.name in chosen else None


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float, float, float]:
    """Wall p50, wall p99, CPU p50, CPU p99 of `repeat` calls, in milliseconds, after a short warm-up."""
    for _ in range(5):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        cpu.append((time.thread_time_ns() - c0) / 1e6)
        wall.append((time.perf_counter_ns() - w0) / 1e6)
    return (*percentiles(wall), *percentiles(cpu))


def percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[98]


def run(size: int, repeat: int, seed: int) -> tuple[float, float]:
    fleet = make_fleet(size, random.Random(seed))
    cases: list[tuple[str, Callable[[], object]]] = [
        ("naive first()", lambda: naive_first(fleet, VM)),
        ("assess every node", lambda: [assess(n, VM) for n in fleet]),
        ("place", lambda: place(fleet, VM)),
        ("place x4 + check", lambda: place(fleet, BURST, checks=[anti_affinity])),
    ]
    outcome = place(fleet, VM)
    fit = sum(v.fit for v in outcome.verdicts)
    print(f"\n{size} nodes ({fit} fit, outcome {outcome.outcome}), {repeat} runs each")
    print(f"  {'case':<20} {'wall p50':>9} {'wall p99':>9} {'cpu p50':>9} {'cpu p99':>9}   (ms)")
    place_p99 = (0.0, 0.0)
    for name, fn in cases:
        wall50, wall99, cpu50, cpu99 = timed(fn, repeat)
        place_p99 = (wall99, cpu99) if name == "place" else place_p99
        print(f"  {name:<20} {wall50:>9.3f} {wall99:>9.3f} {cpu50:>9.3f} {cpu99:>9.3f}")
    return place_p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, seed {args.seed}")
    run(100, args.repeat, args.seed)
    wall99, cpu99 = run(1000, args.repeat, args.seed)
    verdict = "within" if cpu99 < BUDGET_MS / 2 else "NOT within"
    print(
        f"\nplace p99 at 1,000 nodes: {cpu99:.2f} ms CPU ({wall99:.2f} ms wall), "
        f"{verdict} half the {BUDGET_MS:.0f} ms API budget"
    )


if __name__ == "__main__":
    main()
