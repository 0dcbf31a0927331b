"""The embedded loop under a large queue: the outside tester's scenario (`make run`'s demo fleet, one
`POST /api/leases/batch` of 1,000 best-effort leases of 64 x 1 core for 600 s), then the loop's rounds for a while.
Reports the gaps between sweeps, the sweeps that found the sweep "away" (`resumed_after_s`, which resets every
node's grace), the large forecasts run and their share of the process's CPU and wall time.

    .venv/bin/python bench/bench_loop_forecast.py [--seconds 60] [--inline]

`--inline` computes the forecast inside the tick, as the embedded loop did before it had a thread for it. A scratch
SQLite database in a temporary folder; the agents' heartbeats are written directly, each round, and one more lease
is submitted every `--churn` seconds, so the forecast is due more often than the minute.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--churn", type=float, default=10.0, help="a lease submitted every this many seconds")
    parser.add_argument("--inline", action="store_true", help="the forecast in the tick (before the fix)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="sk-loop-")
    os.environ.update(DATABASE_URL=f"sqlite:///{folder}/db.sqlite3", EMBEDDED_LOOP="0", LOG_LEVEL="WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotkeeper.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone
    from rest_framework.test import APIClient

    from fleet import actions as fleet_actions
    from leases import forecasting
    from leases.instances.actions import nodes as node_actions
    from leases.instances.actions import periodic as steps
    from slotkeeper import embedded
    from slotkeeper import periodic as rounds
    from slotkeeper.management.commands.demo import DEMO_FLEET
    from slotkeeper.management.commands.issue_token import issue

    call_command("migrate", verbosity=0)
    nodes = []
    for name, cores, mem, disk, caps in DEMO_FLEET:
        node, _ = fleet_actions.do_register_node(
            None, name=name, cpu_cores=cores, mem_total_mib=mem, disk_total_gib=disk, capabilities=caps,
            now=timezone.now(),
        )  # fmt: skip
        nodes.append((node, mem, disk))

    def heartbeats() -> None:
        for node, mem, disk in nodes:
            report = fleet_actions.HealthReport(
                mem_total_mib=mem, mem_used_mib=1000, disk_free_gib=disk * 0.9, cpu_pct=1.0, load1=0.1
            )
            node_actions.do_heartbeat(node, report, now=timezone.now())

    heartbeats()
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue('tester', 'operator')}")
    vm = {"cpu_cores": 1, "mem_mib": 512}  # under the body limit (2.5 MiB) for 1,000 x 64 of them
    items = [
        {"name": f"be-{i}", "type": "best_effort", "duration_s": 600, "nodes": [vm] * 64}
        for i in range(args.leases)
    ]
    forecasts: list[dict] = []

    class Forecasts(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("queue forecast") and hasattr(record, "cpu_ms"):
                forecasts.append({"queued": record.queued, "cpu_ms": record.cpu_ms, "ms": record.ms})
            elif record.getMessage().startswith("queue forecast slower than a pass"):
                print(f"a pass's own forecast (inside the plan lock): {record.ms} ms of CPU", flush=True)

    logging.getLogger(forecasting.__name__).addHandler(Forecasts())
    logging.getLogger(forecasting.__name__).setLevel(logging.INFO)
    started = time.perf_counter()
    answer = client.post("/api/leases/batch", {"leases": items}, format="json")
    assert answer.status_code < 300, answer.content[:500]
    print(f"batch: HTTP {answer.status_code} in {time.perf_counter() - started:.1f} s", flush=True)

    swept: list[tuple[float, float | None]] = []

    def sweep(now):
        result = steps.sweep(now)
        swept.append((time.monotonic(), result.resumed_after_s))
        return result

    tick = steps.tick if args.inline else rounds.STEPS[1][1]
    rounds.STEPS = (("fleet.sweep", sweep, None), ("leases.tick", tick, None))
    interval = settings.EMBEDDED_LOOP_INTERVAL_S
    cpu0, wall0 = time.process_time(), time.monotonic()
    submitted = wall0
    while time.monotonic() - wall0 < args.seconds:
        heartbeats()  # the agents, every round (theirs is 5 s; sooner is harmless)
        if time.monotonic() - submitted >= args.churn:
            # An integration's steady trickle (the demo's submits some): each moves the queue, so the forecast is due.
            submitted = time.monotonic()
            client.post("/api/leases/", {**items[0], "name": "trickle"}, format="json")
        embedded.periodic_round()
        time.sleep(interval)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(swept)]
    forecast_cpu = sum(f["cpu_ms"] for f in forecasts) / 1e3
    forecast_wall = sum(f["ms"] for f in forecasts) / 1e3
    print(
        json.dumps(
            {
                "mode": "inline" if args.inline else "thread",
                "seconds": round(wall, 1),
                "sweeps": len(swept),
                "gap_max_s": round(max(gaps), 2),
                "gap_median_s": round(sorted(gaps)[len(gaps) // 2], 2),
                "resumed_after_s": [round(r, 1) for _, r in swept if r is not None],
                "forecasts": forecasts,
                "forecast_cpu_share_of_wall": round(forecast_cpu / wall, 3),
                "forecast_wall_share": round(forecast_wall / wall, 3),
                "process_cpu_s": round(cpu, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
