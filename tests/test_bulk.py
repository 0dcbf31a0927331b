"""slotkeeper.bulk: one statement per table for a batch of rows, on SQLite and PostgreSQL alike, with every
object given its primary key and every value (JSON columns included) stored as bulk_create would store it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import PlacementReport
from slotkeeper.bulk import insert_many, update_many

pytestmark = pytest.mark.django_db


def report(i: int) -> PlacementReport:
    return PlacementReport(
        created_at=timezone.now(),
        subject=f"lease:{i}",
        request={"type": "immediate", "vnodes": [{"cpu_cores": 1, "mem_mib": 512 * i}]},
        outcome="placed" if i % 2 else "rejected",
        message=f"message {i} ‘quoted’ \\ %s",
        chosen=[f"node-{i}"],
        verdicts={"v": 2, "free": list(range(i, i + 50)), "summary": "needs 1 × (1 core)"},
        requested_by="bulk-test",
    )


def stored(objs) -> list[tuple]:
    fields = ("subject", "request", "outcome", "message", "chosen", "verdicts", "requested_by")
    return [tuple(getattr(o, f) for f in fields) for o in objs]


def test_insert_many_gives_every_object_its_row():
    made = [report(i) for i in range(1, 8)]
    assert insert_many(made) is made
    assert all(o.pk is not None and not o._state.adding for o in made)
    rows = PlacementReport.objects.filter(pk__in=[o.pk for o in made]).order_by("pk")
    assert [r.pk for r in rows] == sorted(o.pk for o in made)
    by_pk = {r.pk: r for r in rows}
    assert stored(by_pk[o.pk] for o in made) == stored(made)


def test_insert_many_splits_a_batch_larger_than_one_statement_takes():
    count = 1700  # several statements on SQLite (bulk_batch_size) and more than one pass ever writes
    made = [report(i % 40 + 1) for i in range(count)]
    insert_many(made)
    assert len({o.pk for o in made}) == count
    assert PlacementReport.objects.filter(requested_by="bulk-test").count() == count
    sample = made[::97]
    fetched = {r.pk: r for r in PlacementReport.objects.filter(pk__in=[o.pk for o in sample])}
    assert stored(fetched[o.pk] for o in sample) == stored(sample)


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="counts statements through Django's cursor (SQLite)"
)
def test_insert_many_writes_a_pass_worth_of_reports_in_one_statement_on_sqlite():
    with CaptureQueriesContext(connection) as queries:
        insert_many([report(i) for i in range(1, 30)])
    assert len(queries.captured_queries) == 1
    assert queries.captured_queries[0]["sql"].startswith("INSERT INTO")


def test_update_many_writes_the_fields_named_and_nothing_else():
    made = insert_many([report(i) for i in range(1, 6)])
    for o in made:
        o.message = f"changed {o.pk}"
        o.outcome = "should-not-be-written"
    assert update_many(made, ["message"]) == len(made)
    for r in PlacementReport.objects.filter(pk__in=[o.pk for o in made]):
        assert r.message == f"changed {r.pk}"
        assert r.outcome in ("placed", "rejected")
