"""bench/bench_reports.py still runs against the code it measures: its probe wraps the pass's report step, and
when the pass began writing its reports inside `bulk.pipelined()` (which refuses any other statement) the
benchmark's baseline, a read and a write inside that block, made it fail on every run without anyone noticing.
A small fleet, so it takes a second or two; the figures themselves are the benchmark's business, not this test's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_report_benchmark_runs_to_its_figures():
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.setdefault("SECRET_KEY", "bench-smoke-only")
    done = subprocess.run(
        [
            sys.executable,
            "bench/bench_reports.py",
            "--nodes",
            "60",
            "--reservations",
            "300",
            "--decisions",
            "5",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Every kind measured, the baseline beside the compact report, and the rows read back.
    for kind in ("placed:", "rejected (busy):", "rejected (capability):"):
        assert kind in done.stdout
    assert done.stdout.count("dict per node (before): build + write") == 3
    assert done.stdout.count("read back as rows (compact)") == 3
    assert "overall:" in done.stdout
