# The instances app takes over RestartRecord and Reschedule with their existing tables (db_table): state only,
# no row moves (leases/migrations/0005 drops them from the lease app's state).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('fleet', '0004_fencing_and_sweep_state'),
        ('leases', '0005_move_restarts_and_reschedules'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
        migrations.CreateModel(
            name='RestartRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField()),
                ('attempt', models.PositiveIntegerField()),
                ('reason', models.TextField()),
                ('decision', models.CharField(choices=[('restart', 'restart now'), ('wait', 'wait'), ('exhausted', 'exhausted')], max_length=16)),
                ('next_eligible_at', models.DateTimeField(blank=True, null=True)),
                ('explanation', models.TextField(blank=True)),
                ('instance', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='restarts', to='leases.instance')),
            ],
            options={
                'db_table': 'leases_restartrecord',
                'ordering': ['at', 'id'],
            },
        ),
        migrations.CreateModel(
            name='Reschedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(choices=[('pending', 'pending'), ('applied', 'applied'), ('rejected', 'rejected')], db_index=True, default='pending', max_length=16)),
                ('cause', models.CharField(default='node_dead', max_length=32)),
                ('blocked_by', models.CharField(blank=True, help_text='why it is not applied yet: a reason code', max_length=32)),
                ('message', models.TextField(blank=True)),
                ('version', models.PositiveIntegerField(default=1)),
                ('created_at', models.DateTimeField()),
                ('decided_at', models.DateTimeField(blank=True, null=True)),
                ('decided_by', models.CharField(blank=True, max_length=150)),
                ('instance', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='reschedules', to='leases.instance')),
                ('lease', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='reschedules', to='leases.lease')),
                ('new_instance', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='created_by_reschedule', to='leases.instance')),
                ('proposed_node', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleet.node')),
                ('report', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='fleet.placementreport')),
            ],
            options={
                'db_table': 'leases_reschedule',
                'ordering': ['-created_at', '-id'],
                'constraints': [models.UniqueConstraint(condition=models.Q(('status', 'pending')), fields=('instance',), name='one_pending_reschedule_per_instance')],
            },
        ),
            ],
        ),
    ]
