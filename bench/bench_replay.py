"""Replay the SDSC Blue Horizon workloads on 144 nodes and print the CPU time beside Haizea's.

Three runs under configs/blue-144.conf: HPDC'08's 30 days (5,545 jobs) alone; the same with the ARs of
injected_leases/30days/work_10-dur_3h-size_2medium.lwf (94 ARs); and the 60 days (10,280 jobs). Haizea 1.1 needs
843 s for the first and 1,340 s for the second; Slotkeeper's targets are 10 s, 10 s and 20 s of CPU (issue 14).
`--trace`/`--inject` run one other combination instead, as a quick look.

    .venv/bin/python bench/bench_replay.py [--trace PATH [--inject PATH]] [--config PATH] [--only 30|30i|60] [--json]

`--json` also prints each run's full metrics as one JSON line, so that two commits' outcomes can be compared
exactly (a speed-up must leave them identical).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leases.haizea_config import read_config
from leases.replay import load_workload, replay, setup
from slotkeeper import shared

HAIZEA = shared.HAIZEA
BLUE = HAIZEA / "traces/blue"
INJECTION = BLUE / "injected_leases/30days/work_10-dur_3h-size_2medium.lwf"
DEFAULT_CONFIG = HAIZEA / "configs/blue-144.conf"

# name -> (trace, injection, Haizea 1.1's figures on this machine class, Slotkeeper's CPU target in s)
RUNS: dict[str, tuple[Path, Path | None, str, float]] = {
    "30": (
        BLUE / "30days.swf",
        None,
        "Haizea 1.1: 843 s; last best-effort end 30.69 days, mean wait 3,763 s, slowdown 15.6, util 0.687",
        10.0,
    ),
    "30i": (
        BLUE / "30days.swf",
        INJECTION,
        "Haizea 1.1: 1,340 s; 94/94 ARs, last best-effort end 2,920,554 s, mean wait 4,423 s, slowdown 18.0, "
        "util 0.712",
        10.0,
    ),
    "60": (BLUE / "60days.swf", None, "Haizea 1.1: not measured", 20.0),
}

# Haizea 1.1's outcome, as it prints it (ARs accepted, last best-effort end in s, mean wait in s, bounded
# slowdown to 0.1, utilisation to 0.001): a run that does not reproduce it says so.
HAIZEA_OUTCOME: dict[str, tuple[int, int, int, float, float]] = {
    "30": (0, 2_651_340, 3_763, 15.6, 0.687),
    "30i": (94, 2_920_554, 4_423, 18.0, 0.712),
}


def run(
    trace_path: Path,
    injection: Path | None,
    config_path: Path,
    haizea: str = "",
    target: float = 0,
    as_json: bool = False,
    outcome: tuple[int, int, int, float, float] | None = None,
) -> None:
    trace = load_workload(trace_path, injection)
    capacities, config = setup(trace, read_config(config_path))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = replay(trace, capacities, config)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m = result.metrics
    name = trace_path.name + (f" + {injection.name}" if injection else "")
    print(f"{name}: {m.leases} leases on {len(capacities)} nodes, {result.steps} steps")
    verdict = "" if not target else (" (target met)" if cpu <= target else f" (target {target:.0f} s MISSED)")
    print(f"  CPU {cpu:.1f} s{verdict}, wall {wall:.1f} s, peak RSS {peak_mib:.0f} MiB")
    print(
        f"  ARs {m.ar_accepted} accepted / {m.ar_rejected} rejected; last best-effort end "
        f"{m.last_best_effort_end_s or 0:,.0f} s ({(m.last_best_effort_end_s or 0) / 86400:.2f} days), "
        f"mean wait {m.mean_wait_s or 0:,.0f} s, mean bounded slowdown {m.mean_bounded_slowdown or 0:.1f}, "
        f"utilisation {m.utilisation:.3f}"
    )
    if haizea:
        print(f"  {haizea}")
    if outcome:
        ours = (
            m.ar_accepted,
            round(m.last_best_effort_end_s or 0),
            round(m.mean_wait_s or 0),
            round(m.mean_bounded_slowdown or 0, 1),
            round(m.utilisation, 3),
        )
        print(
            "  outcome: the same as Haizea 1.1's"
            if ours == outcome
            else f"  outcome DIFFERS from Haizea 1.1's: {ours}"
        )
    if as_json:
        row = {"run": name, "steps": result.steps, "cpu_s": round(cpu, 2), "metrics": dataclasses.asdict(m)}
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="replay this trace only (e.g. 1000requests.swf)")
    parser.add_argument("--inject", type=Path, help="with this AR injection")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    # A bare --only (as bench/run_all.py passes with --trace) means "just the --trace run".
    parser.add_argument("--only", nargs="?", const="", help=f"one of the standard runs: {', '.join(RUNS)}")
    parser.add_argument("--json", action="store_true", help="also print each run's full metrics as JSON")
    args = parser.parse_args()
    if args.only and args.only not in RUNS:
        parser.error(f"--only {args.only}: not one of {', '.join(RUNS)}")
    if args.trace:
        run(args.trace, args.inject, args.config, as_json=args.json)
        return
    for name, (trace, injection, haizea, target) in RUNS.items():
        if not args.only or args.only == name:
            outcome = HAIZEA_OUTCOME.get(name) if args.config == DEFAULT_CONFIG else None
            run(trace, injection, args.config, haizea, target, args.json, outcome)


if __name__ == "__main__":
    main()
