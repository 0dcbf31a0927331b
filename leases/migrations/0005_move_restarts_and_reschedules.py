# RestartRecord and Reschedule move to the instances app (leases/instances/models.py). Their tables stay
# (the new models name them in db_table), so this is a change of Django's state only: no row moves.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('leases', '0004_tick_failures'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
        migrations.RemoveField(
            model_name='restartrecord',
            name='instance',
        ),
        migrations.DeleteModel(
            name='Reschedule',
        ),
        migrations.DeleteModel(
            name='RestartRecord',
        ),
            ],
        ),
    ]
