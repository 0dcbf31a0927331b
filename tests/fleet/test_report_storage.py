"""How PostgreSQL stores a placement report's verdicts (fleet/migrations/0007_report_verdicts_lz4.py)."""

import importlib
import json

import pytest
from django.db import connection

from fleet.models import PlacementReport
from tests.conftest import T0, requires_postgres

pytestmark = [pytest.mark.django_db, requires_postgres]

lz4_migration = importlib.import_module("fleet.migrations.0007_report_verdicts_lz4")


def test_a_large_reports_verdicts_are_compressed_with_lz4_where_the_server_has_it():
    with connection.cursor() as cursor:
        # This machine's and CI's server have lz4; the migration keeps pglz on one built without it.
        assert lz4_migration._has_lz4(cursor)
        # Well past the size PostgreSQL compresses at (about 2 KiB), as a 1,000-node report's 21 KiB is.
        report = PlacementReport.objects.create(
            created_at=T0,
            subject="preview",
            request={},
            outcome="placed",
            message="",
            verdicts={"v": 2, "node": list(range(4000))},
        )
        cursor.execute(
            "SELECT pg_column_compression(verdicts) FROM fleet_placementreport WHERE id = %s", [report.pk]
        )
        assert cursor.fetchone()[0] == "lz4"
    report.refresh_from_db()
    assert report.verdicts["node"][3999] == 3999


def test_verdicts_are_stored_as_text_which_the_server_does_not_parse_on_every_write():
    # jsonb cost the server about 1 ms of parsing per 1,000-node report written (fleet.models.JSONTextField).
    blob = {"v": 2, "node": list(range(4000)), "summary": "fits on 3 of 4,000 nodes", "counts": {"fit": 3}}
    report = PlacementReport.objects.create(
        created_at=T0, subject="preview", request={}, outcome="placed", message="", verdicts=blob
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_typeof(verdicts)::text, (verdicts::jsonb)->'counts'->>'fit', pg_column_compression(verdicts)"
            " FROM fleet_placementreport WHERE id = %s",
            [report.pk],
        )
        assert cursor.fetchone() == ("text", "3", "lz4")  # still JSON to SQL readers, still lz4
    assert PlacementReport.objects.get(pk=report.pk).verdicts == blob


@pytest.mark.django_db(transaction=True)
def test_reports_written_as_jsonb_read_the_same_after_the_migration_to_text():
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("fleet", "0007_report_verdicts_lz4")], [("fleet", "0008_report_verdicts_text")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    blob = {"v": 2, "node": list(range(3000)), "summary": "placed", "texts": ["lacks “gpu”"]}
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fleet_placementreport (created_at, subject, request, outcome, message, chosen,"
            " preferred_note, verdicts, requested_by) VALUES (%s, 'lease:1', '{}', 'placed', '', '[]', '',"
            " %s::jsonb, '') RETURNING id",
            [T0, json.dumps(blob)],
        )
        pk = cursor.fetchone()[0]
        cursor.execute("SELECT pg_typeof(verdicts)::text FROM fleet_placementreport WHERE id = %s", [pk])
        assert cursor.fetchone()[0] == "jsonb"
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(after)
    with connection.cursor() as cursor:
        cursor.execute("SELECT verdicts FROM fleet_placementreport WHERE id = %s", [pk])
        assert json.loads(cursor.fetchone()[0]) == blob
    # Forward to the latest migrations again: the tests after this one on the same database read every column.
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert PlacementReport.objects.get(pk=pk).verdicts == blob
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attcompression FROM pg_attribute"
            " WHERE attrelid = 'fleet_placementreport'::regclass AND attname = 'verdicts'"
        )
        assert cursor.fetchone()[0] == "l"  # new rows compressed with lz4 again
