"""On PostgreSQL, a placement report's verdicts are compressed with lz4 instead of pglz when the server has lz4.

Every decision writes a report (a preview, a submission, an approval); at 1,000 nodes its verdicts are about 21 KiB
of JSON, and the server spent 1.4 ms of an INSERT compressing them with pglz against 0.7 ms with lz4, for 19.5 KiB
stored instead of 13.4 KiB (docs/benchmarks/preview.md, run 5). Rows already written keep pglz, which
reads as before. A server built without lz4 keeps pglz, and SQLite has no such setting."""

from django.db import migrations

TABLE = "fleet_placementreport"


def _has_lz4(cursor) -> bool:
    cursor.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
    row = cursor.fetchone()
    return bool(row and row[0])


def _set_compression(method: str):
    def apply(apps, schema_editor):
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            if method == "lz4" and not _has_lz4(cursor):
                return
            cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN verdicts SET COMPRESSION {method}")

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0006_compact_report_json"),
    ]

    operations = [
        migrations.RunPython(_set_compression("lz4"), _set_compression("pglz"), elidable=False),
    ]
