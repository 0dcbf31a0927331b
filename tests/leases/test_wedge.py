"""The live scheduler never wedges: a lease the plan applier cannot make sense of is isolated, everyone else
keeps being scheduled, and the database's view of a suspended lease is enough to resume it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet import actions as fleet_actions
from fleet.models import Node
from leases import actions
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic
from leases.models import Alert, Reservation
from leases.planning import restore
from leases.scheduler import Scheduler
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def one_node(now, name="solo", cores=4):
    node, _ = fleet_actions.do_register_node(
        None, name=name, cpu_cores=cores, mem_total_mib=8192, disk_total_gib=100, capabilities=[], now=now
    )
    report = fleet_actions.HealthReport(
        mem_total_mib=8192, mem_used_mib=1000, disk_free_gib=90.0, cpu_pct=1.0, load1=0.1
    )
    return node_actions.do_heartbeat(node, report, now=now)


def beat(node, now):
    report = fleet_actions.HealthReport(
        mem_total_mib=8192, mem_used_mib=1000, disk_free_gib=90.0, cpu_pct=1.0, load1=0.1
    )
    return node_actions.do_heartbeat(node, report, now=now)


def spec(name, type_, cores, *, duration=3600, start=None):
    return actions.LeaseSpec(
        name=name,
        type=type_,
        duration_s=duration,
        vnodes=[{"cpu_cores": cores, "mem_mib": 256, "disk_gib": 0}],
        start=start,
    )


def test_a_best_effort_lease_suspended_for_a_reservation_resumes_after_a_reload(settings):
    # The outside tester's case: one 4-core node, a best-effort lease on all of it, an advance reservation of the
    # same size a minute ahead, then ticks in separate "processes" (the cache dropped each time, as when another
    # worker committed). The suspension's end used to look for the lease's last VM reservation among the live
    # rows only, raise StopIteration, and fail every later tick and submission.
    node = one_node(T0)
    be = actions.do_submit_lease(None, spec("be", "best_effort", 4), now=T0).lease
    assert be.state == "active"
    ar = actions.do_submit_lease(
        None, spec("ar", "advance_reservation", 4, duration=600, start=T0 + timedelta(seconds=60)), now=T0
    ).lease
    assert ar.state == "ready"
    for seconds in (48, 55, 64, 90, 700, 800):
        at = T0 + timedelta(seconds=seconds)
        beat(node, at)
        restore.drop_cache()
        periodic.tick(at)
    be.refresh_from_db()
    ar.refresh_from_db()
    assert ar.state == "done"
    # Suspended for the reservation, then resumed onto the node once it was free again.
    states = list(be.events.order_by("pk").values_list("to_state", flat=True))
    # (The steps of one pass are one history row: suspended and re-planned in one tick reads as one step.)
    assert "suspending" in states and any(s.startswith("suspended_") for s in states), states
    assert be.state in ("resuming", "resumed_ready", "active"), states
    # And the scheduler still takes new work.
    later = actions.do_submit_lease(None, spec("later", "best_effort", 1), now=T0 + timedelta(seconds=801))
    assert later.lease.state in ("queued", "ready", "active")


def test_a_lease_the_scheduler_cannot_load_is_isolated_and_the_rest_goes_on():
    # A node row deleted behind the scheduler's back (as DELETE /api/nodes/{id}/ used to allow) takes its
    # allocations with it, but the reservations still name it: every tick, submission and cancel then raised
    # KeyError('node N is not in the slot table'). Now that one lease fails with an alert and the rest goes on.
    node = one_node(T0)
    doomed = one_node(T0, name="doomed", cores=8)
    broken = actions.do_submit_lease(None, spec("broken", "best_effort", 8), now=T0).lease
    assert broken.state == "active"
    assert Reservation.objects.get(lease=broken).nodes == {"1": doomed.pk}
    Node.objects.filter(pk=doomed.pk).delete()
    restore.drop_cache()
    beat(node, T0 + timedelta(seconds=5))
    periodic.tick(T0 + timedelta(seconds=5))
    broken.refresh_from_db()
    assert broken.state == "failed"
    assert "isolated" in broken.message and "does not hold" in broken.message
    assert Alert.objects.filter(kind="lease_isolated", lease=broken).exists()
    assert not Reservation.objects.filter(lease=broken, status__in=["scheduled", "active"]).exists()
    fine = actions.do_submit_lease(None, spec("fine", "best_effort", 4), now=T0 + timedelta(seconds=6))
    assert fine.lease.state == "active"
    cancelled = actions.do_cancel_lease(None, fine.lease.pk, now=T0 + timedelta(seconds=7))
    assert cancelled.state == "cancelled"


def test_a_lease_that_fails_while_planned_is_isolated_and_the_queue_goes_on(monkeypatch):
    # Any other inconsistency the scheduler meets while it runs events or the queue: that lease only.
    one_node(T0)
    first = actions.do_submit_lease(None, spec("first", "best_effort", 4), now=T0).lease
    second = actions.do_submit_lease(None, spec("second", "best_effort", 4), now=T0).lease
    third = actions.do_submit_lease(None, spec("third", "best_effort", 1), now=T0).lease
    # Aggressive backfilling: the head of the queue holds a future reservation, the rest wait.
    assert (first.state, second.state, third.state) == ("active", "ready", "queued")
    real = Scheduler._plan_asap

    def broken_for_second(self, rec, now, allow_future, **kwargs):
        if rec.request.id == second.pk:
            raise StopIteration
        return real(self, rec, now, allow_future, **kwargs)

    monkeypatch.setattr(Scheduler, "_plan_asap", broken_for_second)
    actions.do_cancel_lease(None, first.pk, now=T0 + timedelta(seconds=10))
    second.refresh_from_db()
    third.refresh_from_db()
    assert second.state == "failed"
    assert third.state == "active"


def test_a_failing_tick_raises_one_alert_shows_on_readyz_and_metrics_and_clears_when_it_passes(
    monkeypatch, client
):
    from leases.instances.actions import restarts

    one_node(T0)

    def broken(now):
        raise RuntimeError("disk full")

    monkeypatch.setattr(restarts, "supervise", broken)
    for seconds in (5, 10):
        with pytest.raises(RuntimeError):
            periodic.tick(T0 + timedelta(seconds=seconds))
    alerts = Alert.objects.filter(kind="tick_failed")
    assert alerts.count() == 1 and "disk full" in alerts.get().message
    ready = client.get("/readyz").json()
    assert ready["checks"]["scheduler"].startswith("tick failing: 2 in a row")
    assert ready["ready"] is True  # the web process itself is fine; the alert says what is not
    metrics = client.get("/metrics").content.decode()
    assert "slotkeeper_tick_failures_in_a_row 2.0" in metrics
    monkeypatch.undo()
    periodic.tick(T0 + timedelta(seconds=15))
    assert alerts.get().resolved_at is not None
    assert client.get("/readyz").json()["checks"]["scheduler"] == "ok"


def test_a_disrupted_fleet_raises_one_alert_that_resolves_when_heartbeats_return():
    # Five nodes, then silence from all of them while the sweep runs on: the sweep marks them offline but declares
    # none dead, and the tick says why in one alert.
    nodes = [one_node(T0, name=f"n{i}") for i in range(5)]
    for seconds in range(0, 125, 5):
        periodic.sweep(T0 + timedelta(seconds=seconds))
    periodic.tick(T0 + timedelta(seconds=125))
    periodic.tick(T0 + timedelta(seconds=130))
    alert = Alert.objects.get(kind="fleet_disrupted")
    assert "5 of 5 nodes" in alert.message and alert.resolved_at is None
    assert not Node.objects.filter(status="dead").exists()
    for node in nodes:
        beat(Node.objects.get(pk=node.pk), T0 + timedelta(seconds=131))
    periodic.sweep(T0 + timedelta(seconds=135))
    periodic.tick(T0 + timedelta(seconds=135))
    alert.refresh_from_db()
    assert alert.resolved_at is not None
