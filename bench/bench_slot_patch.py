"""Benchmark a live update of the slot table as issue 46 (item 2) asks: the patch of the rows that changed against
the table fetched whole, when 1, 10 and 100 nodes change on a 1,000-node fleet.

Target: a live update's bytes grow with the rows that changed on screen, not with the fleet or the pages loaded.

One throwaway SQLite database (/tmp), filled as bench_slot_page.py fills its own (bench_slots_render.build: 1,000
nodes, ten reservations a node laid end to end over a 24 h window; every 50th node draining). A signed-in viewer
(Django's test Client) times, after one warm-up each, with 4 row pages loaded (200 rows) and with all 20 (1,000):

- the full refresh, as the table fetched itself on every live event before and still does when a patch cannot be
  had: `GET /slots/?...&pages=N` (htmx);
- the patch (`POST /slots/patch/` with the versions of the loaded rows, as console.js sends them): with nothing
  changed; after 1, 10 and 100 of the loaded nodes changed (the memory of each of their reservations moved, which
  changes their bars' words but not their height; the same nodes again each round, spread over the pages); and
  after one node grew a lane (an overlapping reservation that comes and goes each round): the rows below it on its
  page move down, so they are sent with the page's frame;
- the full refresh and the patch with nothing changed once more with the memo of drawn rows emptied before each
  request (leases/slotchart.py, DrawnRows): every row laid out and drawn, as every request did before the memo, the
  baseline of its server time in this run.

Prints p50/p95 wall and CPU ms, KiB and rows sent (the largest response's), queries run, then the bytes a changed
row costs. A patch may send a row more than the nodes changed: a row's words hold its committed-now figures, which
move whenever one of the fleet's reservations starts or ends (every few seconds here).

    .venv/bin/python bench/bench_slot_patch.py [--quick] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from against_main import setup, viewer  # noqa: E402

# Other sessions on this machine run benchmarks too: SLOT_PATCH_BENCH_DIR keeps this run's files apart.
_DIR = Path(os.environ.get("SLOT_PATCH_BENCH_DIR", "/tmp"))
DB = _DIR / "slotkeeper_bench_slot_patch.sqlite3"
NODES, RESERVATIONS = 1000, 10_000
LOADED = (4, 20)  # row pages loaded: 200 rows, and the whole fleet
CHANGED = (1, 10, 100)


def measure(client, send, repeat: int, before=None) -> dict:
    """Wall and CPU ms of `repeat` requests (`send()` makes one) after one warm-up, `before(i)` untimed before each;
    the size of the largest response and the queries of one more."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    wall, cpu, size, rows = [], [], 0, 0
    for i in range(repeat + 1):
        if before is not None:
            before(i)
        t, c = time.perf_counter(), time.thread_time()
        resp = send()
        if resp.status_code != 200:
            raise SystemExit(f"answered {resp.status_code}: {resp.content[:300]!r}")
        if i:
            wall.append(1000 * (time.perf_counter() - t))
            cpu.append(1000 * (time.thread_time() - c))
        size = max(size, len(resp.content))
        rows = max(rows, len(re.findall(r'role="row"', resp.content.decode())))
    with CaptureQueriesContext(connection) as captured:
        send()
    patched = resp.headers.get("X-Slot-Patch")
    # The most rows one response sent (a case that alternates, as the grown lane does, sends none every other time).
    return {
        "wall": wall,
        "cpu": cpu,
        "kib": size / 1024,
        "queries": len(captured),
        "rows": rows if patched else None,
    }


def shown(body: str) -> dict[str, str]:
    """What console.js posts for the table in `body` (slotsShown): its window, node count, versions."""
    table = re.search(r'<div id="slot-table"[^>]*>', body, re.S).group(0)
    rows = re.findall(r'role="row"[^>]*id="slot-row-(\d+)" data-v="(\w+)"', body)
    return {
        "at": re.search(r'data-window="([^"]*)"', table).group(1),
        "nodes": re.search(r'data-nodes="(\d+)"', table).group(1),
        "now_line": "1" if '<line class="now"' in body else "0",
        "pages": ",".join(re.findall(r'id="slot-page-\d+" data-page="\d+" data-v="(\w+)"', body)),
        "rows": ",".join(f"{n}.{v}" for n, v in rows),
        **{
            name: re.search(rf'id="{id_}"[^>]*data-v="(\w*)"', body).group(1)
            for name, id_ in (
                ("summary", "slot-summary"),
                ("ending", "slot-ending"),
                ("forecast", "slot-estimates"),
            )
        },
    }


def spread(ids: list[int], count: int) -> list[int]:
    """`count` of the ids, evenly spaced (a change on every page, not only the first)."""
    step = len(ids) / count
    return [ids[int(k * step)] for k in range(count)]


def cases(client, start: datetime, pages: int, repeat: int) -> dict:
    from django.db.models import F

    from leases import slotchart
    from leases.models import Allocation, Lease, Reservation

    query = urlencode({"zoom": "24h", "from": start.isoformat()})
    table = f"/slots/?{query}&pages={pages}"
    # What the table shows: read again before each case, so that a case's patch carries its own changes only.
    have: dict[str, str] = {}

    def look() -> list[int]:
        have.update(shown(client.get(table, headers={"HX-Request": "true"}).content.decode()))
        return [int(item.partition(".")[0]) for item in have["rows"].split(",")]

    ids = look()
    assert len(ids) == pages * 50, len(ids)

    def patch():
        return client.post(f"/slots/patch/?{query}", have, headers={"HX-Request": "true"})

    def forget(i):
        slotchart.DRAWN.clear()

    def full():
        return client.get(table, headers={"HX-Request": "true"})

    out = {
        f"full refresh ({pages} pages), no row drawn before": measure(client, full, repeat, forget),
        f"full refresh ({pages} pages)": measure(client, full, repeat),
        "patch, nothing changed, no row drawn before": measure(client, patch, repeat, forget),
        "patch, nothing changed": measure(client, patch, repeat),
    }
    for count in CHANGED:
        changed = spread(ids, count)
        look()

        def change(i, changed=changed):
            Allocation.objects.filter(node_id__in=changed).update(mem_mib=F("mem_mib") + 1)

        name = f"patch, {count} node{'s' if count > 1 else ''} changed"
        out[name] = measure(client, patch, repeat, change)
        # More when a reservation started or ended meanwhile: a row's committed-now figures are in its words.
        if out[name]["rows"] < count:
            raise SystemExit(f"{name}: the patch sent {out[name]['rows']} rows")

    # One node of the second page grows a lane and loses it again, round after round.
    grower = ids[50]
    lease = Lease.objects.create(name="grows-a-lane", type="best_effort", state="scheduled", submitted_at=start,
                                 requested_start=start, duration_s=3600, vnodes=[{"cpu_cores": 1, "mem_mib": 512}])  # fmt: skip
    first = Allocation.objects.filter(node_id=grower).order_by("start").first()
    rid = (Reservation.objects.order_by("-rid").values_list("rid", flat=True).first() or 0) + 1
    res = Reservation.objects.create(lease=lease, rid=rid, kind="vm", start=first.start, end=first.end,
                                     status="scheduled", nodes={"1": grower})  # fmt: skip
    extra = Allocation.objects.create(reservation=res, node_id=grower, start=first.start, end=first.end, cpu=100,
                                      mem_mib=512)  # fmt: skip
    away = timedelta(days=30)

    def grow(i):
        shift = away if i % 2 else -away  # out of the window and back into it
        Allocation.objects.filter(pk=extra.pk).update(start=F("start") + shift, end=F("end") + shift)

    Allocation.objects.filter(pk=extra.pk).update(start=F("start") + away, end=F("end") + away)
    look()
    out["patch, 1 node grew a lane (row 1 of page 2)"] = measure(client, patch, repeat, grow)
    lease.delete()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 requests per case instead of 20")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    repeat = args.repeat or (5 if args.quick else 20)

    from bench_heartbeats import fresh_sqlite, pct

    setup(BENCH.parent, fresh_sqlite(DB))
    from bench_slots_render import build
    from django.utils import timezone

    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(hours=4)
    print(f"  ... writing {NODES} nodes and {RESERVATIONS} reservations to {DB}", file=sys.stderr)
    build(NODES, RESERVATIONS, start, now, random.Random(args.seed))
    client = viewer()

    print(f"slot table live update on sqlite, {NODES:,} nodes x 24 h x {RESERVATIONS:,} reservations, "
          f"{repeat} requests each")  # fmt: skip
    for pages in LOADED:
        results = cases(client, start, pages, repeat)
        print(f"\n  {pages} row pages loaded ({pages * 50} rows)")
        print(f"  {'update':<52}{'wall p50':>9}{'wall p95':>10}{'cpu p50':>9}{'cpu p95':>9}{'KiB':>9}{'queries':>9}"
              f"{'rows sent':>11}")  # fmt: skip
        for name, r in results.items():
            kib = f"{r['kib']:9.0f}" if r["kib"] >= 10 else f"{r['kib']:9.2f}"
            rows = "all" if r["rows"] is None else str(r["rows"])
            print(f"  {name:<52}{pct(r['wall'], 50):9.1f}{pct(r['wall'], 95):10.1f}{pct(r['cpu'], 50):9.1f}"
                  f"{pct(r['cpu'], 95):9.1f}{kib}{r['queries']:9d}{rows:>11}")  # fmt: skip
        live = {n: results[f"patch, {n} node{'s' if n > 1 else ''} changed"]["kib"] * 1024 for n in CHANGED}
        whole = results[f"full refresh ({pages} pages)"]["kib"]
        print(f"  a live update: {live[1]:,.0f} B for 1 node changed, {live[10]:,.0f} B for 10, {live[100]:,.0f} B "
              f"for 100 (about {(live[100] - live[1]) / 99:,.0f} B a row), against {whole:,.0f} KiB fetched whole")  # fmt: skip
    load = os.getloadavg()
    print(
        f"\n  load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (1, 5, 15 min) on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
