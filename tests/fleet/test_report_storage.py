"""How PostgreSQL stores a placement report's verdicts (fleet/migrations/0007_report_verdicts_lz4.py)."""

import importlib

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
