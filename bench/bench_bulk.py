"""Benchmark a planning pass's row writes on PostgreSQL (slotkeeper/bulk.py): the client CPU of inserting a pass's
worth of placement reports and audit rows, each way the project has written them, alternating in the same run.

- reports as model instances against `bulk.Row`s (what `placement_report`, leases/planning/reporting.py, returns
  since 2ac1a38): building the objects, then inserting them;
- the same Rows with their plain JSON columns (request, chosen) prepared by Django's adapter, which psycopg dumps
  with Python's json (the baseline, as before 2d4fcc7), against JSON text cast to jsonb by the statement
  (`bulk._json_text`);
- audit rows as model instances (`audit.entry`) against Rows (`audit.entry_row`).

Each batch is inserted inside a transaction that is rolled back, so every round writes into the same tables. The
figure per variant is the lowest of the rounds (this host's speed drifts; the lowest is the least disturbed).

    .venv/bin/python bench/bench_bulk.py [--quick] [--rows 500] [--rounds 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_heartbeats import fresh_postgres, start_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--rows", type=int, default=500, help="rows a batch (a pass decides up to 500)")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    rounds = 5 if args.quick else args.rounds

    start_django(fresh_postgres("slotkeeper_bench_bulk"))
    from django.db import transaction
    from django.utils import timezone

    from fleet.models import PlacementReport
    from leases.models import Lease
    from slotkeeper import audit, bulk
    from slotkeeper.models import AuditEntry

    now = timezone.now()
    # A report's fields as a pass builds them: its request and chosen nodes are JSON; its verdicts (text JSON with
    # an encoder of its own) a 1,000-node report's packed columns.
    verdicts = {
        "v": 2,
        "summary": "needs 2 × (4 cores, 16 GiB): 212 nodes hold it, 788 do not",
        "node": {"steps": [1, 1000]},
        "holds": {"runs": [0, 600, 2, 212, 0, 188]},
        "free": list(range(0, 32000, 32)),
        "rank": list(range(1000, 0, -1)),
    }

    def fields(i: int) -> dict:
        return {
            "created_at": now,
            "subject": f"lease:{i}",
            "request": {"type": "best_effort", "vnodes": [{"cpu": 400, "mem": 16384, "disk": 0}] * 2,
                        "duration_s": 3600.0},
            "outcome": "placed",
            "message": f"running on node-{i % 1000:04d}",
            "chosen": [f"node-{i % 1000:04d}", f"node-{(i + 1) % 1000:04d}"],
            "verdicts": verdicts,
            "requested_by": "operator",
        }  # fmt: skip

    lease = Lease.objects.create(name="bench", type="best_effort", duration_s=60, vnodes=[{"cpu_cores": 1}],
        submitted_at=now)  # fmt: skip
    n = args.rows
    plain_json = bulk._plain_json

    def reports_as_models() -> None:
        bulk.insert_many([PlacementReport(**fields(i)) for i in range(n)])

    def reports_as_rows() -> None:
        bulk.insert_many([bulk.Row(**fields(i)) for i in range(n)], model=PlacementReport)

    def json_by_django(write: Callable[[], None]) -> Callable[[], None]:
        """`write` with every JSON value prepared by Django's adapter (how bulk.py wrote them before 2d4fcc7)."""

        def baseline() -> None:
            bulk._plain_json = lambda field: False
            try:
                write()
            finally:
                bulk._plain_json = plain_json

        return baseline

    def audit_as_models() -> None:
        bulk.insert_many([audit.entry(at=now, actor=None, action="lease.submit", target=lease,
            details={"type": "best_effort", "accepted": True, "message": ""}) for _ in range(n)])  # fmt: skip

    def audit_as_rows() -> None:
        bulk.insert_many([audit.entry_row(at=now, actor=None, action="lease.submit", target=lease,
            details={"type": "best_effort", "accepted": True, "message": ""}) for _ in range(n)],
            model=AuditEntry)  # fmt: skip

    variants: list[tuple[str, Callable[[], None]]] = [
        ("reports, model instances, JSON through Django", json_by_django(reports_as_models)),
        ("reports, Rows, JSON through Django (baseline)", json_by_django(reports_as_rows)),
        ("reports, Rows, JSON as text (now)", reports_as_rows),
        ("audit rows, model instances (baseline)", audit_as_models),
        ("audit rows, Rows (now)", audit_as_rows),
    ]

    best = {name: float("inf") for name, _ in variants}
    for k in range(rounds):
        print(f"  round {k + 1}/{rounds}", file=sys.stderr, flush=True)
        for name, run in variants:
            with transaction.atomic():
                started = time.thread_time()
                run()
                best[name] = min(best[name], time.thread_time() - started)
                transaction.set_rollback(True)
    print(
        f"a pass's row writes on PostgreSQL: {n} rows a batch, lowest client CPU of {rounds} rounds, alternating"
    )
    for name, _ in variants:
        print(f"  {name:48s} {1000 * best[name]:8.2f} ms  {1e6 * best[name] / n:7.1f} us a row")
    base, now_ = (
        best["reports, Rows, JSON through Django (baseline)"],
        best["reports, Rows, JSON as text (now)"],
    )
    print(f"  JSON as text: {now_ / base:.2f} of the baseline's CPU for the reports")


if __name__ == "__main__":
    main()
