"""The Django admin shows placement reports, whose verdicts are a JSON document kept as text (JSONTextField), and
shows them decoded: one row per node with its verdict and reason."""

import html

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fleet.models import PlacementReport
from tests.conftest import T0, healthy

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    """A superuser signed in to the admin."""
    signed_in = Client()
    signed_in.force_login(get_user_model().objects.create_superuser(username="root", password="x"))
    return signed_in


def test_an_admin_lists_searches_and_reads_a_report_and_cannot_change_it(client):
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


def test_the_admin_shows_a_real_reports_verdicts_decoded_not_its_stored_columns(client, register_node, admin):
    for name, cores in (("tank", 16), ("architect", 8)):
        node, agent = register_node(name=name, cpu_cores=cores, now=timezone.now())
        assert agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json").status_code == 200
    body = {
        "name": "big",
        "type": "immediate",
        "duration_s": 600,
        "nodes": [{"cpu_cores": 12, "mem_mib": 1024}],
    }
    assert admin.post("/api/leases/", body, format="json").status_code == 201
    report = PlacementReport.objects.get(subject__startswith="lease:")
    page = client.get(reverse("admin:fleet_placementreport_change", args=[report.pk])).content.decode()
    assert '"v":' not in html.unescape(page), "the stored columns are not what an operator reads"
    assert report.summary in page
    for row in report.rows:
        assert f"<td>{row['node']}</td>" in page
    assert "allocates at most 8 cores even when empty; one VM needs 12 cores" in page  # architect's reason
    assert reverse("placement-report", args=[report.pk]) in page


def test_a_report_stored_as_rows_before_reports_were_compact_still_reads(client):
    report = PlacementReport.objects.create(
        created_at=T0,
        subject="lease:9",
        request={},
        outcome="rejected",
        verdicts=[{"node": "tank", "fit": False, "reason_code": "at_capacity", "reason": "no memory free"}],
    )
    page = client.get(reverse("admin:fleet_placementreport_change", args=[report.pk]))
    assert page.status_code == 200
    assert "<td>tank</td>" in page.content.decode() and "no memory free" in page.content.decode()
