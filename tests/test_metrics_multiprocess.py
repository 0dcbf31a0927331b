"""Several processes, one /metrics (issue 49, item 3): two real Daphnes and a real Celery worker share one
PROMETHEUS_MULTIPROC_DIR; heartbeats go to each Daphne, ticks run in the worker's pool process, and a scrape of
either Daphne shows every counter as the sum of what each process counted itself (read back from each process's
own file), the fleet's gauges once, and the worker's series beside the Daphnes'.

Needs Redis for the worker's broker (a queue of this test's own, so a worker of another run takes nothing of it).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from django.conf import settings
from prometheus_client.multiprocess import MultiProcessCollector

from slotkeeper import metrics
from slotkeeper.shutdown import DAPHNE_TIMEOUTS
from tests.conftest import requires_redis
from tests.console import live
from tests.test_metrics_live import sample_value, scrape

pytestmark = [requires_redis]

ROOT = Path(__file__).resolve().parents[1]
BEAT = '{"mem_total_mib": 16384, "mem_used_mib": 2048, "disk_free_gib": 150.0, "cpu_pct": 4.0, "load1": 0.2}'


def heartbeat(url: str, node: dict) -> None:
    request = urllib.request.Request(
        f"{url}/api/nodes/{node['id']}/heartbeat",
        data=BEAT.encode(),
        method="POST",
        headers={"Authorization": f"Bearer {node['token']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def counted_by(directory: Path, pid: int) -> dict[str, float]:
    """One process's own counters, from its own file alone."""
    files = glob.glob(str(directory / f"counter_{pid}.db"))
    return {
        s.name: s.value
        for family in MultiProcessCollector.merge(files)
        for s in family.samples
        if not s.labels
    }


def started(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(process: subprocess.Popen) -> None:
    # The whole group: a Celery worker's pool processes too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_two_daphnes_and_a_worker_are_summed_through_one_directory(tmp_path):
    shared = tmp_path / "metrics"
    env = {k: v for k, v in live.environment(tmp_path / "db.sqlite3").items() if k != metrics.MADE_HERE}
    env.update({metrics.ENV: str(shared), "EMBEDDED_LOOP": "0"})  # the ticks are the worker's alone
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    setup = subprocess.run(
        [*manage, "shell", "-c", live.SETUP % live.PASSWORD],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    nodes = json.loads(next(line for line in setup.stdout.splitlines() if line.startswith("SETUP"))[5:])[
        "nodes"
    ]
    for leftover in shared.glob("*.db"):  # what migrate and the set-up counted: a deployment starts empty
        leftover.unlink()

    queue = f"metrics-test-{uuid.uuid4().hex[:12]}"
    worker_port = live.free_port()
    worker_env = env | {
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": "metrics-test-only",
        "SLOTKEEPER_METRICS_PORT": str(worker_port),
    }
    processes = []
    try:
        urls = []
        for i in range(2):
            port = live.free_port()
            argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), *DAPHNE_TIMEOUTS]
            processes.append(
                started([*argv, "slotkeeper.asgi:application"], env, tmp_path / f"daphne{i}.log")
            )
            urls.append(f"http://127.0.0.1:{port}")
        celery = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "slotkeeper",
            "worker",
            "-Q",
            queue,
            "--concurrency",
            "1",
        ]
        worker = started(
            [*celery, "-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            worker_env,
            tmp_path / "worker.log",
        )
        processes.append(worker)
        for url, process in zip(urls, processes, strict=False):
            live.wait_healthy(url, process)

        # 2 heartbeats a node to the first Daphne, 3 to the second (a token's first through the view, the rest
        # through the route in front of Django), 15 in all.
        for name in ("tank", "architect", "morpheus"):
            for _ in range(2):
                heartbeat(urls[0], nodes[name])
            for _ in range(3):
                heartbeat(urls[1], nodes[name])

        from slotkeeper.celery import app

        for _ in range(2):
            app.send_task("leases.instances.tasks.tick", queue=queue)
        wait_for(
            lambda: sample_value(scrape(urls[0]), "slotkeeper_ticks_total") >= 2, 60, "the worker's two ticks"
        )
        time.sleep(0.5)  # past a heartbeat flush in each Daphne

        a, b = (scrape(url) for url in urls)
        daphnes = [p.pid for p in processes[:2]]
        by_pid = {
            int(Path(f).stem.rsplit("_", 1)[1]): counted_by(shared, int(Path(f).stem.rsplit("_", 1)[1]))
            for f in glob.glob(str(shared / "counter_*.db"))
        }
        workers = [pid for pid in by_pid if pid not in daphnes]
        assert workers, "the worker's processes wrote their own files"

        # Each Daphne counted only its own heartbeats; the scrape of either shows their sum.
        assert by_pid[daphnes[0]]["slotkeeper_heartbeats_total"] == 6
        assert by_pid[daphnes[1]]["slotkeeper_heartbeats_total"] == 9
        for text in (a, b):
            assert sample_value(text, "slotkeeper_heartbeats_total") == 15
            heartbeats = 'slotkeeper_http_request_duration_seconds_count{route="api:node-heartbeat",status_class="2xx"}'
            assert sample_value(text, heartbeats) == 15
            # The ticks ran in the worker's pool process, not in a Daphne; seen through either.
            assert sample_value(text, "slotkeeper_ticks_total") == 2
            assert sum(by_pid[pid].get("slotkeeper_ticks_total", 0) for pid in workers) == 2
            assert sum(by_pid[pid].get("slotkeeper_ticks_total", 0) for pid in daphnes) == 0
            worker_passes = sum(by_pid[pid].get("slotkeeper_plan_passes_total", 0) for pid in workers)
            assert worker_passes >= 2
            assert sample_value(text, "slotkeeper_plan_pass_duration_seconds_count") == sum(
                pid_counts.get("slotkeeper_plan_passes_total", 0) for pid_counts in by_pid.values()
            )
            # The fleet's gauges come from the database once, not once a process.
            assert sample_value(text, 'slotkeeper_nodes{status="online"}') == 3
            assert text.count('\nslotkeeper_nodes{status="online"}') == 1

        # The worker's own endpoint (SLOTKEEPER_METRICS_PORT, for a worker no Daphne shares a directory with)
        # reads the same directory, and leaves the fleet's gauges to the web.
        with urllib.request.urlopen(f"http://127.0.0.1:{worker_port}/metrics", timeout=10) as answer:
            served = answer.read().decode()
        assert sample_value(served, "slotkeeper_ticks_total") == 2
        assert sample_value(served, "slotkeeper_heartbeats_total") == 15
        assert "# TYPE slotkeeper_ticks_total counter" in served
        assert "slotkeeper_nodes" not in served
    finally:
        for process in processes:
            stop(process)
