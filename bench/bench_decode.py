"""Benchmark reading a 1,000-node placement report back as rows (`fleet.reports.decode`), against a baseline ref's.

Every full answer to `POST /api/leases/` and `GET /api/leases/{id}/` decodes its lease's report: a dict per node,
in rank order, with sentences in user units. Three stored reports, built with `fleet.reports.encode` from verdicts
shaped like the live service's (seeded):

- placed: most nodes fit (holds 1-16, a rank each), two chosen, the rest at capacity; figures in cores;
- busy: no node fits; at_capacity and reserved verdicts in cores and memory, a fifth naming blocking leases;
- capability: nine nodes in ten lack a capability (a sentence of their own), the rest at capacity.

Each is decoded by this tree's `decode` and by the baseline's (`git show REF:fleet/reports.py`, loaded as a module
of its own: the module is pure), alternating, CPU per decode (`thread_time`, median of `--rounds` rounds of
`--repeat` calls). Both must give the same JSON, byte for byte, or the benchmark stops.

    .venv/bin/python bench/bench_decode.py [--nodes 1000] [--repeat 100] [--rounds 5] [--baseline-ref 803ba69]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from fleet import reports  # noqa: E402
from fleet.reports import Verdict  # noqa: E402

# The decoder before the twenty-third session (main at its start).
BASELINE = "803ba69"


def baseline_module(ref: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{ref}:fleet/reports.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "reports_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("reports_baseline", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def placed(rng: random.Random, n: int) -> list[Verdict]:
    out = []
    for node in range(1, n + 1):
        free = rng.choice((3200, 3000, 2800, 2400, 1600, 100, 0))
        holds = free // 200
        out.append(
            Verdict(node, holds, None if holds else "at_capacity", "cpu", 200, free, 3200,
                    rng.randint(1, n) if holds else None, node in (5, 77))
        )  # fmt: skip
    return out


def busy(rng: random.Random, n: int) -> list[Verdict]:
    out = []
    for node in range(1, n + 1):
        cpu = rng.random() < 0.5
        reserved = rng.random() < 0.2
        out.append(
            Verdict(
                node, 0, "reserved" if reserved else "at_capacity", "cpu" if cpu else "mem",
                400 if cpu else 16384, rng.choice((0, 100, 200, 300)) if cpu else rng.choice((0, 4096, 8192)),
                3200 if cpu else 131072, None, False,
                tuple(rng.sample(range(1, 20000), 3)) if reserved else (),
            )
        )  # fmt: skip
    return out


def capability(rng: random.Random, n: int) -> list[Verdict]:
    return [
        Verdict(node, 0, "missing_capability", "cpu", 200, 0, 3200, None, False, (), "lacks accel.gpu")
        if rng.random() < 0.9
        else Verdict(node, 0, "at_capacity", "cpu", 200, rng.choice((0, 100)), 3200, None, False)
        for node in range(1, n + 1)
    ]


def cpu_ms(call: Callable[[], object], repeat: int) -> float:
    t = time.thread_time()
    for _ in range(repeat):
        call()
    return (time.thread_time() - t) * 1000 / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--baseline-ref", default=BASELINE, help=f"default {BASELINE}, main before this decoder"
    )
    args = parser.parse_args()
    old = baseline_module(args.baseline_ref)
    rng = random.Random(12)
    names = {i: f"node-{i:04d}" for i in range(1, args.nodes + 1)}
    print(
        f"placement report decoded as rows, {args.nodes:,} nodes, CPU per decode (median of {args.rounds} x {args.repeat})"
    )
    for label, make in (("placed", placed), ("busy", busy), ("capability", capability)):
        verdicts = make(rng, args.nodes)
        headroom = [round(rng.random(), 3) for _ in verdicts] if label == "placed" else None
        stored = reports.encode(verdicts, start=1.8e9, end=1.8e9 + 7200, summary="s", headroom=headroom)
        stored = orjson.loads(
            orjson.dumps(stored, option=orjson.OPT_SERIALIZE_NUMPY)
        )  # as the database gives it
        new_rows, old_rows = reports.decode(stored, names), old.decode(stored, names)
        if orjson.dumps(new_rows) != orjson.dumps(old_rows):
            sys.exit(f"{label}: this tree's rows differ from {args.baseline_ref}'s")
        times: dict[str, list[float]] = {"this tree": [], args.baseline_ref: []}
        for _ in range(args.rounds):
            times["this tree"].append(cpu_ms(lambda s=stored: reports.decode(s, names), args.repeat))
            times[args.baseline_ref].append(cpu_ms(lambda s=stored: old.decode(s, names), args.repeat))
        new, base = (statistics.median(v) for v in times.values())
        print(
            f"  {label:<11} this tree {new:7.3f} ms   {args.baseline_ref} {base:7.3f} ms   "
            f"({(1 - new / base) * 100:.0f} % less)",
            flush=True,
        )


if __name__ == "__main__":
    main()
