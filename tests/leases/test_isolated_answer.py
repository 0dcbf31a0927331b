"""A submission is answered with the lease's real decision: a lease the scheduler isolated (failed) while it was
being decided is never answered 201. Placed or queued is 201, rejected 409 with the report, failed 500 with the
reason (docs/plan-applier.md, "Group commit")."""

from __future__ import annotations

import pytest
from django.utils import timezone

from leases import actions
from leases.lifecycle import LeaseState
from leases.models import Alert, Lease
from leases.scheduler import Scheduler
from slotkeeper.models import AuditEntry
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def submit(client, **body):
    payload = {"name": "job", "type": "immediate", "duration_s": 3600, "nodes": [vm()], **body}
    return client.post("/api/leases/", payload, format="json")


def spec(name="job"):
    return actions.LeaseSpec(name=name, type="immediate", duration_s=3600, vnodes=[vm()])


@pytest.fixture
def fails_when_it_starts(monkeypatch):
    """Any exception while the lease's start is handled, in the pass that decides it (its reservation starts now,
    so its start runs in the same pass): the scheduler isolates that lease."""
    real = Scheduler._on_start

    def on_start(self, rec, r, t):
        if rec.request.type == "immediate":
            raise RuntimeError("the start handler met a reservation it cannot read")
        return real(self, rec, r, t)

    monkeypatch.setattr(Scheduler, "_on_start", on_start)


@pytest.fixture
def isolated_by_the_tick(monkeypatch):
    """The tick's pass picks the request up (its report says placed) and then, while it runs the tick's part,
    isolates the lease: the waiter reads a failed lease whose only report says "placed"."""
    monkeypatch.setattr(
        actions,
        "await_decision",
        lambda lease_id, now, since=None: (actions.advance(now), Lease.objects.get(pk=lease_id))[1],
    )
    real = Scheduler.advance

    def advance(self, now, excluded=None, *, run_queue=True):
        for rec in list(self.leases.values()):
            if rec.request.type == "immediate" and rec.state == LeaseState.ACTIVE:
                self._contain(rec, now, RuntimeError("its reservation names a vnode the lease does not have"))
        return real(self, now, excluded, run_queue=run_queue)

    monkeypatch.setattr(Scheduler, "advance", advance)


@pytest.mark.usefixtures("fails_when_it_starts")
def test_a_lease_isolated_in_the_pass_that_decides_it_is_not_accepted(fleet):
    done = actions.do_submit_lease(None, spec(), now=timezone.now())
    assert done.lease.state == LeaseState.FAILED
    assert not done.decision.accepted
    assert done.decision.state == LeaseState.FAILED
    assert "cannot read" in done.decision.message
    # The pass's audit row and the lease's message say what happened, not "accepted" or "lease 1 is failed".
    row = AuditEntry.objects.get(action="lease.submit", target_id=str(done.lease.pk))
    assert row.details["accepted"] is False
    assert "cannot read" in Lease.objects.get(pk=done.lease.pk).message
    assert Alert.objects.filter(kind="lease_isolated", lease=done.lease).exists()


@pytest.mark.usefixtures("isolated_by_the_tick")
def test_a_lease_isolated_after_its_report_said_placed_is_not_accepted(fleet):
    done = actions.do_submit_lease(None, spec(), now=timezone.now())
    assert done.report.outcome == "placed"  # what the pass first decided
    assert done.lease.state == LeaseState.FAILED
    assert not done.decision.accepted
    assert "vnode the lease does not have" in done.decision.message


@pytest.mark.usefixtures("isolated_by_the_tick")
def test_the_api_answers_a_lease_isolated_after_its_report_with_500_not_201(operator, fleet):
    response = submit(operator)
    assert response.status_code == 500, response.content
    body = response.json()
    assert body["state"] == "failed"
    assert "vnode the lease does not have" in body["detail"]
    assert Lease.objects.get(pk=body["lease"]).state == "failed"


@pytest.mark.usefixtures("fails_when_it_starts")
def test_the_api_answers_a_lease_isolated_in_its_pass_with_500_and_the_reason(operator, fleet):
    response = submit(operator)
    assert response.status_code == 500, response.content
    body = response.json()
    assert body["state"] == "failed"
    assert "cannot read" in body["detail"]
    assert {v["node"] for v in body["verdicts"]} == {"n1", "n2", "n3", "n4"}


def test_placed_stays_201_and_rejected_stays_409(operator, fleet):
    assert submit(operator, nodes=[vm(mem=8192)] * 4).status_code == 201
    response = submit(operator)
    assert response.status_code == 409
    assert response.json()["state"] == "rejected"
