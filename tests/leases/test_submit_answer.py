"""What a lease request reads once its pass has decided it: its row and its first report from statements compiled
once, and its groups as the request set them, so the answer asks the database for nothing more."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import PlacementReport
from leases import actions, reads
from leases.models import Group, Lease
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db(transaction=True)


def submit(name: str, groups=(), type="best_effort", cores=1):
    spec = actions.LeaseSpec(
        name=name, type=type, duration_s=600, vnodes=[vm(cores=cores)], groups=tuple(groups)
    )
    return actions.do_submit_lease(None, spec, now=timezone.now())


@pytest.mark.parametrize("groups", [(), ("web", "db")])
def test_a_submissions_lease_knows_its_groups_without_a_query(fleet, groups):
    for name in ("web", "db", "other"):
        Group.objects.create(name=name, policy="anti_affinity")
    result = submit("grouped", groups)
    with CaptureQueriesContext(connection) as queries:
        names = sorted(g.name for g in result.lease.groups.all())
    assert len(queries) == 0
    assert (
        names
        == sorted(groups)
        == sorted(Lease.objects.get(pk=result.lease.pk).groups.values_list("name", flat=True))
    )


def test_a_submission_is_answered_with_its_row_and_its_first_report_as_stored(fleet):
    result = submit("answered")
    first = submit("rejected", type="immediate", cores=64)  # a second lease and its report beside it
    assert not first.decision.accepted
    stored = Lease.objects.get(pk=result.lease.pk)
    fields = [f.attname for f in Lease._meta.concrete_fields]
    assert [getattr(result.lease, f) for f in fields] == [getattr(stored, f) for f in fields]
    report = PlacementReport.objects.filter(subject=f"lease:{result.lease.pk}").order_by("id").first()
    assert result.report.pk == report.pk and result.report.rows == report.rows
    assert reads.first_report("lease:0") is None
    with pytest.raises(Lease.DoesNotExist):
        reads.lease_row(10**12)


def test_a_leases_whole_answer_reads_its_rows_as_the_orm_would_without_compiling_again(fleet, monkeypatch):
    from unittest.mock import patch

    from django.db.models.sql.compiler import SQLCompiler

    from fleet import models as fleet_models
    from leases.api import serializers as s

    monkeypatch.setattr(fleet_models, "NAMES_BY_ID", 0)  # a report's names read whole, as at fleet scale
    placed, other = submit("placed"), submit("other")
    lease = Lease.objects.get(pk=placed.lease.pk)
    s.plain(s.LeaseDetailSerializer, lease)  # compiled here, if no earlier test did
    cached_groups = Lease.objects.prefetch_related("groups").get(pk=lease.pk)  # groups read before the patch
    with patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        answer = s.plain(s.LeaseDetailSerializer, cached_groups)
    rows = lease.reservations.select_related("lease").order_by("start", "rid")
    assert answer["reservations"] == s.plain(s.ReservationSerializer, rows, many=True) != []
    assert answer["reservations"][0]["lease_name"] == "placed"
    assert answer["history"] == s.plain(s.LeaseEventSerializer, lease.events.all(), many=True) != []
    reports = PlacementReport.objects.filter(subject=f"lease:{lease.pk}").order_by("created_at", "id")
    assert answer["placement_reports"] == s.plain(s.ReportBriefSerializer, reports, many=True) != []
    assert other.lease.pk not in {r["lease"] for r in answer["reservations"]}
