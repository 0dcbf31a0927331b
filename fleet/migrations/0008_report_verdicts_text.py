"""A placement report's verdicts are stored as text, not jsonb (fleet.models.JSONTextField).

PostgreSQL parses a jsonb value into its binary form on every write: at 1,000 nodes that was about 1 ms of server
time per report, and every decision writes one. Existing rows are converted with the column (`jsonb::text`, the
same document in the server's spacing) and read back as before. Changing a column's type resets its compression
to the server's default, so lz4 is set again (migration 0007). SQLite stores a JSONField as text already: only
the model state changes there.

The conversion rewrites the table under an exclusive lock: about 1.2 ms a report, measured (docs/operations.md,
"migrate")."""

import importlib

from django.db import migrations

import fleet.models

lz4 = importlib.import_module("fleet.migrations.0007_report_verdicts_lz4")


def _retype(to: str):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        schema_editor.execute(
            f"ALTER TABLE {lz4.TABLE} ALTER COLUMN verdicts TYPE {to} USING verdicts::{to}"
        )
        lz4._set_compression("lz4")(apps, schema_editor)

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0007_report_verdicts_lz4"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="placementreport",
                    name="verdicts",
                    field=fleet.models.JSONTextField(default=list, encoder=fleet.models.CompactJSONEncoder),
                ),
            ],
            database_operations=[migrations.RunPython(_retype("text"), _retype("jsonb"), elidable=False)],
        ),
    ]
