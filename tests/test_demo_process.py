"""`make run` as an outsider treats it: killed hard, and started again while something holds its port.

Each test runs the real `manage.py demo` (without simulated agents) on a free port with its own SQLite file and
demo folder."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_demo(tmp_path: Path, port: int) -> subprocess.Popen:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_", "PYTEST"))
    }
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        SLOTKEEPER_DEMO_DIR=str(
            tmp_path / "demo"
        ),  # not the tree's .demo/: its node tokens would be replaced
        SECRET_KEY="demo-test",
        LOG_FORMAT="plain",
    )
    return subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--no-agents", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def answers(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).status == 200
    except OSError:
        return False


def test_a_demo_killed_with_sigkill_takes_its_daphne_with_it(tmp_path):
    port = free_port()
    demo = start_demo(tmp_path, port)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while not answers(port):
            assert demo.poll() is None, demo.stdout.read()
            assert time.monotonic() < deadline, "the demo did not serve within 90 s"
            time.sleep(0.3)
        children += psutil.Process(demo.pid).children(recursive=True)
        assert children, "the demo runs Daphne as a child process"
        demo.send_signal(signal.SIGKILL)
        demo.wait(10)
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"still running after the demo was killed: {[p.cmdline() for p in alive]}"
        assert not answers(port)
    finally:
        # A Daphne that outlived its demo is no longer our child: kill it by what was found above.
        for proc in [*children, *psutil.Process().children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def test_a_demo_whose_port_is_taken_says_so_and_never_claims_to_run(tmp_path):
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        demo = start_demo(tmp_path, port)
        out, _ = demo.communicate(timeout=90)
    assert demo.returncode != 0
    assert f"127.0.0.1:{port} is already in use" in out
    assert "is running" not in out
