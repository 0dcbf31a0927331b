"""The concurrency invariants at full size on PostgreSQL: 8 submitters x 500 leases with a ticker on 50 nodes (no
node overcommitted at any instant), and 20 rounds of eight workers evacuating eight of 20 nodes (no anti-affinity
group broken). The test suite runs the same tests, with the same assertions, at a size that proves the invariants
in well under a minute each (8 x 30 leases, 4 rounds); this runs them at full size and prints what they took.

    .venv/bin/python bench/bench_concurrency.py            # full: about 4 min for the leases, 20 rounds
    .venv/bin/python bench/bench_concurrency.py --quick    # the test suite's size

It runs the tests through pytest (test database `test_slotkeeper_bench`, created and dropped by pytest-django) with
DATABASE_URL pointing at 127.0.0.1:5432; a failed invariant fails the run like any test.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBMITTERS = 8
FULL = {"leases": 500, "rounds": 20}
QUICK = {"leases": 30, "rounds": 4}
TESTS = [
    "tests/leases/test_concurrency.py::test_eight_submitters_and_ticks_never_overcommit_a_node",
    "tests/leases/test_groups_concurrency.py::test_eight_workers_evacuating_eight_nodes_break_no_group",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the test suite's size")
    size = QUICK if parser.parse_args().quick else FULL
    env = {
        **os.environ,
        "DATABASE_URL": os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/slotkeeper_bench"
        ),
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-not-secret"),
        "SLOTKEEPER_CONCURRENCY_LEASES": str(size["leases"]),
        "SLOTKEEPER_GROUP_ROUNDS": str(size["rounds"]),
        "LOG_LEVEL": "WARNING",
    }
    print(
        f"{SUBMITTERS} submitters x {size['leases']} leases; {size['rounds']} evacuation rounds", flush=True
    )
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=0",
            "-o",
            "addopts=",
            *TESTS,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    calls = [(float(m[1]), m[2]) for m in re.finditer(r"^([\d.]+)s call\s+(\S+)", done.stdout, re.MULTILINE)]
    leases_s = sum(s for s, name in calls if "submitters" in name)
    rounds = [s for s, name in calls if "evacuating" in name]
    if leases_s:
        total = SUBMITTERS * size["leases"]
        print(
            f"submitters: {total} leases in {leases_s:.1f} s ({total / leases_s:.0f} leases/s), zero overcommit"
        )
    if rounds:
        print(
            f"evacuation: {len(rounds)} rounds in {sum(rounds):.1f} s (slowest {max(rounds):.1f} s), no group broken"
        )
    print(f"wall {wall:.0f} s, pytest exit {done.returncode}")
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-2000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
