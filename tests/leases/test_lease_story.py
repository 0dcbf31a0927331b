"""A lease tells one consistent story (issue 45): its headline matches its state at every point, every step that
changes where or when it runs says why, a re-plan is one history step ("moved from ... to ...: ..."), and the
reservations a re-plan superseded are not listed. Through the API, on one node (the others drained)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from leases import actions
from leases.models import LeaseEvent, Reservation
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db

WHOLE = vm(cores=4, mem=8192)


def submit(name, type_, duration_s, *, start=None):
    spec = actions.LeaseSpec(
        name=name,
        type=type_,
        duration_s=duration_s,
        vnodes=[WHOLE],
        start=start,
        preemptible=type_ == "best_effort",
    )
    return actions.do_submit_lease(None, spec, now=timezone.now()).lease


def headline_matches_state(body: dict) -> None:
    state, message = body["state"], body["message"]
    if state in ("queued", "suspended_queued"):
        assert "queued" in message and " runs " not in message, (state, message)
    if state in ("ready", "scheduled", "active", "suspended_scheduled"):
        assert " runs " in message, (state, message)


def test_a_best_effort_lease_replanned_twice_then_preempted_says_why_at_every_step(viewer, fleet):
    for node in fleet[1:]:
        fleet_actions.do_drain(None, node.pk, reason="one node for this story", now=timezone.now())
    now = timezone.now()
    b1 = submit("blocker-1", "immediate", 600)
    b2 = submit("blocker-2", "advance_reservation", 600, start=now + timedelta(seconds=700))
    lease = submit("story", "best_effort", 300)
    read = lambda: viewer.get(f"/api/leases/{lease.pk}/").json()  # noqa: E731
    body = read()
    assert body["state"] == "ready"  # backfilling's future reservation, after blocker-2
    headline_matches_state(body)
    actions.do_cancel_lease(None, b2.pk, now=timezone.now(), reason="not needed")
    body = read()
    headline_matches_state(body)
    actions.do_cancel_lease(None, b1.pk, now=timezone.now(), reason="done early")
    body = read()
    assert body["state"] == "active"
    headline_matches_state(body)
    # An advance reservation needs the node from in 10 minutes: the lease is preempted.
    submit("needs-the-node", "advance_reservation", 600, start=timezone.now() + timedelta(seconds=30))
    body = read()
    headline_matches_state(body)

    moves = [h for h in body["history"] if h["message"].startswith("moved from")]
    assert len(moves) == 2, body["history"]
    assert f"lease {b2.pk} was cancelled" in moves[0]["message"]
    assert f"lease {b1.pk} was cancelled" in moves[1]["message"]
    # The request's way in ends in its decision's step, which says where it went; every step after it says why.
    history = body["history"]
    decided = next(i for i, step in enumerate(history) if step["message"])
    assert " runs " in history[decided]["message"]
    assert all(step["message"] for step in history[decided:]), history
    assert "preempted by lease" in history[-1]["message"], history
    assert "preempted by lease" in body["message"], body["message"]
    # No re-plan left a superseded reservation behind, in the API or in the database's live rows.
    assert all(r["status"] != "cancelled" for r in body["reservations"])
    assert (
        not Reservation.objects.filter(lease=lease, status="scheduled", kind="vm")
        .exclude(rid__in=[r["rid"] for r in body["reservations"]])
        .exists()
    )


def test_a_future_lease_whose_plan_does_not_change_writes_no_history(fleet):
    now = timezone.now()
    for node in fleet[1:]:
        fleet_actions.do_drain(None, node.pk, reason="one node", now=now)
    submit("blocker", "immediate", 600)
    lease = submit("waits", "best_effort", 300)
    steps = LeaseEvent.objects.filter(lease=lease).count()
    reservations = Reservation.objects.filter(lease=lease).count()
    # Other leases come and go; its own plan stays as it was: no rows for it at all.
    for i in range(5):
        other = submit(f"other-{i}", "best_effort", 60)
        actions.do_cancel_lease(None, other.pk, now=timezone.now())
    assert LeaseEvent.objects.filter(lease=lease).count() == steps
    assert Reservation.objects.filter(lease=lease).count() == reservations
