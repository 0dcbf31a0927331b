# A placement report is written for every lease request a pass decides; its subject was indexed twice on
# PostgreSQL (db_index also builds a varchar_pattern_ops index for LIKE, which no query asks): now one plain index.
# See the note on text indexes in leases/models.py.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0009_heartbeat_updates_stay_on_their_page"),
    ]

    operations = [
        migrations.AlterField(
            model_name="placementreport",
            name="subject",
            field=models.CharField(max_length=64),
        ),
        migrations.AddIndex(
            model_name="placementreport",
            index=models.Index(fields=["subject"], name="report_subject_idx"),
        ),
    ]
