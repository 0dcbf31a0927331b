"""Run every benchmark in its quick form, one after another, for `make bench`: a few minutes in all.

Each benchmark runs in its own process (each sets Django up on its own fresh database) and prints its own figures;
this script adds a header per benchmark, the time it took, and exits non-zero when one of them crashed. A missed
target is a figure to read, not a crash: the benchmarks say FAIL in their output and still exit 0.

    .venv/bin/python bench/run_all.py [NAME ...]     e.g. run_all.py bench_preview
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from slotkeeper.shared import HAIZEA  # noqa: E402

# The quick arguments of each benchmark. The placer and slot-table benchmarks predate --quick; these arguments
# are their quick form. The 30-day replay takes minutes on its own, so the quick run replays the 1,000-request
# subset only.
QUICK = {
    "bench_capacity": ["--repeat", "50"],
    "bench_slottable": ["--nodes", "300", "--queries", "500", "--all-nodes", "5"],
    "bench_replay": ["--trace", str(HAIZEA / "traces/blue/1000requests.swf"), "--only"],
    "bench_heartbeats": ["--quick"],
    "bench_preview": ["--quick"],
    "bench_reports": ["--quick"],
    "bench_slots_render": ["--quick"],
    "bench_slot_page": ["--quick"],
    "bench_board": ["--quick"],
    "bench_slot_patch": ["--quick"],
    "bench_recovery": ["--quick"],
    "bench_console_ws": ["--quick", "--variants", "project"],
    "bench_concurrency": ["--quick"],
    "bench_forecast": ["--quick"],
    "bench_mapper": ["--nodes", "1000", "--leases", "3000", "--rounds", "1"],
    "bench_queue_pass": ["--quick"],
    "bench_retention": ["--quick"],
    "bench_bulk": ["--quick"],
    "bench_renderer": ["--repeat", "50"],
    "bench_decode": ["--repeat", "20"],
    "bench_prepared": ["--quick"],
    "bench_pass_cost": ["--quick"],
    "bench_overrides": ["--nodes=200", "--rounds=2", "--seconds=1", "--leases=10", "--array=20"],
}


def run(name: str) -> bool:
    args = QUICK.get(name, ["--quick"])
    print(f"\n=== {name} {' '.join(args)}", flush=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], check=False)
    print(f"=== {name}: {time.perf_counter() - started:.0f} s, exit {done.returncode}", flush=True)
    return done.returncode == 0


def main() -> None:
    names = sys.argv[1:] or [n for n in QUICK if (BENCH / f"{n}.py").exists()]
    failed = [name for name in names if not run(name)]
    if failed:
        sys.exit(f"crashed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
