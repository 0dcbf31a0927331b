"""A placement preview is a write like any other: asked of the scheduler (leases/actions.py do_preview), its report
is stored with every node's verdict and an audit row, and nothing is placed."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions
from fleet.models import PlacementReport
from leases import actions as lease_actions
from leases.models import Lease, Reservation
from slotkeeper.models import AuditEntry

pytestmark = pytest.mark.django_db


def test_a_preview_keeps_its_report_with_every_node_and_is_audited_and_places_nothing():
    now = timezone.now()
    actions.do_register_node(
        None, name="tank", cpu_cores=8, mem_total_mib=61440, disk_total_gib=500, capabilities=[], now=now
    )
    ask = {
        "mem_mib": 2048,
        "disk_gib": 0,
        "cpu_cores": 1,
        "capabilities": [],
        "count": 1,
        "preferred_node": None,
    }
    body, report = lease_actions.do_preview(None, ask, now=now)
    assert PlacementReport.objects.get(pk=report.pk).subject == "preview"
    assert [v["node"] for v in report.rows] == ["tank"]
    assert body["outcome"] == report.outcome and body["report"] == report.pk
    assert AuditEntry.objects.filter(action="placement.preview", target_id=str(report.pk)).exists()
    assert not Lease.objects.exists() and not Reservation.objects.exists()
