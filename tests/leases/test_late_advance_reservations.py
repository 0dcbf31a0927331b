"""An advance reservation whose start falls between its arrival and the planning pass that decides it (group
commit plans every waiting request at the pass's one `now`) is not "in the past": it was valid when it arrived.
It gets the rest of its window, [now, requested end), or a clear no (docs/scheduler.md, "Late advance
reservations")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from leases import actions
from leases.lifecycle import LeaseState
from leases.models import Lease, Reservation
from leases.planning import passes, waiting
from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.slottable import Res
from tests.leases.conftest import vm

F = Res(cpu=100, mem=1024)


def ar(start: float, *, submit: float = 100.0, duration: float = 600.0) -> LeaseRequest:
    return LeaseRequest(1, "advance_reservation", submit, start, duration, (F,), preemptible=False)


def one_node() -> Scheduler:
    return Scheduler({1: Res(100, 1024, 0, 100, 100)}, SchedulerConfig())


# -- the scheduler (pure) ------------------------------------------------------------------------------------


def test_an_ar_whose_start_passed_while_it_waited_runs_from_now_to_its_requested_end():
    # Arrived at 100 for 105; the pass runs at 107.
    s = one_node()
    decision = s.submit(ar(105), 107)
    assert decision.accepted, decision.message
    [vm_res] = [r for r in s.leases[1].reservations if r.kind == "vm"]
    assert (vm_res.start, vm_res.end) == (107, 705)
    assert s.leases[1].state == LeaseState.ACTIVE


def test_an_ar_whose_start_was_already_past_when_it_arrived_is_still_refused():
    decision = one_node().submit(ar(99), 107)
    assert not decision.accepted
    assert "in the past" in decision.message


def test_an_ar_whose_whole_window_passed_before_a_pass_took_it_is_a_clear_no():
    decision = one_node().submit(ar(105, duration=1), 107)
    assert not decision.accepted
    assert "window" in decision.message and "passed" in decision.message


def test_a_late_ar_still_gets_its_window_exactly_or_not_at_all():
    # The node is taken from 300: an AR arrived for [105, 705) and planned at 107 would collide, so it is
    # rejected, not moved or shortened to fit.
    s = one_node()
    taken = LeaseRequest(2, "advance_reservation", 100, 300, 60, (F,), preemptible=False)
    assert s.submit(taken, 100).accepted
    decision = s.submit(ar(105), 107)
    assert not decision.accepted
    assert "rejected: no room" in decision.message


# -- the live service: the pass runs after the start ---------------------------------------------------------


@pytest.mark.django_db
def test_a_pass_that_runs_after_the_requested_start_places_the_ar_from_its_now(fleet):
    arrived = timezone.now()
    start = arrived + timedelta(seconds=1)
    lease = Lease.objects.create(
        name="late-ar",
        type="advance_reservation",
        submitted_at=arrived,
        requested_start=start,
        duration_s=600,
        vnodes=[vm()],
    )
    planned_at = arrived + timedelta(seconds=3)
    with passes.planning(planned_at):
        pass
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE, lease.message
    vm_res = Reservation.objects.get(lease=lease, kind="vm")
    assert vm_res.start == planned_at
    assert vm_res.end == start + timedelta(seconds=600)


@pytest.mark.django_db
def test_the_api_places_an_ar_whose_start_passed_before_its_pass(operator, fleet, monkeypatch):
    # The request is valid when it arrives (its start a second ahead); its pass runs two seconds later, as when
    # it waits behind a burst.
    real = waiting.await_decision
    monkeypatch.setattr(
        actions,
        "await_decision",
        lambda lease_id, now, since=None: real(lease_id, now + timedelta(seconds=2), since=since),
    )
    start = timezone.now() + timedelta(seconds=1)
    payload = {
        "name": "late",
        "type": "advance_reservation",
        "start": start.isoformat(),
        "duration_s": 600,
        "nodes": [vm()],
    }
    response = operator.post("/api/leases/", payload, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["state"] == "active"
