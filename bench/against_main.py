"""What the console benchmarks that measure a page against another revision share (bench_slot_page.py,
bench_board.py): Django started in the tree being measured, a signed-in viewer, a child process per tree that
prints its figures as one RESULT line, and a clean export of the baseline revision."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def setup(root: Path, database_url: str) -> None:
    """Django started on `database_url` with the tree at `root` first on the path (the tree measured)."""
    sys.path.insert(0, str(BENCH))
    from bench_heartbeats import start_django  # it puts this tree on sys.path: the tree measured goes first

    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH.parent]
    sys.path.insert(0, str(root))
    start_django(database_url)


def viewer():
    """A test client signed in as a viewer (created when missing)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from slotkeeper.management.commands.issue_token import grant_role

    user, _ = get_user_model().objects.get_or_create(username="vera")
    grant_role(user, "viewer")
    client = Client()
    client.force_login(user)
    return client


def child_result(cmd: list[str], root: Path) -> dict:
    """Run a benchmark's child in `root` and return the figures it printed after RESULT."""
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{root}: exit {done.returncode}\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[6:])


def export(ref: str, repo: Path, tree: Path) -> Path:
    """A clean export of `ref` (git archive of `repo`) into `tree`, replacing an older one."""
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree
