"""Benchmark placement-report retention on PostgreSQL: reports deleted a second by the periodic step
(`leases/instances/actions/retention.py`, its rules' subqueries included), against plain batched DELETEs by id of
as many copies of the same reports in the same run (the baseline), and the cost of a run with nothing due.

The reports are real: one placement preview at 1,000 nodes (bench_preview's fleet) gives a report, copied
`--reports` times with a creation time 40 days back, half as previews and half as decisions of leases that do not
exist (so every copy is due).

    .venv/bin/python bench/bench_retention.py [--quick] [--reports 20000]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_heartbeats import fresh_postgres, start_django, use_collector

COPY = """
INSERT INTO fleet_placementreport
    (created_at, subject, request, outcome, message, chosen, preferred_note, verdicts, requested_by)
SELECT now() - interval '40 days',
       CASE WHEN g %% 2 = 0 THEN 'preview' ELSE 'lease:' || (100000000 + g) END,
       request, outcome, message, chosen, preferred_note, verdicts, requested_by
FROM fleet_placementreport r, generate_series(1, %s) g WHERE r.id = %s
"""


def copies(report_id: int, n: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(COPY, [n, report_id])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4,000 reports")
    parser.add_argument("--reports", type=int, default=20_000)
    args = parser.parse_args()
    n = 4_000 if args.quick else args.reports

    start_django(fresh_postgres())
    use_collector("service")
    import bench_preview
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from fleet.models import PlacementReport
    from leases import actions
    from leases.instances.actions import retention
    from slotkeeper.management.commands.issue_token import issue

    bench_preview.build_fleet(1000, random.Random(7))
    issue("otto", "operator")
    user = get_user_model().objects.get(username="otto")
    data = {**bench_preview.NEED, "duration_s": 3600, "preferred_node": None}
    _, report = actions.do_preview(user, data, now=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_size(verdicts) FROM fleet_placementreport WHERE id = %s", [report.pk]
        )
        stored = cursor.fetchone()[0]
    print(
        f"report retention on PostgreSQL, {n:,} copies of a 1,000-node report ({stored / 1024:.1f} KiB stored)"
    )

    copies(report.pk, n)
    ids = list(PlacementReport.objects.exclude(pk=report.pk).order_by("id").values_list("id", flat=True))
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for i in range(0, len(ids), retention.BATCH):
            cursor.execute(
                "DELETE FROM fleet_placementreport WHERE id = ANY(%s)", [ids[i : i + retention.BATCH]]
            )
    plain = time.perf_counter() - started
    print(
        f"  plain DELETE by id, batches of {retention.BATCH:,} (baseline)  {len(ids) / plain:8.0f} reports/s"
    )

    copies(report.pk, n)
    started, deleted, calls = time.perf_counter(), 0, 0
    while True:
        got = retention.prune_reports(timezone.now(), budget_s=60)
        deleted, calls = deleted + got.total, calls + 1
        if not got.more:
            break
    pruned = time.perf_counter() - started
    print(
        f"  prune_reports (the periodic step)            {deleted / pruned:8.0f} reports/s "
        f"({deleted:,} in {pruned:.1f} s, {calls} calls; {plain / len(ids) * deleted / pruned:.2f}x the baseline's rate)"
    )
    idle = []
    for _ in range(20):
        started = time.perf_counter()
        retention.prune_reports(timezone.now())
        idle.append(1e3 * (time.perf_counter() - started))
    idle.sort()
    print(f"  a run with nothing due: p50 {idle[10]:.1f} ms, max {idle[-1]:.1f} ms")


if __name__ == "__main__":
    main()
