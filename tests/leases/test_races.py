"""Two writers racing on the same rows, on PostgreSQL: the race is injected at the moment that used to lose a write
(one writer has read, the other commits before it writes), and the invariant is checked after both are done."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.models import Node
from leases import actions, instance_rows
from leases.instances import placing
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reports as ingest
from leases.instances.actions import reschedules
from leases.instances.models import Reschedule
from leases.models import Instance
from leases.planning import restore
from slotkeeper import planlock
from tests.conftest import requires_postgres

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]

# How long the first writer holds its rows open for the second one. Long enough for the second to commit when
# nothing stops it; with the fix the second waits on a lock for this long instead.
HOLD_S = 1.5


def make_node(name, mem=65536, cores=64):
    now = timezone.now()
    node, _ = fleet_actions.do_register_node(
        None, name=name, cpu_cores=cores, mem_total_mib=mem, disk_total_gib=100, capabilities=[], now=now
    )
    return node_actions.do_heartbeat(node, fleet_actions.HealthReport(mem, 1000, 90.0, 1.0, 0.1), now=now)


def immediate(vms, mem=256, **policy):
    spec = actions.LeaseSpec(
        name="race",
        type="immediate",
        duration_s=3600,
        vnodes=[{"cpu_cores": 1, "mem_mib": mem, "disk_gib": 0}] * vms,
        policy=policy,
    )
    return actions.do_submit_lease(None, spec, now=timezone.now()).lease


def in_thread(target, errors):
    def run():
        try:
            target()
        except BaseException as exc:  # surfaced by the test: a thread's failure must fail it
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_cancel_during_a_heartbeat_that_reports_every_instance_running_is_not_overwritten(monkeypatch):
    # 20 VMs of one immediate lease on one node; the heartbeat has read them (all "placed", desired running) when
    # the cancel arrives. Before, the cancel committed in between and the heartbeat then wrote every instance
    # back to running: desired_state=stopped with state=running forever, counted as claims by the placer.
    node = make_node("tank")
    lease = immediate(20)
    iids = list(Instance.objects.filter(lease=lease).values_list("iid", flat=True))
    assert len(iids) == 20
    heartbeat_has_read, cancel_done = threading.Event(), threading.Event()
    real = ingest._reconcile_running

    def slow_reconcile(inst, status, report, now):
        if not heartbeat_has_read.is_set():
            heartbeat_has_read.set()
            cancel_done.wait(HOLD_S)
        return real(inst, status, report, now)

    monkeypatch.setattr(ingest, "_reconcile_running", slow_reconcile)
    errors: list[BaseException] = []
    reports = tuple({"id": iid, "status": "running"} for iid in iids)

    def heartbeat():
        row = Node.objects.get(pk=node.pk)
        report = fleet_actions.HealthReport(65536, 9000, 90.0, 50.0, 2.0, reports)
        node_actions.do_heartbeat(row, report, now=timezone.now())

    def cancel():
        assert heartbeat_has_read.wait(10)
        actions.do_cancel_lease(None, lease.pk, now=timezone.now())
        cancel_done.set()

    threads = [in_thread(heartbeat, errors), in_thread(cancel, errors)]
    for t in threads:
        t.join(30)
    assert errors == []
    rows = list(Instance.objects.filter(lease=lease).values_list("state", "desired_state"))
    assert {desired for _, desired in rows} == {"stopped"}
    assert not [s for s, _ in rows if s in ("running", "placed", "unhealthy", "restarting")], rows
    # And the placer no longer counts them once the agent confirms they are gone.
    restore.drop_cache()
    node_actions.do_heartbeat(
        Node.objects.get(pk=node.pk),
        fleet_actions.HealthReport(65536, 1000, 90.0, 1.0, 0.1, ()),
        now=timezone.now() + timedelta(seconds=5),
    )
    assert set(Instance.objects.filter(lease=lease).values_list("state", flat=True)) <= {
        "unloaded",
        "revoked",
    }


def test_an_approval_racing_a_declare_dead_never_leaves_a_live_instance_on_the_dead_node(monkeypatch):
    # The approval has read the fleet (the target online) when an admin declares the target dead. Before, the
    # declare-dead did not take the plan lock, committed in between (finding nothing on the node to lose), and
    # the approval then put its instance on the dead node, 157 ms later.
    make_node("source", mem=8192, cores=8)
    target = make_node("target", mem=8192, cores=8)
    lease = immediate(1, mem=1024)
    inst = Instance.objects.get(lease=lease)
    source_id = inst.node_id
    other = target if source_id != target.pk else Node.objects.get(name="source")
    node_actions.do_declare_dead(None, source_id, reason="rack power", now=timezone.now())
    proposal = Reschedule.objects.get(instance=inst)
    assert proposal.proposed_node_id == other.pk
    fleet_read, declared = threading.Event(), threading.Event()
    real_read = placing.FleetView.read

    def slow_read(now, *nodes):
        view = real_read(now, *nodes)
        fleet_read.set()
        declared.wait(HOLD_S)
        return view

    monkeypatch.setattr(placing.FleetView, "read", staticmethod(slow_read))
    errors: list[BaseException] = []

    def approve():
        reschedules.do_approve(None, [proposal.pk], now=timezone.now())

    def declare_dead():
        assert fleet_read.wait(10)
        node_actions.do_declare_dead(None, other.pk, reason="it smokes too", now=timezone.now())
        declared.set()

    threads = [in_thread(approve, errors), in_thread(declare_dead, errors)]
    for t in threads:
        t.join(30)
    assert errors == []
    assert Node.objects.get(pk=other.pk).status == "dead"
    live_on_dead = Instance.objects.filter(node__status="dead", state__in=instance_rows.LIVE)
    assert not live_on_dead.exists(), list(live_on_dead.values_list("iid", "state"))


def test_a_request_that_cannot_have_the_plan_lock_in_time_is_answered_503_with_retry_after(
    settings, operator
):
    make_node("tank")
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "PLAN_LOCK_TIMEOUT_S": 0.5}
    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold_the_lock():
        from django.db import transaction

        with transaction.atomic():
            planlock.take()
            holding.set()
            release.wait(10)

    thread = in_thread(hold_the_lock, errors)
    assert holding.wait(10)
    try:
        body = {
            "name": "job",
            "type": "best_effort",
            "duration_s": 60,
            "nodes": [{"cpu_cores": 1, "mem_mib": 64}],
        }
        response = operator.post("/api/leases/", body, format="json")
    finally:
        release.set()
        thread.join(10)
    assert errors == []
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert "busy" in response.json()["detail"]
    # It changed nothing, and once the lock is free the same request is decided.
    from leases.models import Lease

    assert not Lease.objects.exists()
    assert operator.post("/api/leases/", body, format="json").status_code == 201
