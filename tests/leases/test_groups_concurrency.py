"""Anti-affinity holds when many moves happen at once (seed 002, Nova bug 1735407), on PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleet import actions as fleet_actions
from leases import actions, instance_rows
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reschedules
from leases.instances.models import Reschedule
from leases.models import Group, Instance
from tests.conftest import requires_postgres
from tests.leases.invariants import overcommitted_instants

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]


def make_nodes(names, mem=16384):
    now = timezone.now()
    nodes = []
    for name in names:
        node, _ = fleet_actions.do_register_node(
            None, name=name, cpu_cores=8, mem_total_mib=mem, disk_total_gib=100, capabilities=[], now=now
        )
        report = fleet_actions.HealthReport(mem, 1000, 90.0, 1.0, 0.1)
        nodes.append(node_actions.do_heartbeat(node, report, now=now))
    return nodes


def member(group: Group, name: str, mem=4096) -> Instance:
    spec = actions.LeaseSpec(
        name=name,
        type="immediate",
        duration_s=3600,
        vnodes=[{"cpu_cores": 1, "mem_mib": mem, "disk_gib": 1}],
        groups=(group.name,),
    )
    lease = actions.do_submit_lease(None, spec, now=timezone.now()).lease
    assert lease.state == "active", lease.message
    return Instance.objects.get(lease=lease)


def group_violations() -> list[tuple]:
    """(group, node, live members) wherever a hard anti-affinity group has more members on a node than it allows."""
    sql = """
        SELECT g.name, i.node_id, COUNT(*) FROM leases_instance i
        JOIN leases_group_leases gl ON gl.lease_id = i.lease_id
        JOIN leases_group g ON g.id = gl.group_id
        WHERE g.policy = 'anti_affinity' AND g.hard AND i.state = ANY(%s)
        GROUP BY g.name, g.max_per_node, i.node_id HAVING COUNT(*) > g.max_per_node
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(instance_rows.LIVE)])
        return cursor.fetchall()


def test_two_processes_approving_at_the_same_instant_never_share_the_survivor():
    nodes = make_nodes(["host1", "host2", "host3"])
    group = Group.objects.create(name="web", policy="anti_affinity", hard=True)
    first, second = member(group, "web-1"), member(group, "web-2")
    assert first.node_id != second.node_id
    survivor = next(n for n in nodes if n.pk not in {first.node_id, second.node_id})
    for inst in (first, second):
        node_actions.do_declare_dead(None, inst.node_id, reason="rack power", now=timezone.now())
    ids = list(Reschedule.objects.order_by("pk").values_list("pk", flat=True))
    assert len(ids) == 2
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "EMBEDDED_LOOP": "0",
        "LOG_LEVEL": "WARNING",
    }
    start_at = time.time() + 3.0  # both processes import Django first, then fire together
    procs = [
        subprocess.Popen(
            [sys.executable, "tests/leases/approve_worker.py", str(start_at), str(pk)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=settings.BASE_DIR,
        )
        for pk in ids
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    lines = sorted(out.strip() for out, _ in outputs)
    assert sorted(line.split()[1] for line in lines) == ["ok", "pending"], lines
    assert Instance.objects.filter(node=survivor, state__in=instance_rows.LIVE).count() == 1
    pending = Reschedule.objects.get(status="pending")
    assert pending.blocked_by == "anti_affinity"
    assert group_violations() == []


# Four rounds kill four different sets of eight nodes; the 20 rounds of the full drill run as a benchmark
# (bench/bench_concurrency.py) to keep the suite's PostgreSQL pass short.
@pytest.mark.parametrize("round_", range(int(os.environ.get("SLOTKEEPER_GROUP_ROUNDS", "4"))))
def test_eight_workers_evacuating_eight_nodes_break_no_group(round_):
    nodes = make_nodes([f"r{round_}-n{i:02d}" for i in range(20)])
    groups = [
        Group.objects.create(name=f"g{round_}-{k}", policy="anti_affinity", hard=True) for k in range(10)
    ]
    for group in groups:
        for m in range(5):
            member(group, f"{group.name}-m{m}", mem=1024)
    assert group_violations() == []
    dead = nodes[round_ % 12 : round_ % 12 + 8]
    for node in dead:
        node_actions.do_declare_dead(None, node.pk, reason="evacuation drill", now=timezone.now())
    ids = list(Reschedule.objects.filter(status="pending").values_list("pk", flat=True))
    assert ids
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(chunk):
        try:
            barrier.wait()
            reschedules.do_approve(None, chunk, now=timezone.now())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    chunks = [ids[i::8] for i in range(8)]
    threads = [threading.Thread(target=worker, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert group_violations() == []
    assert overcommitted_instants() == []
    # Twelve survivors and groups of five: every move has a legal home, so none should be left behind.
    assert Reschedule.objects.filter(status="pending").count() == 0
    assert Instance.objects.filter(state="lost").count() == 0
