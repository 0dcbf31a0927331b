# A heartbeat rewrites its node's row. With last_heartbeat_at indexed, every such write was a new row version in
# each of fleet_node's ten indexes; without it, and with room left on each page (fillfactor 70), PostgreSQL updates
# the row in place on its page (a HOT update) and touches no index. Rows already written move to roomier pages as
# they are next updated.

from django.db import migrations, models


def fillfactor(value: str):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE fleet_node {value}")

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0008_report_verdicts_text"),
    ]

    operations = [
        migrations.AlterField(
            model_name="node",
            name="last_heartbeat_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(fillfactor("SET (fillfactor = 70)"), fillfactor("RESET (fillfactor)")),
    ]
