"""A placement preview is a write like any other: its report is stored through fleet's action, with an audit row."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions, capacity, placement
from fleet.models import PlacementReport
from slotkeeper.models import AuditEntry

pytestmark = pytest.mark.django_db


def test_a_preview_keeps_its_report_with_every_node_and_is_audited():
    now = timezone.now()
    actions.do_register_node(
        None, name="tank", cpu_cores=8, mem_total_mib=61440, disk_total_gib=500, capabilities=[], now=now
    )
    states = placement.snapshot(now)
    result, report = actions.do_preview_placement(None, capacity.Need(mem_mib=2048), states=states, now=now)
    assert PlacementReport.objects.get(pk=report.pk).subject == "preview"
    assert [v["node"] for v in report.rows] == ["tank"]
    assert str(result.outcome) == report.outcome
    assert AuditEntry.objects.filter(action="placement.preview", target_id=str(report.pk)).exists()
