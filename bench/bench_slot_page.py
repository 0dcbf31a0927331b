"""Benchmark the slot table page as issue 13 (item 1) asks: lanes, level of detail and row pages, at fleet scale.

Targets at 1,000 nodes x 24 h x 10,000 reservations: page p95 <= 300 ms, a row page p95 <= 150 ms, payload under
500 KiB, and the same query count whatever the number of nodes or reservations.

One throwaway SQLite database (/tmp), filled with bulk ORM creates (bench_slots_render.build: one lease and one
single-node reservation a bar, ten a node laid end to end over the day; every 50th node draining). A signed-in
viewer (Django's test Client) times, after one warm-up each:

- this tree: the page (/slots/?zoom=24h&from=...), the live fragment htmx re-fetches (first page loaded), a row
  page (/slots/rows/?page=N, N cycling over 1..19), the live fragment with all 20 pages loaded (an operator who
  scrolled to the bottom), and the page at 7 d zoom (where the level of detail folds thin bars into strips);
- baseline, in the same run on the same database: the page and fragment of `main` (a `git archive` of it in /tmp,
  timed in a child process with that tree first on sys.path).

Prints p50/p95 wall and CPU ms, KiB sent and queries run.

    .venv/bin/python bench/bench_slot_page.py [--quick] [--repeat 20] [--baseline-ref main] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from against_main import child_result, export, setup, viewer  # noqa: E402

# Other sessions on this machine run the same benchmark: SLOT_PAGE_BENCH_DIR keeps this run's files apart.
_DIR = Path(os.environ.get("SLOT_PAGE_BENCH_DIR", "/tmp"))
DB = _DIR / "slotkeeper_bench_slot_page.sqlite3"
BASELINE_TREE = _DIR / "slotkeeper_bench_slot_page_baseline"
PAGE_TARGET_MS = 300.0
ROWS_TARGET_MS = 150.0
PAYLOAD_TARGET_KIB = 500.0
NODES, RESERVATIONS = 1000, 10_000


def measure(client, urls: list[str], repeat: int, htmx: bool) -> dict:
    """Wall and CPU ms of `repeat` renders (after one warm-up; the URLs taken in turn), the size of the last
    response and the queries of one more render of the first URL."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    headers = {"HX-Request": "true"} if htmx else {}
    wall, cpu, size = [], [], 0
    for i in range(repeat + 1):
        url = urls[i % len(urls)]
        t, c = time.perf_counter(), time.thread_time()
        resp = client.get(url, headers=headers)
        if resp.status_code != 200:
            raise SystemExit(f"{url} answered {resp.status_code}")
        if i:
            wall.append(1000 * (time.perf_counter() - t))
            cpu.append(1000 * (time.thread_time() - c))
        size = max(size, len(resp.content))
    with CaptureQueriesContext(connection) as captured:
        client.get(urls[0], headers=headers)
    return {"wall": wall, "cpu": cpu, "kib": size / 1024, "queries": len(captured)}


def cases(start: datetime, baseline: bool, ref: str = "main") -> list[tuple[str, list[str], bool]]:
    frm = f"from={start.isoformat()}".replace("+", "%2B")
    rows = [f"/slots/rows/?zoom=24h&{frm}&page={p}" for p in range(1, 20)]
    if baseline:
        # Row pages exist on main since the slot-table branch (a baseline older than that answers 404 there).
        return [
            (f"{ref}: page", [f"/slots/?zoom=24h&{frm}"], False),
            (f"{ref}: live fragment", [f"/slots/?zoom=24h&{frm}"], True),
            (f"{ref}: row page (50 rows)", rows, True),
        ]
    return [
        ("page", [f"/slots/?zoom=24h&{frm}"], False),
        ("live fragment, 1 page loaded", [f"/slots/?zoom=24h&{frm}"], True),
        ("row page (50 rows)", rows, True),
        ("live fragment, all 20 pages loaded", [f"/slots/?zoom=24h&{frm}&pages=20"], True),
        ("page, 7 d zoom (strips)", [f"/slots/?zoom=7d&{frm}"], False),
    ]


def child(args) -> None:
    """Runs inside a tree (this one, or the baseline's export): times its cases, prints them as JSON."""
    setup(Path(args.root), f"sqlite:///{DB}")
    start = datetime.fromisoformat(args.start)
    client = viewer()
    import leases

    if not Path(leases.__file__).resolve().is_relative_to(Path(args.root).resolve()):
        raise SystemExit(f"measuring {leases.__file__}, not the tree in {args.root}")
    out = {
        label: measure(client, urls, args.repeat, htmx)
        for label, urls, htmx in cases(start, args.baseline, args.baseline_ref)
    }
    print("RESULT" + json.dumps(out))


def run_in(root: Path, start: datetime, repeat: int, baseline: bool, ref: str = "main") -> dict:
    cmd = [sys.executable, __file__, "--child", "--root", str(root), "--start", start.isoformat()]
    cmd += ["--repeat", str(repeat), "--baseline-ref", ref] + (["--baseline"] if baseline else [])
    return child_result(cmd, root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 renders per view instead of 20")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-ref", default="main")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--repo",
        default=str(BENCH.parent),
        help="the git repository holding the baseline ref (when run from an export)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--start", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.repeat = args.repeat or (5 if args.quick else 20)
    if args.child:
        child(args)
        return

    from bench_heartbeats import fresh_sqlite, pct

    setup(BENCH.parent, fresh_sqlite(DB))
    from bench_slots_render import build
    from django.utils import timezone

    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(hours=4)
    print(f"  ... writing {NODES} nodes and {RESERVATIONS} reservations to {DB}", file=sys.stderr)
    build(NODES, RESERVATIONS, start, now, random.Random(args.seed))

    results = {}
    if not args.no_baseline:
        tree = export(args.baseline_ref, Path(args.repo), BASELINE_TREE)
        results.update(run_in(tree, start, args.repeat, baseline=True, ref=args.baseline_ref))
    results.update(run_in(BENCH.parent, start, args.repeat, baseline=False))

    baseline = subprocess.run(["git", "rev-parse", "--short", args.baseline_ref], cwd=args.repo,
                              capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    print(f"slot table page on sqlite, {NODES:,} nodes x 24 h x {RESERVATIONS:,} reservations, "
          f"{args.repeat} renders each (baseline {args.baseline_ref} = {baseline})")  # fmt: skip
    print(
        f"  {'view':<38}{'wall p50':>9}{'wall p95':>10}{'cpu p50':>9}{'cpu p95':>9}{'KiB':>7}{'queries':>9}"
    )
    for label, r in results.items():
        print(
            f"  {label:<38}{pct(r['wall'], 50):9.1f}{pct(r['wall'], 95):10.1f}{pct(r['cpu'], 50):9.1f}"
            f"{pct(r['cpu'], 95):9.1f}{r['kib']:7.0f}{r['queries']:9d}"
        )
    page, rows = results["page"], results["row page (50 rows)"]
    load = os.getloadavg()
    print(
        f"  load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (1, 5, 15 min) on {os.cpu_count()} cores"
    )
    checks = [
        ("page p95 wall", pct(page["wall"], 95), PAGE_TARGET_MS, "ms"),
        ("row page p95 wall", pct(rows["wall"], 95), ROWS_TARGET_MS, "ms"),
        ("page payload", page["kib"], PAYLOAD_TARGET_KIB, "KiB"),
    ]
    for name, value, target, unit in checks:
        print(
            f"  {name}: {value:.0f} {unit}: {'PASS' if value <= target else 'FAIL'} against {target:g} {unit}"
        )


if __name__ == "__main__":
    main()
