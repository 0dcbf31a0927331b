"""The Django admin shows placement reports, whose verdicts are a JSON document kept as text (JSONTextField)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from fleet.models import PlacementReport
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def test_an_admin_lists_searches_and_reads_a_report_and_cannot_change_it():
    root = get_user_model().objects.create_superuser(username="root", password="x")
    client = Client()
    client.force_login(root)
    report = PlacementReport.objects.create(
        created_at=T0,
        subject="lease:42",
        request={"type": "immediate"},
        outcome="rejected",
        message="no node holds it",
        verdicts={
            "v": 3,
            "summary": "needs 2 × (4 cores); the fleet holds 0 now",
            "counts": {"evaluated": 3},
        },
    )
    PlacementReport.objects.create(
        created_at=T0, subject="lease:7", request={}, outcome="placed", verdicts=[]
    )
    changelist = reverse("admin:fleet_placementreport_changelist")
    found = client.get(changelist, {"q": "lease:42", "outcome__exact": "rejected"})
    assert found.status_code == 200
    assert "lease:42" in found.content.decode() and "lease:7" not in found.content.decode()
    page = client.get(reverse("admin:fleet_placementreport_change", args=[report.pk]))
    assert page.status_code == 200
    assert "the fleet holds 0 now" in page.content.decode(), "the verdicts are shown, read back from the text"
    changed = client.post(
        reverse("admin:fleet_placementreport_change", args=[report.pk]), {"outcome": "placed"}
    )
    assert changed.status_code == 403
    assert PlacementReport.objects.get(pk=report.pk).outcome == "rejected"
