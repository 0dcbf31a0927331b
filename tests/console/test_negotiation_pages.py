"""The console's negotiation forms without a browser (issue 48): only an operator may take an offer or change an
end; bad input is answered beside the form and changes nothing; a rejected reservation's page lists its offers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from leases import actions
from leases.models import Lease, Reservation
from tests.console.conftest import vm

pytestmark = pytest.mark.django_db


def running(name="job"):
    spec = actions.LeaseSpec(name=name, type="immediate", duration_s=600, vnodes=[vm()])
    return actions.do_submit_lease(None, spec, now=timezone.now()).lease


def test_a_viewer_cannot_take_an_offer_or_change_an_end(vera, fleet):
    lease = running()
    assert vera.post(f"/leases/{lease.pk}/end", {"by_min": "10", "do": "apply"}).status_code == 403
    assert vera.post(f"/leases/{lease.pk}/resubmit", {"start": "2030-01-01T00:00:00Z"}).status_code == 403
    assert Lease.objects.count() == 1


@pytest.mark.parametrize("by", ["", "0", "x", "nan", "999999999", "1e400"])
def test_a_bad_change_is_answered_beside_the_form_and_changes_nothing(otto, fleet, by):
    lease = running()
    end = Reservation.objects.get(lease=lease, kind="vm").end
    response = otto.post(f"/leases/{lease.pk}/end", {"by_min": by, "do": "apply"})
    assert response.status_code == 400
    assert b'id="by_min-error"' in response.content
    assert Reservation.objects.get(lease=lease, kind="vm").end == end


def test_a_preview_changes_nothing_and_apply_does(otto, fleet):
    lease = running()
    end = Reservation.objects.get(lease=lease, kind="vm").end
    preview = otto.post(f"/leases/{lease.pk}/end", {"by_min": "15"})
    assert preview.status_code == 200 and b"Would apply" in preview.content
    assert Reservation.objects.get(lease=lease, kind="vm").end == end
    applied = otto.post(f"/leases/{lease.pk}/end", {"by_min": "15", "do": "apply"})
    assert applied.status_code == 302
    assert Reservation.objects.get(lease=lease, kind="vm").end == end + timedelta(minutes=15)


def test_a_rejected_reservation_lists_its_offers_and_a_bad_offer_is_refused(otto, fleet):
    start = timezone.now() + timedelta(hours=3)
    wall = actions.LeaseSpec(
        name="wall", type="advance_reservation", duration_s=3600, vnodes=[vm(cores=4)] * 3, start=start
    )
    assert actions.do_submit_lease(None, wall, now=timezone.now()).decision.accepted
    late = actions.LeaseSpec(
        name="late", type="advance_reservation", duration_s=600, vnodes=[vm(cores=4)], start=start
    )
    rejected = actions.do_submit_lease(None, late, now=timezone.now()).lease
    page = otto.get(f"/leases/{rejected.pk}/")
    assert page.status_code == 200
    assert page.content.count(b"data-offer=") == 3 and b"wall" in page.content
    count = Lease.objects.count()
    for start in (
        "not a time",
        "2030-02-30T00:00:00Z",
        "2030-01-01T00:00:00",
        "9999-12-31T23:00:00Z",
        "2001-01-01T00:00:00Z",
    ):
        # Not a time, no zone, beyond how far ahead one books, in the past: refused, and no lease is stored.
        bad = otto.post(f"/leases/{rejected.pk}/resubmit", {"start": start})
        assert bad.status_code == 302 and Lease.objects.count() == count, start


# -- rough edges of the console (issue 46, item 5) ------------------------------------------------------------------


def test_a_leases_request_names_each_vm_shape_once(vera, fleet):
    spec = actions.LeaseSpec(
        name="wide", type="best_effort", duration_s=600, vnodes=[vm()] * 20 + [vm(cores=2)]
    )
    lease = actions.do_submit_lease(None, spec, now=timezone.now()).lease
    body = vera.get(f"/leases/{lease.pk}/").content.decode()
    request = body[body.index("data-request>") :].split("</dd>")[0]
    assert "20 × (1 core, 1 GiB) + 1 × (2 cores, 1 GiB)" in request
    assert request.count("1 core") == 1


def test_a_queued_leases_report_is_not_shown_as_a_failure(vera, fleet):
    for i in range(3):  # every node's cores, for an hour
        spec = actions.LeaseSpec(name=f"full-{i}", type="immediate", duration_s=3600, vnodes=[vm(cores=4)])
        assert actions.do_submit_lease(None, spec, now=timezone.now()).decision.accepted
    spec = actions.LeaseSpec(name="waits", type="best_effort", duration_s=600, vnodes=[vm(cores=4)] * 3)
    spec2 = actions.LeaseSpec(name="waits-too", type="best_effort", duration_s=600, vnodes=[vm(cores=4)] * 3)
    actions.do_submit_lease(None, spec, now=timezone.now())
    queued = actions.do_submit_lease(None, spec2, now=timezone.now()).lease
    assert queued.state == "queued"
    body = vera.get(f"/leases/{queued.pk}/").content.decode()
    badge = body[body.index('data-code="queued"') - 40 :][:120]
    assert "amber" in badge and "red" not in badge


def test_the_audit_export_writes_details_as_json(vera, fleet):
    import csv
    import io
    import json

    from slotkeeper import audit

    audit.record(
        at=timezone.now(), actor=None, action="test.details", target=None, details={"ok": True, "none": None}
    )
    response = vera.get("/audit.csv", {"action": "test.details"})
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert json.loads(rows[1][7]) == {"none": None, "ok": True}


def test_a_live_refresh_of_a_rejected_reservation_does_not_search_for_offers_again(otto, fleet, monkeypatch):
    from leases import negotiating

    start = timezone.now() + timedelta(hours=3)
    wall = actions.LeaseSpec(
        name="wall", type="advance_reservation", duration_s=3600, vnodes=[vm(cores=4)] * 3, start=start
    )
    actions.do_submit_lease(None, wall, now=timezone.now())
    late = actions.LeaseSpec(
        name="late", type="advance_reservation", duration_s=600, vnodes=[vm(cores=4)], start=start
    )
    rejected = actions.do_submit_lease(None, late, now=timezone.now()).lease
    asked = []
    real = negotiating.counter_offers
    monkeypatch.setattr(negotiating, "counter_offers", lambda *a, **k: asked.append(1) or real(*a, **k))
    otto.get(f"/leases/{rejected.pk}/", headers={"HX-Request": "true"})
    assert asked == []  # the body it re-renders shows no offers
    otto.get(f"/leases/{rejected.pk}/")
    assert asked == [1]
