"""Placement reports past their retention are deleted by the periodic work; the ones that still explain something
live (a lease not yet final, a reschedule waiting for an operator) are kept."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.utils import timezone

from fleet.models import PlacementReport
from leases import actions
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic, retention
from leases.instances.models import Reschedule
from leases.models import Lease
from slotkeeper import metrics
from slotkeeper import periodic as rounds
from slotkeeper.settings import env_seconds
from tests.conftest import requires_postgres
from tests.leases.conftest import vm
from tests.leases.instances.helpers import report_all, run_lease

pytestmark = pytest.mark.django_db

DAY = 86400.0


def report(subject: str, at) -> PlacementReport:
    return PlacementReport.objects.create(
        created_at=at, subject=subject, request={}, outcome="placed", message="", verdicts=[]
    )


def test_old_previews_and_the_reports_of_final_leases_go_and_the_rest_stays(fleet, viewer):
    now = timezone.now()
    done = actions.do_submit_lease(
        None, actions.LeaseSpec(name="big", type="immediate", duration_s=60, vnodes=[vm(cores=64)]), now=now
    ).lease
    running, _ = run_lease(now)
    assert done.state == "rejected" and running.state == "active"
    later = now + timedelta(days=40)
    old_preview = report("preview", later - timedelta(days=2))
    fresh_preview = report("preview", later - timedelta(hours=2))
    fresh_final = report(f"lease:{done.pk}", later - timedelta(days=3))
    unknown_old = report("lease:999999", now)  # a lease deleted since: nothing live holds it

    result = retention.prune_reports(later)

    left = set(PlacementReport.objects.values_list("id", flat=True))
    # The decision reports written 40 days ago: the rejected lease's goes, the active lease's stays.
    assert list(PlacementReport.objects.filter(subject=f"lease:{done.pk}")) == [fresh_final]
    assert PlacementReport.objects.filter(subject=f"lease:{running.pk}").count() == 1
    assert old_preview.pk not in left and unknown_old.pk not in left
    assert {fresh_preview.pk, fresh_final.pk} <= left
    assert (result.previews, result.decisions, result.more) == (1, 2, False)
    # Running it again finds nothing more to do.
    assert retention.prune_reports(later).total == 0
    assert viewer.get(f"/api/placement/reports/{old_preview.pk}/").status_code == 404
    assert viewer.get(f"/api/placement/reports/{fresh_preview.pk}/").status_code == 200


def test_a_report_a_pending_reschedule_points_at_is_kept_until_the_reschedule_is_decided(fleet, viewer):
    now = timezone.now()
    lease, [inst] = run_lease(now)
    report_all(now)
    node_actions.do_declare_dead(None, inst.node_id, reason="PSU failed", now=now)
    proposal = Reschedule.objects.get(instance=inst, status="pending")
    kept = proposal.report_id
    assert kept is not None
    Lease.objects.filter(pk=lease.pk).update(state="cancelled")  # its lease's reports no longer hold it
    later = now + timedelta(days=40)

    retention.prune_reports(later)
    assert PlacementReport.objects.filter(pk=kept).exists()

    Reschedule.objects.filter(pk=proposal.pk).update(status="rejected")
    retention.prune_reports(later)
    assert not PlacementReport.objects.filter(pk=kept).exists()
    proposal.refresh_from_db()
    assert proposal.report_id is None, "the decided reschedule outlives its report"
    shown = viewer.get(f"/api/reschedules/{proposal.pk}/")
    assert shown.status_code == 200 and shown.json()["verdicts"] == []


def test_a_backlog_is_deleted_in_batches_within_the_budget_and_the_next_call_goes_on(db):
    now = timezone.now()
    PlacementReport.objects.bulk_create(
        PlacementReport(
            created_at=now - timedelta(days=3, seconds=i),
            subject="preview",
            request={},
            outcome="",
            verdicts=[],
        )
        for i in range(25)
    )
    before = dict(((n, tuple(sorted(labels.items()))), v) for n, labels, v in metrics.snapshot())
    key = ("slotkeeper_placement_reports_pruned_total", (("kind", "preview"),))

    first = retention.prune_reports(now, budget_s=0, batch=10)
    assert (first.previews, first.more) == (10, True), "one batch, then the budget is spent"
    # The oldest went first.
    oldest_left = PlacementReport.objects.order_by("created_at").first().created_at
    assert oldest_left == now - timedelta(days=3, seconds=14)

    rest = retention.prune_reports(now, budget_s=10, batch=10)
    assert (rest.previews, rest.more) == (15, False)
    assert not PlacementReport.objects.exists()
    after = dict(((n, tuple(sorted(labels.items()))), v) for n, labels, v in metrics.snapshot())
    assert after[key] - before.get(key, 0) == 25


def test_an_infinite_retention_keeps_everything(db, settings):
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "PREVIEW_REPORT_RETENTION_S": float("inf")}
    settings.SLOTKEEPER["REPORT_RETENTION_S"] = float("inf")
    now = timezone.now()
    report("preview", now - timedelta(days=3650))
    report("lease:1", now - timedelta(days=3650))
    assert retention.prune_reports(now).total == 0
    assert PlacementReport.objects.count() == 2


@pytest.mark.parametrize("raw", ["", "soon", "-5", "60", "nan"])
def test_a_retention_setting_that_is_not_a_number_of_seconds_of_an_hour_or_more_is_refused(monkeypatch, raw):
    monkeypatch.setenv("SLOTKEEPER_REPORT_RETENTION_S", raw)
    with pytest.raises(ImproperlyConfigured, match="SLOTKEEPER_REPORT_RETENTION_S"):
        env_seconds("SLOTKEEPER_REPORT_RETENTION_S", DAY, at_least=3600)
    monkeypatch.setenv("SLOTKEEPER_REPORT_RETENTION_S", "7200")
    assert env_seconds("SLOTKEEPER_REPORT_RETENTION_S", DAY, at_least=3600) == 7200


def test_the_periodic_round_runs_retention_at_most_once_a_minute(monkeypatch, db):
    assert ("reports.retention", periodic.retain, "RETENTION_EVERY_S") in rounds.STEPS
    calls = []
    monkeypatch.setattr(rounds, "_last_run", {})
    monkeypatch.setattr(
        rounds, "STEPS", (("reports.retention", lambda now: calls.append(now), "RETENTION_EVERY_S"),)
    )
    clock = [1000.0]
    monkeypatch.setattr(rounds, "_clock", lambda: clock[0])
    rounds.run_periodic()
    clock[0] += 30
    rounds.run_periodic()
    assert len(calls) == 1
    clock[0] += 31
    rounds.run_periodic()
    assert len(calls) == 2


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_two_processes_pruning_at_once_delete_each_report_once_between_them():
    now = timezone.now()
    PlacementReport.objects.bulk_create(
        PlacementReport(
            created_at=now - timedelta(days=2), subject="preview", request={}, outcome="", verdicts=[]
        )
        for _ in range(60)
    )
    counted, errors = [], []
    start = threading.Barrier(2)

    def prune() -> None:
        try:
            start.wait()
            counted.append(retention.prune_reports(now, budget_s=10, batch=7).previews)
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=prune) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert not PlacementReport.objects.exists()
    assert sum(counted) == 60, counted
