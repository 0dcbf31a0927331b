"""Replay the SDSC Blue Horizon workload (HPDC'08's 30 days, 5,545 jobs) on 144 nodes and print how long it took.

Haizea 1.1 needs 843 s for the 30 days (last best-effort end 30.69 days, mean wait 3,763 s, mean bounded
slowdown 15.6, utilisation 0.687); Slotkeeper's target is 30 s. `--trace` runs another file (e.g. the
1000requests.swf subset) first, as a quick look.

    .venv/bin/python bench/bench_replay.py [--trace PATH] [--config PATH]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from slotkeeper import shared

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leases.haizea_config import read_config
from leases.replay import replay, setup
from leases.traces import read_trace

HAIZEA = shared.HAIZEA
DEFAULT_TRACE = HAIZEA / "traces/blue/30days.swf"
DEFAULT_CONFIG = HAIZEA / "configs/blue-144.conf"


def run(trace_path: Path, config_path: Path) -> None:
    started = time.perf_counter()
    trace = read_trace(trace_path)
    capacities, config = setup(trace, read_config(config_path))
    result = replay(trace, capacities, config)
    wall = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m = result.metrics
    days = (m.last_best_effort_end_s or 0) / 86400
    print(f"{trace_path.name}: {m.leases} leases on {len(capacities)} nodes, {result.steps} steps")
    print(f"  wall {wall:.1f} s, peak RSS {peak_mib:.0f} MiB")
    print(
        f"  last best-effort end {days:.2f} days, mean wait {m.mean_wait_s or 0:.0f} s, "
        f"mean bounded slowdown {m.mean_bounded_slowdown or 0:.1f}, utilisation {m.utilisation:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="replay this trace first (e.g. 1000requests.swf)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--only", action="store_true", help="run only --trace, not the 30 days")
    args = parser.parse_args()
    if args.trace:
        run(args.trace, args.config)
    if not args.only:
        run(DEFAULT_TRACE, args.config)


if __name__ == "__main__":
    main()
