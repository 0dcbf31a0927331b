"""Benchmark the slot table against a naive per-query scan of a node's reservations.

Builds 1,000 nodes x 150 reservations (fixed seed), then times earliest_fit, fits, fits_until and add+remove on
`leases.slottable.SlotTable` and, on the same queries in the same run, on `NaiveNode`, which answers each query by
scanning the node's reservation list and sweeping the ones that matter (what Haizea does when it rebuilds an
availability window, for one node and without its cache). Prints p50/p99 in microseconds and the speed-up.

    .venv/bin/python bench/bench_slottable.py [--nodes 1000] [--per-node 150] [--queries 2000] [--seed 7]
"""

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leases.slots.values import vec
from leases.slottable import Res, Reservation, SlotTable

NODE = Res(cpu=800, mem=32768, disk=500, net_in=10000, net_out=10000)  # 8 cores, 32 GiB
LANES = 4  # reservations are laid out in lanes of a quarter node each, so the table is full but never overcommitted
LANE = Res(cpu=200, mem=8192, disk=125)
NEEDS = [LANE, LANE.scaled(2), LANE.scaled(4)]  # a quarter, half and whole node
HOUR = 3600.0


class NaiveNode:
    """One node's reservations as a plain list; every answer is a fresh scan of it."""

    def __init__(self, capacity: Res) -> None:
        self.capacity = capacity
        self.rows: dict[int, Reservation] = {}

    def _profile(self, node: int, start: float, end: float) -> tuple[Res, list[tuple[float, Res]]]:
        """Usage at `start`, and the sorted (time, delta) changes inside (start, end)."""
        used, changes = Res(), []
        for r in self.rows.values():
            if r.end <= start or r.start >= end:
                continue
            use = r.alloc[node]
            if r.start <= start:
                used += use
            else:
                changes.append((r.start, use))
            if r.end < end:
                changes.append((r.end, Res() - use))
        changes.sort(key=lambda c: c[0])
        return used, changes

    def fits(self, node: int, need: Res, start: float, end: float) -> bool:
        used, changes = self._profile(node, start, end)
        if not (used + need).fits_in(self.capacity):
            return False
        for k, (t, delta) in enumerate(changes):
            used += delta
            last_at_t = k + 1 == len(changes) or changes[k + 1][0] != t
            if last_at_t and not (used + need).fits_in(self.capacity):
                return False
        return True

    def fits_until(self, node: int, need: Res, start: float) -> float:
        used, changes = self._profile(node, start, math.inf)
        if not (used + need).fits_in(self.capacity):
            return start
        for k, (t, delta) in enumerate(changes):
            used += delta
            last_at_t = k + 1 == len(changes) or changes[k + 1][0] != t
            if last_at_t and not (used + need).fits_in(self.capacity):
                return t
        return math.inf

    def earliest_fit(self, node: int, need: Res, duration: float, after: float) -> float | None:
        if not need.fits_in(self.capacity):
            return None
        used, changes = self._profile(node, after, math.inf)
        t, free_since = after, after if (used + need).fits_in(self.capacity) else None
        for k, (t, delta) in enumerate(changes):
            used += delta
            if k + 1 < len(changes) and changes[k + 1][0] == t:
                continue
            if free_since is not None and t - free_since >= duration:
                return free_since
            ok = (used + need).fits_in(self.capacity)
            free_since = (free_since if free_since is not None else t) if ok else None
        return free_since if free_since is not None else t

    def add(self, r: Reservation) -> None:
        node, need = next(iter(r.alloc.items()))
        if not self.fits(node, need, r.start, r.end):
            raise ValueError("overcommit")
        self.rows[r.rid] = r

    def remove(self, rid: int) -> None:
        del self.rows[rid]


def build(nodes: int, per_node: int, rng: random.Random) -> tuple[SlotTable, dict[int, NaiveNode], float]:
    table = SlotTable(dict.fromkeys(range(nodes), NODE))
    naive = {n: NaiveNode(NODE) for n in range(nodes)}
    rid, horizon = 0, 0.0
    for node in range(nodes):
        lane_free = [rng.uniform(0, 2 * HOUR) for _ in range(LANES)]
        for k in range(per_node):
            lane = k % LANES
            start = lane_free[lane] + rng.expovariate(1 / HOUR)
            end = start + rng.uniform(600, 4 * HOUR)
            use = LANE if rng.random() < 0.5 else Res(cpu=100, mem=4096, disk=60)
            r = Reservation(rid, rid, "vm", start, end, {node: use})
            table.add(r)
            naive[node].rows[rid] = r
            lane_free[lane], rid = end, rid + 1
        horizon = max(horizon, *lane_free)
    return table, naive, horizon


def timed(calls: list[Callable[[], object]], repeat: int = 3) -> tuple[list[float], list[object]]:
    """Microseconds per call, the best of `repeat` runs, so other processes on a shared machine add less noise."""
    samples, answers = [], []
    for call in calls:
        best = math.inf
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            answer = call()
            best = min(best, (time.perf_counter_ns() - t0) / 1000)
        samples.append(best)
        answers.append(answer)
    return samples, answers


def pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] if len(samples) > 1 else samples[0]


def report(name: str, ours: list[float], naive: list[float]) -> None:
    o50, o99, n50, n99 = pct(ours, 50), pct(ours, 99), pct(naive, 50), pct(naive, 99)
    print(f"{name:<22}{o50:>10.1f}{o99:>10.1f}{n50:>12.1f}{n99:>12.1f}{n50 / o50:>9.1f}x{n99 / o99:>8.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--per-node", type=int, default=150)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--all-nodes", type=int, default=20, help="full-fleet earliest_fit searches to time")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    t0 = time.perf_counter()
    table, naive, horizon = build(args.nodes, args.per_node, rng)
    built = time.perf_counter() - t0
    print(
        f"{args.nodes} nodes x {args.per_node} reservations, horizon {horizon / HOUR:.0f} h, built in {built:.1f} s"
    )

    qs = [
        (rng.randrange(args.nodes), rng.choice(NEEDS), rng.uniform(0.5, 4) * HOUR, rng.uniform(0, horizon))
        for _ in range(args.queries)
    ]
    print(
        f"\n{'per-node query (us)':<22}{'p50':>10}{'p99':>10}{'naive p50':>12}{'naive p99':>12}{'speed-up p50 / p99':>19}"
    )
    cases: dict[str, tuple[Callable, Callable]] = {
        "earliest_fit": (
            lambda n, need, d, t: lambda: table.earliest_fit(n, need, d, t),
            lambda n, need, d, t: lambda: naive[n].earliest_fit(n, need, d, t),
        ),
        "fits": (
            lambda n, need, d, t: lambda: table.fits(n, need, t, t + d),
            lambda n, need, d, t: lambda: naive[n].fits(n, need, t, t + d),
        ),
        "fits_until": (
            lambda n, need, d, t: lambda: table.fits_until(n, need, t),
            lambda n, need, d, t: lambda: naive[n].fits_until(n, need, t),
        ),
    }
    for name, (ours, slow) in cases.items():
        ours_s, ours_a = timed([ours(*q) for q in qs])
        slow_s, slow_a = timed([slow(*q) for q in qs])
        assert ours_a == slow_a, f"{name}: the table and the naive scan disagree"
        report(name, ours_s, slow_s)

    fitting = []
    for n, _need, d, t in qs:
        start = table.earliest_fit(n, Res(cpu=50, mem=1024), d, t)
        assert start is not None
        fitting.append(
            Reservation(10**9 + len(fitting), 0, "vm", start, start + d, {n: Res(cpu=50, mem=1024)})
        )
    ours_s, _ = timed(
        [lambda r=r: (table.add(r), table.remove(r.rid)) for r in fitting]
    )  # each pair undoes itself
    slow_s, _ = timed(
        [
            lambda r=r: (naive[next(iter(r.alloc))].add(r), naive[next(iter(r.alloc))].remove(r.rid))
            for r in fitting
        ]
    )
    report("add+remove", ours_s, slow_s)

    # The same writes on the node's own line alone: the rest of a write is the fleet's total line (`_total`, every
    # node's reservations on one line, kept for total_free_at), whose lists grow with the whole table.
    def on_its_line(r: Reservation) -> Callable[[], object]:
        ((node, use),) = r.alloc.items()
        line, v = table._lines[node], vec(use)
        return lambda: (line.add(r.rid, r.start, r.end, v), line.remove(r.rid, r.start, r.end, v))

    own_s, _ = timed([on_its_line(r) for r in fitting])
    print(
        f"{'  the node line alone':<22}{pct(own_s, 50):>10.1f}{pct(own_s, 99):>10.1f}"
        f"   (the fleet's total line, {len(table._total.times):,} points: the rest)"
    )

    searches = [
        (rng.choice(NEEDS), rng.uniform(0.5, 4) * HOUR, rng.uniform(0, horizon))
        for _ in range(args.all_nodes)
    ]
    ours_s, ours_a = timed([lambda s=s: [table.earliest_fit(n, *s) for n in table.nodes] for s in searches])
    slow_s, slow_a = timed(
        [lambda s=s: [naive[n].earliest_fit(n, *s) for n in table.nodes] for s in searches[:5]]
    )
    assert ours_a[:5] == slow_a, "all-nodes search: the table and the naive scan disagree"
    print(f"\n{'all-nodes query (ms)':<22}{'p50':>10}{'p99':>10}{'naive p50':>12}{'naive p99':>12}")
    print(
        f"{'earliest_fit x nodes':<22}{pct(ours_s, 50) / 1000:>10.1f}{pct(ours_s, 99) / 1000:>10.1f}"
        f"{pct(slow_s, 50) / 1000:>12.1f}{pct(slow_s, 99) / 1000:>12.1f}"
    )

    copies, _ = timed([table.copy for _ in range(50)])
    first_writes, _ = timed([lambda r=r: table.copy().add(r) for r in fitting[:50]], repeat=1)
    print(
        f"\ncopy(): p50 {pct(copies, 50):.1f} us; copy() then a first add: p50 {pct(first_writes, 50) / 1000:.1f} ms"
    )
    crowded()


def crowded() -> None:
    """The leases in the way on a crowded node, as a report names them: every one of them (the baseline) against
    the six lowest ids (`most`, what a report asks for since a report names five). Each call asks afresh (the
    per-node memory is cleared), as the first report after a write to the node does."""
    print(f"\n{'leases in the way (us)':<28}{'every one':>10}{'six lowest':>12}")
    for per_node in (10, 65, 200):
        table = SlotTable({0: Res(cpu=100 * per_node, mem=1024 * per_node)})
        for i in range(per_node):  # one core each, every one of them in the way of one more core
            table.add(Reservation(i, 1000 - i, "vm", i, 10 * HOUR + i, {0: Res(cpu=100, mem=1024)}))
        need = Res(cpu=100, mem=1024)

        def ask(most: int | None, table: SlotTable = table, need: Res = need) -> set[int]:
            table._blocked.clear()
            return table.blocking_leases(0, need, HOUR, 2 * HOUR, most)

        every, answers = timed([lambda: ask(None)] * 200)
        six, lowest = timed([lambda: ask(6)] * 200)
        assert lowest[0] == set(sorted(answers[0])[:6]), "the six lowest are not the lowest of every one"
        print(f"{f'{per_node} reservations on the node':<28}{pct(every, 50):>10.1f}{pct(six, 50):>12.1f}")


if __name__ == "__main__":
    main()
