"""The buffered heartbeats' flush on PostgreSQL: one set-based statement for the idle fleet, writers racing it
(declare-dead, a cancel, another process's flush), and a real Daphne stopped cleanly (everything acknowledged is
written) and killed (at most one flush interval lost)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.actions import HealthReport
from fleet.heartbeats import Pending
from fleet.models import HealthSample, Node, NodeStatus
from leases import actions as lease_actions
from leases.instances.actions import heartbeats, loss
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reports as ingest
from leases.models import Instance
from slotkeeper.auth import node_token_of, node_tokens
from slotkeeper.models import hash_token
from tests.conftest import requires_postgres

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
HOLD_S = 1.5
IDLE = HealthReport(61440, 6144, 400.0, 5.0, 0.3)


def online(name, mem=61440):
    """A node brought online by its first heartbeat, with its token remembered as the route would have it."""
    now = timezone.now()
    node, raw = fleet_actions.do_register_node(
        None, name=name, cpu_cores=64, mem_total_mib=mem, disk_total_gib=500, capabilities=[], now=now
    )
    node_actions.do_heartbeat(node, HealthReport(mem, 1000, 90.0, 1.0, 0.1), now=now)
    node_tokens.put(node_token_of(Node.objects.get(pk=node.pk), hash_token(raw)))
    return Node.objects.get(pk=node.pk), raw


def pending(node, raw, report=IDLE, at=None):
    return Pending(token=node_tokens.get(hash_token(raw)), report=report, at=at or timezone.now())


def in_thread(target, errors):
    def run():
        try:
            target()
        except BaseException as exc:  # a thread's failure must fail the test
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_fifty_idle_nodes_are_written_in_one_update_and_one_insert_and_sampled_at_most_every_30_s():
    fleet = [online(f"n{i:02}") for i in range(50)]
    at = timezone.now() + timedelta(seconds=31)  # each node's first sample was its first heartbeat
    batch = {
        n.pk: [pending(n, raw, HealthReport(61440, 7000 + i, 300.0, 9.0, 1.5), at)]
        for i, (n, raw) in enumerate(fleet)
    }
    with CaptureQueriesContext(connection) as queries:
        done = heartbeats.flush(batch)
    assert (done.set_based, done.per_node, done.stale) == (50, 0, 0)
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().startswith(("WITH", "UPDATE", "INSERT"))
    ]
    assert len(writes) == 2, writes  # the node rows, then the history samples
    assert sorted(Node.objects.values_list("obs_mem_used_mib", flat=True)) == list(range(7000, 7050))
    assert set(Node.objects.values_list("last_heartbeat_at", flat=True)) == {at}
    assert HealthSample.objects.filter(at=at).count() == 50
    # Ten seconds later: written again, no new sample.
    later = {n.pk: [pending(n, raw, IDLE, at + timedelta(seconds=10))] for n, raw in fleet}
    heartbeats.flush(later)
    assert HealthSample.objects.filter(at__gt=at).count() == 0
    assert set(Node.objects.values_list("obs_mem_used_mib", flat=True)) == {6144}
    # Seed 001: an idle node's footprint is remembered from its idle reading, as the per-node path does.
    assert set(Node.objects.values_list("idle_baseline_mib", flat=True)) == {6144}


def test_an_older_heartbeat_flushed_late_by_another_process_does_not_overwrite_a_newer_one():
    node, raw = online("tank")
    newer, older = timezone.now(), timezone.now() - timedelta(seconds=1)
    heartbeats.flush({node.pk: [pending(node, raw, HealthReport(61440, 7000, 300.0, 9.0, 1.5), newer)]})
    done = heartbeats.flush(
        {node.pk: [pending(node, raw, HealthReport(61440, 5000, 300.0, 9.0, 1.5), older)]}
    )
    assert (done.set_based, done.stale, done.per_node) == (0, 0, 0)  # dropped, not taken the full way
    stored = Node.objects.get(pk=node.pk)
    assert (stored.last_heartbeat_at, stored.obs_mem_used_mib) == (newer, 7000)


def test_a_flush_racing_a_declare_dead_never_writes_a_fenced_node(monkeypatch):
    # The declare-dead holds the node (its instances being lost) when the flush arrives with a heartbeat sent
    # before the fence. The flush waits for the node's lock, then finds it fenced: nothing written, and the
    # heartbeat, sent before the fence, is not recorded as a call after it.
    node, raw = online("tank")
    entry = pending(node, raw, HealthReport(61440, 9999, 300.0, 9.0, 1.5))
    declaring, errors = threading.Event(), []
    real = loss.on_nodes_died

    def slow_loss(*args, **kwargs):
        declaring.set()
        time.sleep(HOLD_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(loss, "on_nodes_died", slow_loss)

    def declare():
        node_actions.do_declare_dead(None, node.pk, reason="rack power", now=timezone.now())

    def flush():
        assert declaring.wait(10)
        heartbeats.flush({node.pk: [entry]})

    for t in [in_thread(declare, errors), in_thread(flush, errors)]:
        t.join(30)
    assert errors == []
    stored = Node.objects.get(pk=node.pk)
    assert stored.status == NodeStatus.DEAD and stored.fenced_at is not None
    assert stored.obs_mem_used_mib == 1000 and stored.last_heartbeat_at < stored.fenced_at
    assert stored.last_fenced_heartbeat_at is None


def test_flushes_racing_declare_dead_write_nothing_to_a_node_once_its_fence_committed():
    # No injection: 20 nodes, one thread flushing their heartbeats as fast as it can (as another process that was
    # never told of the fences), another declaring them dead one by one. Whatever the interleaving, a node's row
    # as the declare-dead committed it is its row at the end: no heartbeat landed after the fence.
    fleet = [online(f"n{i:02}") for i in range(20)]
    tokens = {n.pk: node_tokens.get(hash_token(raw)) for n, raw in fleet}
    stop, errors, at_fence = threading.Event(), [], {}

    def flusher():
        while not stop.is_set():
            heartbeats.flush({pk: [Pending(token, IDLE, timezone.now())] for pk, token in tokens.items()})

    def declarer():
        for n, _ in fleet:
            node_actions.do_declare_dead(None, n.pk, reason="rack power", now=timezone.now())
            at_fence[n.pk] = Node.objects.values_list("last_heartbeat_at", "obs_mem_used_mib").get(pk=n.pk)
            time.sleep(0.02)
        time.sleep(0.2)  # a few more flushes after the last fence
        stop.set()

    for t in [in_thread(flusher, errors), in_thread(declarer, errors)]:
        t.join(60)
    assert errors == []
    for stored in Node.objects.all():
        assert stored.status == NodeStatus.DEAD and stored.fenced_at is not None
        assert (stored.last_heartbeat_at, stored.obs_mem_used_mib) == at_fence[stored.pk], stored.name
        assert stored.last_fenced_heartbeat_at is None or stored.last_fenced_heartbeat_at >= stored.fenced_at


def test_two_processes_flushing_the_same_nodes_in_opposite_orders_neither_deadlock_nor_go_back_in_time():
    fleet = [online(f"n{i:02}") for i in range(40)]
    errors: list[BaseException] = []
    last = {}

    def process(order):
        for _ in range(15):
            at = timezone.now()
            batch = {n.pk: [pending(n, raw, IDLE, at)] for n, raw in order}
            heartbeats.flush(batch)
            last[threading.get_ident()] = at

    threads = [in_thread(lambda: process(fleet), errors), in_thread(lambda: process(fleet[::-1]), errors)]
    for t in threads:
        t.join(60)
    assert errors == []  # a deadlock is an OperationalError in one of them
    assert set(Node.objects.values_list("last_heartbeat_at", flat=True)) == {max(last.values())}


def test_a_cancel_during_a_buffered_heartbeat_with_every_instance_running_is_not_overwritten(monkeypatch):
    # tests/leases/test_races.py's race, with the heartbeat coming out of the buffer: the flush sends a node
    # with instances through the per-node ingest, which locks them, so the cancel is never overwritten.
    node, raw = online("tank", mem=65536)
    spec = lease_actions.LeaseSpec(
        name="race",
        type="immediate",
        duration_s=3600,
        vnodes=[{"cpu_cores": 1, "mem_mib": 256, "disk_gib": 0}] * 20,
    )
    lease = lease_actions.do_submit_lease(None, spec, now=timezone.now()).lease
    iids = list(Instance.objects.filter(lease=lease).values_list("iid", flat=True))
    has_read, cancelled, errors = threading.Event(), threading.Event(), []
    real = ingest._reconcile_running

    def slow_reconcile(inst, status, report, now):
        if not has_read.is_set():
            has_read.set()
            cancelled.wait(HOLD_S)
        return real(inst, status, report, now)

    monkeypatch.setattr(ingest, "_reconcile_running", slow_reconcile)
    report = HealthReport(
        65536, 9000, 90.0, 50.0, 2.0, tuple({"id": iid, "status": "running"} for iid in iids)
    )
    entry = pending(node, raw, report)

    def cancel():
        assert has_read.wait(10)
        lease_actions.do_cancel_lease(None, lease.pk, now=timezone.now())
        cancelled.set()

    threads = [in_thread(lambda: heartbeats.flush({node.pk: [entry]}), errors), in_thread(cancel, errors)]
    for t in threads:
        t.join(30)
    assert errors == []
    rows = list(Instance.objects.filter(lease=lease).values_list("state", "desired_state"))
    assert {desired for _, desired in rows} == {"stopped"}
    assert not [s for s, _ in rows if s in ("running", "placed", "unhealthy", "restarting")], rows
    assert Node.objects.get(pk=node.pk).obs_mem_used_mib == 9000  # and the health was written with it


# A real Daphne on the test database.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daphne(tmp_path):
    started = []

    def start(flush_s: float):
        db = settings.DATABASES["default"]
        url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "SECRET_KEY": "test-only",
            "EMBEDDED_LOOP": "0",
            "ALLOWED_HOSTS": "127.0.0.1",
            "SLOTKEEPER_HEARTBEAT_FLUSH_S": str(flush_s),
            "LOG_LEVEL": "WARNING",
        }
        port = free_port()
        log = (tmp_path / "daphne.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "slotkeeper.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
        started.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return proc, f"http://127.0.0.1:{port}"
            except requests.RequestException:
                time.sleep(0.2)
        raise AssertionError(f"Daphne did not start: {(tmp_path / 'daphne.log').read_text()[-2000:]}")

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def beat(session, base, node, raw, used):
    body = {
        "mem_total_mib": 61440,
        "mem_used_mib": used,
        "disk_free_gib": 300.0,
        "cpu_pct": 9.0,
        "load1": 1.5,
    }
    response = session.post(
        f"{base}/api/nodes/{node.pk}/heartbeat",
        data=json.dumps(body),
        timeout=10,
        headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    return response.json()["server_time"]


def test_a_daphne_stopped_with_sigterm_writes_every_heartbeat_it_acknowledged(daphne):
    fleet = [online(f"n{i:02}") for i in range(10)]
    proc, base = daphne(flush_s=60)  # no periodic flush before the stop: only the last one can write them
    with requests.Session() as session:
        for node, raw in fleet:
            beat(session, base, node, raw, 2000)  # the token looked up by the route, the report buffered
        for node, raw in fleet:
            beat(session, base, node, raw, 3000 + node.pk)  # buffered over it
    assert set(Node.objects.values_list("obs_mem_used_mib", flat=True)) == {1000}  # nothing written yet
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert {n.pk: n.obs_mem_used_mib for n in Node.objects.all()} == {n.pk: 3000 + n.pk for n, _ in fleet}


def test_a_daphne_killed_loses_at_most_one_flush_interval(daphne):
    interval = 0.5
    # What a flush in progress may add to the interval on a loaded two-core machine.
    slack = 0.75
    fleet = [online(f"n{i:02}") for i in range(10)]
    proc, base = daphne(flush_s=interval)
    acked: dict[int, list[str]] = {n.pk: [] for n, _ in fleet}
    with requests.Session() as session:
        end = time.monotonic() + 3
        used = 3000
        while time.monotonic() < end:
            for node, raw in fleet:
                used += 1
                acked[node.pk].append(beat(session, base, node, raw, used))
    killed_at = timezone.now()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    bound = killed_at - timedelta(seconds=interval + slack)
    lost = 0
    for stored in Node.objects.all():
        times = sorted(acked[stored.pk])
        lost += sum(1 for t in times if t > stored.last_heartbeat_at.isoformat().replace("+00:00", "Z"))
        due = [t for t in times if t <= bound.isoformat().replace("+00:00", "Z")]
        assert due, "no heartbeat was acknowledged early enough to be due"
        assert stored.last_heartbeat_at.isoformat().replace("+00:00", "Z") >= due[-1], stored.name
    print(f"lost {lost} acknowledged heartbeats of {sum(map(len, acked.values()))} to SIGKILL")


def test_a_token_the_flush_confirmed_is_remembered_for_another_ttl_and_a_forgotten_one_stays_forgotten(
    monkeypatch,
):
    # A node beating every 5 s into two processes is seen by each every 10 s: with a plain 30 s TTL one heartbeat
    # in three went the slow way through Django to look its token up again.
    tank, tank_raw = online("tank")
    gone, gone_raw = online("gone")
    entries = {tank.pk: [pending(tank, tank_raw)], gone.pk: [pending(gone, gone_raw)]}
    node_tokens.forget(hash_token(gone_raw))  # rotated in this process while its heartbeat was buffered
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 25)
    heartbeats.flush(entries)
    monkeypatch.setattr(time, "monotonic", lambda: now + 50)  # past the first TTL
    assert node_tokens.get(hash_token(tank_raw)) is not None
    assert node_tokens.get(hash_token(gone_raw)) is None


def test_a_fence_or_rotation_made_in_another_process_is_refused_by_a_buffering_daphne_at_once(daphne):
    # The flush interval is 60 s here, so only the notice (fleet/token_notices.py) can tell this Daphne in time:
    # without it both heartbeats after the change were answered 200 from its remembered tokens.
    (tank, tank_raw), (morpheus, morpheus_raw) = online("tank"), online("morpheus")
    _, base = daphne(flush_s=60)
    with requests.Session() as session:
        beat(session, base, tank, tank_raw, 2000)  # remembered, and the listener started
        beat(session, base, morpheus, morpheus_raw, 2000)
        time.sleep(1.0)  # the listener's connection is up
        node_actions.do_declare_dead(None, tank.pk, reason="rack power", now=timezone.now())
        fleet_actions.do_rotate_token(None, morpheus.pk, now=timezone.now())
        time.sleep(0.2)
        body = {
            "mem_total_mib": 61440,
            "mem_used_mib": 1,
            "disk_free_gib": 300.0,
            "cpu_pct": 9.0,
            "load1": 1.5,
        }
        for node, raw, expected in ((tank, tank_raw, 409), (morpheus, morpheus_raw, 401)):
            response = session.post(
                f"{base}/api/nodes/{node.pk}/heartbeat",
                data=json.dumps(body),
                headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"},
                timeout=10,
            )
            assert response.status_code == expected, (node.name, response.text)


def test_a_node_running_what_it_should_with_nothing_new_is_written_set_based_and_a_change_goes_the_full_way():
    # tank runs three instances, confirmed running by an earlier heartbeat. Reporting them running again changes
    # no instance row, so the node goes with the idle fleet's statement (its footprint not remembered: it is
    # busy); a report missing one of them must reach the ingest, which makes that one unhealthy.
    node, raw = online("tank", mem=65536)
    spec = lease_actions.LeaseSpec(
        name="steady",
        type="immediate",
        duration_s=3600,
        vnodes=[{"cpu_cores": 1, "mem_mib": 256, "disk_gib": 0}] * 3,
    )
    lease = lease_actions.do_submit_lease(None, spec, now=timezone.now()).lease
    iids = sorted(Instance.objects.filter(lease=lease).values_list("iid", flat=True))
    running = tuple({"id": iid, "status": "running"} for iid in iids)
    heartbeats.flush({node.pk: [pending(node, raw, HealthReport(65536, 9000, 90.0, 50.0, 2.0, running))]})
    assert set(Instance.objects.filter(lease=lease).values_list("state", flat=True)) == {"running"}
    baseline = Node.objects.get(pk=node.pk).idle_baseline_mib
    rows = list(Instance.objects.filter(lease=lease).order_by("iid").values())
    done = heartbeats.flush(
        {node.pk: [pending(node, raw, HealthReport(65536, 9500, 90.0, 55.0, 2.0, running))]}
    )
    assert (done.set_based, done.per_node) == (1, 0)
    stored = Node.objects.get(pk=node.pk)
    assert (stored.obs_mem_used_mib, stored.idle_baseline_mib) == (9500, baseline)
    assert list(Instance.objects.filter(lease=lease).order_by("iid").values()) == rows
    done = heartbeats.flush(
        {node.pk: [pending(node, raw, HealthReport(65536, 9500, 90.0, 55.0, 2.0, running[1:]))]}
    )
    assert (done.set_based, done.per_node) == (0, 1)
    assert sorted(Instance.objects.filter(lease=lease).values_list("state", flat=True)) != ["running"] * 3


def test_a_heartbeats_write_stays_on_its_rows_page_and_touches_no_index():
    # fleet 0009: last_heartbeat_at is not indexed and fleet_node leaves room on its pages, so the flush's update of
    # a node row is a HOT update (no new entry in any of the table's indexes). With the column indexed, none was
    # (0 of 20,782 in bench_heartbeats.py's run; 97 % after).
    from django.db import transaction

    fleet = [online(f"h{i:02}") for i in range(20)]
    query = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'fleet_node'"
    hots = []
    for k in range(1, 6):
        at = timezone.now() + timedelta(seconds=5 * k)
        batch = {n.pk: [pending(n, raw, IDLE, at)] for n, raw in fleet}
        with transaction.atomic(), connection.cursor() as cursor:
            # The backend's counts not yet reported: before and after the flush, in its transaction.
            cursor.execute(query)
            before = cursor.fetchone()
            assert heartbeats.flush(batch).set_based == 20
            cursor.execute(query)
            after = cursor.fetchone()
        updated, hot = after[0] - before[0], after[1] - before[1]
        assert set(Node.objects.values_list("last_heartbeat_at", flat=True)) == {at}
        assert updated == 20, (k, updated)
        hots.append(hot)
        if k >= 2 and hot == 20:
            break
        time.sleep(0.2)
    # A later flush: every row's page has been pruned of the versions the one before left, so all twenty in place.
    # Pruning needs a moment no one else pins the page (autovacuum may, on a table just emptied), so a few flushes
    # are allowed to get there; with the column indexed none of them is HOT (0 of 20,782 in bench_heartbeats.py).
    assert 20 in hots[1:], hots
