"""`POST /api/leases/{id}/extend` (issue 48): an extension that fits is applied (the lease's end, duration, history,
audit and event feed say so); one that does not is a 409 with the leases in the way and the latest end that fits;
`?dry_run=true` answers the same and changes nothing; a shortening frees the room at once; bad input is a 400."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from leases.models import Lease, LeaseEvent, Reservation
from slotkeeper.models import AuditEntry, Event
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def immediate(client, name, duration_s=600, cores=4):
    response = client.post(
        "/api/leases/",
        {"name": name, "type": "immediate", "duration_s": duration_s, "nodes": [vm(cores=cores, mem=8192)]},
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def vm_end(lease_id):
    return Reservation.objects.get(lease_id=lease_id, kind="vm", status__in=("scheduled", "active")).end


def test_an_extension_that_fits_is_applied_and_told_everywhere(operator, fleet):
    lid = immediate(operator, "job")
    before = vm_end(lid)
    response = operator.post(
        f"/api/leases/{lid}/extend", {"by_s": 1200, "reason": "needs more"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is False and parse_datetime(body["end"]) == before + timedelta(seconds=1200)
    assert vm_end(lid) == before + timedelta(seconds=1200)
    assert Lease.objects.get(pk=lid).duration_s == 1800
    assert AuditEntry.objects.filter(action="lease.extend", reason="needs more").count() == 1
    assert LeaseEvent.objects.filter(lease_id=lid, message__contains="needs more").exists()
    assert Event.objects.filter(type="lease.extended", lease_id=lid).count() == 1
    assert "runs" in Lease.objects.get(pk=lid).message


def test_an_extension_into_an_advance_reservation_is_a_409_with_the_latest_end(operator, fleet):
    ids = [immediate(operator, f"im-{i}") for i in range(4)]  # every node, ten minutes
    ends = {lid: vm_end(lid) for lid in ids}
    start = max(ends.values()) + timedelta(minutes=10)
    wall = operator.post(
        "/api/leases/",
        {
            "name": "wall", "type": "advance_reservation", "start": start.isoformat(), "duration_s": 3600,
            "nodes": [vm(cores=4, mem=8192)] * 4,
        },
        format="json",
    )  # fmt: skip
    assert wall.status_code == 201, wall.content
    target = ids[0]
    asked = start + timedelta(minutes=30)
    dry = operator.post(
        f"/api/leases/{target}/extend?dry_run=true", {"end": asked.isoformat()}, format="json"
    )
    assert dry.status_code == 409
    body = dry.json()
    assert body["code"] == "blocked" and body["dry_run"] is True
    assert [b["id"] for b in body["blocking"]] == [wall.json()["id"]]
    latest = parse_datetime(body["latest_end"])
    assert ends[target] < latest <= start
    assert body["verdicts"] and body["verdicts"][0]["fits"] is False
    real = operator.post(f"/api/leases/{target}/extend", {"end": asked.isoformat()}, format="json")
    assert real.status_code == 409 and vm_end(target) == ends[target]
    # The latest end it named is granted.
    granted = operator.post(f"/api/leases/{target}/extend", {"end": body["latest_end"]}, format="json")
    assert granted.status_code == 200, granted.content
    assert vm_end(target) == latest


def test_a_dry_run_changes_nothing(operator, fleet):
    lid = immediate(operator, "job")
    before = vm_end(lid)
    response = operator.post(f"/api/leases/{lid}/extend?dry_run=true", {"by_s": 600}, format="json")
    assert response.status_code == 200 and response.json()["dry_run"] is True
    assert vm_end(lid) == before and Lease.objects.get(pk=lid).duration_s == 600
    assert not AuditEntry.objects.filter(action="lease.extend").exists()
    assert not Event.objects.filter(type="lease.extended").exists()


def test_a_shortening_frees_the_room_for_the_queue_at_once(operator, fleet):
    ids = [immediate(operator, f"im-{i}", duration_s=3600) for i in range(4)]
    waiting = operator.post(
        "/api/leases/",
        {"name": "waits", "type": "best_effort", "duration_s": 600, "nodes": [vm(cores=4, mem=8192)]},
        format="json",
    ).json()["id"]
    planned = Reservation.objects.get(lease_id=waiting, kind="vm", status="scheduled").start
    response = operator.post(f"/api/leases/{ids[0]}/extend", {"by_s": -3000}, format="json")
    assert response.status_code == 200, response.content
    assert Event.objects.filter(type="lease.shortened", lease_id=ids[0]).exists()
    assert Reservation.objects.get(lease_id=waiting, kind="vm", status="scheduled").start < planned


@pytest.mark.parametrize(
    "body",
    [{}, {"by_s": 10, "end": "2030-01-01T00:00:00Z"}, {"by_s": "x"}, {"by_s": True}, {"end": "soon"}],
)
def test_bad_input_is_a_400_and_changes_nothing(operator, fleet, body):
    lid = immediate(operator, "job")
    response = operator.post(f"/api/leases/{lid}/extend", body, format="json")
    assert response.status_code == 400, response.content
    assert Lease.objects.get(pk=lid).duration_s == 600


def test_an_end_before_now_is_a_409_and_an_unknown_lease_a_404(operator, fleet):
    lid = immediate(operator, "job")
    past = timezone.now() - timedelta(minutes=5)
    response = operator.post(f"/api/leases/{lid}/extend", {"end": past.isoformat()}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "too_early"
    assert operator.post("/api/leases/999999/extend", {"by_s": 60}, format="json").status_code == 404


def test_a_cancelled_lease_cannot_be_extended_and_a_viewer_cannot_extend(operator, viewer, fleet):
    lid = immediate(operator, "job")
    assert viewer.post(f"/api/leases/{lid}/extend", {"by_s": 60}, format="json").status_code == 403
    operator.post(f"/api/leases/{lid}/cancel", {}, format="json")
    response = operator.post(f"/api/leases/{lid}/extend", {"by_s": 60}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "not_changeable"
    assert "cancelled" in response.json()["detail"]
