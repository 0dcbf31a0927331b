# Text columns indexed once: db_index / unique on a CharField also build a varchar_pattern_ops index on
# PostgreSQL (for LIKE, which no query here asks), and every lease request's instance, lease and reservation rows
# paid for it; and the foreign keys that a composite index already leads with (an allocation's reservation and
# node, an instance's node) lose their own index. See the note in leases/models.py.

import django.db.models.deletion
import leases.lifecycle
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0010_report_subject_plain_index'),
        ('leases', '0009_lease_idempotency_key'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='allocation',
            name='node',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='allocations', to='fleet.node'),
        ),
        migrations.AlterField(
            model_name='allocation',
            name='reservation',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='allocations', to='leases.reservation'),
        ),
        migrations.AlterField(
            model_name='instance',
            name='iid',
            field=models.CharField(max_length=64),
        ),
        migrations.AlterField(
            model_name='instance',
            name='node',
            field=models.ForeignKey(db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='instances', to='fleet.node'),
        ),
        migrations.AlterField(
            model_name='instance',
            name='state',
            field=models.CharField(choices=[('requested', 'requested'), ('placed', 'placed'), ('fetching', 'fetching'), ('verified', 'verified'), ('loaded', 'loaded'), ('running', 'running'), ('unhealthy', 'unhealthy'), ('restarting', 'restarting'), ('stopping', 'stopping'), ('stopped', 'stopped'), ('finished', 'finished'), ('failed', 'failed'), ('lost', 'lost'), ('rescheduled', 'rescheduled'), ('revoked', 'revoked'), ('unloaded', 'unloaded')], max_length=16),
        ),
        migrations.AlterField(
            model_name='lease',
            name='state',
            field=models.CharField(choices=[('new', 'new'), ('pending', 'pending'), ('rejected', 'rejected'), ('scheduled', 'scheduled'), ('queued', 'queued'), ('cancelled', 'cancelled'), ('preparing', 'preparing'), ('ready', 'ready'), ('active', 'active'), ('suspending', 'suspending'), ('suspended_pending', 'suspended pending'), ('suspended_queued', 'suspended queued'), ('suspended_scheduled', 'suspended scheduled'), ('migrating', 'migrating'), ('resuming', 'resuming'), ('resumed_ready', 'resumed ready'), ('done', 'done'), ('failed', 'failed'), ('rejected_by_user', 'rejected by user')], default=leases.lifecycle.LeaseState['NEW'], max_length=24),
        ),
        migrations.AlterField(
            model_name='reservation',
            name='status',
            field=models.CharField(choices=[('scheduled', 'scheduled'), ('active', 'active'), ('done', 'done'), ('cancelled', 'cancelled')], max_length=16),
        ),
        migrations.AddIndex(
            model_name='instance',
            index=models.Index(fields=['state'], name='instance_state_idx'),
        ),
        migrations.AddIndex(
            model_name='lease',
            index=models.Index(fields=['state'], name='lease_state_idx'),
        ),
        migrations.AddIndex(
            model_name='reservation',
            index=models.Index(fields=['status'], name='reservation_status_idx'),
        ),
        migrations.AddConstraint(
            model_name='instance',
            constraint=models.UniqueConstraint(fields=('iid',), name='instance_iid_unique'),
        ),
    ]
