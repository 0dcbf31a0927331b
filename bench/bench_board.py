"""Benchmark the fleet board as issue 46 (items 1 and 2) asks: a page of it, and a live update, at 1,000 and 10,000
nodes.

Targets: page p95 <= 300 ms and <= 300 KiB at 1,000 nodes, p95 <= 500 ms at 10,000; a live update's bytes grow with
the rows that changed on screen, not with the fleet.

Two throwaway SQLite databases (/tmp), each filled with bulk ORM creates (bench_slots_render.build: ten reservations
a node over a day, every 50th node draining, as bench_slot_page.py's 1,000-node database), then every node given a
heartbeat (observed memory, disk, CPU and an age of up to a minute). A signed-in viewer (Django's test Client)
times, after one warm-up each:

- this tree: the page (`/`), the page sorted by committed now, page 5 sorted by health age, a search, the table
  htmx fetches when a filter changes; and the live update (`/board/patch/` with the versions of page 1's rows):
  with nothing changed (a resync, or a change to a node on another page), and after 1, 10 and 100 nodes of the page
  changed (their observed memory and heartbeat, as a heartbeat does; the same nodes again each round);
- baseline, in the same run on the same databases: `main`'s page and its live update, which re-fetched the whole
  board table (a `git archive` of it in /tmp, timed in a child process with that tree first on sys.path). At
  10,000 nodes the baseline renders a few times only (it takes seconds a render).

Prints p50/p95 wall and CPU ms, KiB sent and queries run, and each target's PASS or FAIL.

    .venv/bin/python bench/bench_board.py [--quick] [--repeat 20] [--baseline-ref main] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from against_main import child_result, export, setup, viewer  # noqa: E402

# Other sessions on this machine run benchmarks too: BOARD_BENCH_DIR keeps this run's files apart.
_DIR = Path(os.environ.get("BOARD_BENCH_DIR", "/tmp"))
BASELINE_TREE = _DIR / "slotkeeper_bench_board_baseline"
SIZES = {1000: 10_000, 10_000: 100_000}  # nodes: reservations
PAGE_TARGET_MS = {1000: 300.0, 10_000: 500.0}
PAGE_TARGET_KIB = 300.0
CHANGED = (1, 10, 100)


def db_path(nodes: int) -> Path:
    return _DIR / f"slotkeeper_bench_board_{nodes}.sqlite3"


def heartbeats(now) -> None:
    """Every node heartbeated within the last minute, with its own observed figures."""
    from django.db.models import F, Value
    from django.db.models.functions import Mod

    from fleet.models import Node

    Node.objects.update(
        last_heartbeat_at=Value(now),
        obs_mem_total_mib=F("mem_total_mib"),
        obs_mem_used_mib=Value(4000) + Mod(F("id") * 7919, Value(40000)),
        obs_disk_free_gib=Value(300.0),
        obs_cpu_pct=Mod(F("id") * 31, Value(100)) * 1.0,
        obs_load1=Value(0.5),
    )
    # Ages differ, from 0 to 59 s, as a live fleet's do.
    for seconds in range(1, 60):
        Node.objects.annotate(slot=Mod(F("id"), Value(60))).filter(slot=seconds).update(
            last_heartbeat_at=now - timedelta(seconds=seconds)
        )


def measure(client, url, repeat: int, htmx: bool, before=None) -> dict:
    """Wall and CPU ms of `repeat` requests after one warm-up (`before(i)` runs untimed before each), the size of
    the largest response and the queries of one more request."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    headers = {"HX-Request": "true"} if htmx else {}
    wall, cpu, size = [], [], 0
    for i in range(repeat + 1):
        if before is not None:
            before(i)
        target = url() if callable(url) else url
        t, c = time.perf_counter(), time.thread_time()
        resp = client.get(target, headers=headers)
        if resp.status_code != 200:
            raise SystemExit(f"{target[:200]} answered {resp.status_code}")
        if i:
            wall.append(1000 * (time.perf_counter() - t))
            cpu.append(1000 * (time.thread_time() - c))
        size = max(size, len(resp.content))
    with CaptureQueriesContext(connection) as captured:
        client.get(url() if callable(url) else url, headers=headers)
    return {"wall": wall, "cpu": cpu, "kib": size / 1024, "queries": len(captured)}


def shown(body: str) -> dict[str, str]:
    """The patch parameters a live page sends: its rows' keys and versions, and the totals' and pager's versions."""
    rows = re.findall(r'<tr id="[^"]*" data-key="(\w+)"[^>]*data-v="(\w+)"', body)
    versions = {name: re.search(rf'id="{name}" [^>]*data-v="(\w+)"', body).group(1)
                for name in ("fleet-summary", "fleet-pager")}  # fmt: skip
    return {"have": ",".join(f"{k}.{v}" for k, v in rows), "sv": versions["fleet-summary"],
            "pv": versions["fleet-pager"], "ids": [int(k) for k, _ in rows]}  # fmt: skip


def live_cases(client, repeat: int) -> dict:
    """The live update: the patch of page 1 with nothing changed, then with 1, 10 and 100 of its nodes changed."""
    from urllib.parse import urlencode

    from django.db.models import F
    from django.utils import timezone

    from fleet.models import Node

    page = shown(client.get("/").content.decode())
    url = "/board/patch/?" + urlencode({k: page[k] for k in ("have", "sv", "pv")})
    out = {"live update, nothing changed": measure(client, url, repeat, True)}
    for count in CHANGED:
        ids = page["ids"][:count]

        def change(i, ids=ids):
            # A heartbeat on each: new memory figures and a fresh age.
            Node.objects.filter(pk__in=ids).update(
                obs_mem_used_mib=F("obs_mem_used_mib") + 64, last_heartbeat_at=timezone.now()
            )

        out[f"live update, {count} node{'s' if count > 1 else ''} changed"] = measure(
            client, url, repeat, True, change
        )
    return out


def child(args) -> None:
    """Runs inside a tree (this one, or the baseline's export): times its cases, prints them as JSON."""
    setup(Path(args.root), f"sqlite:///{db_path(args.nodes)}")
    import leases

    if not Path(leases.__file__).resolve().is_relative_to(Path(args.root).resolve()):
        raise SystemExit(f"measuring {leases.__file__}, not the tree in {args.root}")
    client = viewer()
    ref = args.baseline_ref
    if args.baseline:
        out = {
            f"{ref}: page": measure(client, "/", args.repeat, False),
            f"{ref}: live update (the whole table)": measure(client, "/", args.repeat, True),
        }
    else:
        out = {
            "page": measure(client, "/", args.repeat, False),
            "page, sorted by committed now": measure(client, "/?sort=-committed", args.repeat, False),
            "page 5, sorted by health age": measure(client, "/?sort=-age&page=5", args.repeat, False),
            'search "node-00"': measure(client, "/?q=node-00", args.repeat, False),
            "table (filter form, htmx)": measure(client, "/?status=online&sort=observed", args.repeat, True),
            **live_cases(client, args.repeat),
        }
    print("RESULT" + json.dumps(out))


def run_in(root: Path, nodes: int, repeat: int, baseline: bool, ref: str = "main") -> dict:
    cmd = [sys.executable, __file__, "--child", "--root", str(root), "--nodes", str(nodes)]
    cmd += ["--repeat", str(repeat), "--baseline-ref", ref] + (["--baseline"] if baseline else [])
    return child_result(cmd, root)


def build(nodes: int, reservations: int, seed: int) -> None:
    """A fresh database of `nodes` heartbeating nodes and `reservations` reservations (in a child process: one
    Django set-up per database)."""
    cmd = [sys.executable, __file__, "--build", "--nodes", str(nodes), "--reservations", str(reservations)]
    subprocess.run([*cmd, "--seed", str(seed)], cwd=BENCH.parent, check=True)


def build_here(args) -> None:
    from bench_heartbeats import fresh_sqlite

    setup(BENCH.parent, fresh_sqlite(db_path(args.nodes)))
    from bench_slots_render import build as fill
    from django.utils import timezone

    now = timezone.now().replace(microsecond=0)
    started = time.perf_counter()
    fill(args.nodes, args.reservations, now - timedelta(hours=4), now, random.Random(args.seed))
    heartbeats(now)
    print(f"  ... {args.nodes:,} nodes and {args.reservations:,} reservations written to {db_path(args.nodes)} in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)  # fmt: skip


def report(nodes: int, results: dict, repeat: int, label: str) -> None:
    from bench_heartbeats import pct

    print(
        f"\nfleet board on sqlite, {nodes:,} nodes x {SIZES[nodes]:,} reservations, {repeat} requests each ({label})"
    )
    print(
        f"  {'view':<42}{'wall p50':>9}{'wall p95':>10}{'cpu p50':>9}{'cpu p95':>9}{'KiB':>9}{'queries':>9}"
    )
    for name, r in results.items():
        kib = f"{r['kib']:9.0f}" if r["kib"] >= 10 else f"{r['kib']:9.2f}"
        print(
            f"  {name:<42}{pct(r['wall'], 50):9.1f}{pct(r['wall'], 95):10.1f}{pct(r['cpu'], 50):9.1f}"
            f"{pct(r['cpu'], 95):9.1f}{kib}{r['queries']:9d}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 requests per view instead of 20")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-ref", default="main")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--reuse", action="store_true", help="keep the databases of the last run")
    parser.add_argument(
        "--repo",
        default=str(BENCH.parent),
        help="the git repository holding the baseline ref (when run from an export)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--reservations", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.repeat = args.repeat or (5 if args.quick else 20)
    if args.child:
        child(args)
        return
    if args.build:
        build_here(args)
        return

    sys.path.insert(0, str(BENCH))
    from bench_heartbeats import pct

    tree = None if args.no_baseline else export(args.baseline_ref, Path(args.repo), BASELINE_TREE)
    ref = subprocess.run(["git", "rev-parse", "--short", args.baseline_ref], cwd=args.repo,
                         capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    checks = []
    for nodes, reservations in SIZES.items():
        if not (args.reuse and db_path(nodes).exists()):
            build(nodes, reservations, args.seed)
        results = {}
        if tree is not None:
            # The baseline renders every node: at 10,000 a render takes seconds, so a few renders only.
            base_repeat = min(args.repeat, 5 if nodes <= 1000 else 2)
            results.update(run_in(tree, nodes, base_repeat, baseline=True, ref=args.baseline_ref))
        results.update(run_in(BENCH.parent, nodes, args.repeat, baseline=False))
        label = "no baseline" if tree is None else f"baseline {args.baseline_ref} = {ref}, fewer requests"
        report(nodes, results, args.repeat, label)
        page = results["page"]
        checks.append((f"{nodes:,} nodes: page p95 wall", pct(page["wall"], 95), PAGE_TARGET_MS[nodes], "ms"))
        if nodes <= 1000:
            checks.append((f"{nodes:,} nodes: page payload", page["kib"], PAGE_TARGET_KIB, "KiB"))
        live = {n: results[f"live update, {n} node{'s' if n > 1 else ''} changed"] for n in CHANGED}
        per_row = (live[100]["kib"] - live[1]["kib"]) * 1024 / 99
        print(f"  a live update: {live[1]['kib'] * 1024:,.0f} B for 1 node changed, "
              f"{live[10]['kib'] * 1024:,.0f} B for 10, {live[100]['kib'] * 1024:,.0f} B for 100 "
              f"(about {per_row:,.0f} B a row)")  # fmt: skip
        if tree is not None:
            whole = results[f"{args.baseline_ref}: live update (the whole table)"]
            print(f"  {args.baseline_ref} re-fetched {whole['kib']:,.0f} KiB for any change "
                  f"(p95 {pct(whole['wall'], 95):,.0f} ms)")  # fmt: skip
    load = os.getloadavg()
    print(
        f"\n  load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (1, 5, 15 min) on {os.cpu_count()} cores"
    )
    for name, value, target, unit in checks:
        print(
            f"  {name}: {value:.0f} {unit}: {'PASS' if value <= target else 'FAIL'} against {target:g} {unit}"
        )


if __name__ == "__main__":
    main()
