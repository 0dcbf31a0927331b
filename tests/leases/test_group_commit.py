"""Group commit in the plan applier (docs/group-commit.md): lease requests are stored as intents, one pass plans
every waiting one, and each request is answered once with its own decision; a cached scheduler that is behind
catches up by re-reading only the leases the missed versions touched."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from fleet.models import PlacementReport
from leases import actions
from leases.lifecycle import LeaseState
from leases.models import Lease, PlanVersion, SchedulerState
from leases.planning import applying, intents, passes, reporting, restore
from slotkeeper import planlock
from slotkeeper.models import AuditEntry
from tests.conftest import requires_postgres
from tests.leases.conftest import intent, picture, unreadable, vm
from tests.leases.invariants import overcommitted_instants


def spec(name: str, *, type="best_effort", cores=1, count=1, start=None) -> actions.LeaseSpec:
    return actions.LeaseSpec(
        name=name, type=type, duration_s=3600, vnodes=[vm(cores=cores)] * count, start=start
    )


# -- one pass, many requests (SQLite and PostgreSQL) ----------------------------------------------------------


def test_one_pass_plans_every_waiting_request_with_one_version_and_one_report_each(fleet, django_user_model):
    operator = django_user_model.objects.create_user("olga")
    now = timezone.now()
    waiting = [intent(f"w{i}", now, cores=2, count=2) for i in range(5)]
    Lease.objects.filter(pk=waiting[0].pk).update(submitted_by=operator)
    # Four nodes of 4 cores: four of these fit now (2 x 2 cores each), the fifth waits; and one AR that can
    # never fit (5 vnodes of 4 cores on 4 nodes) is rejected in the same pass.
    waiting.append(
        intent("too-big", now, type="advance_reservation", cores=4, count=5, start=now + timedelta(hours=1))
    )
    before = SchedulerState.objects.get_or_create(pk=1)[0].version
    with passes.planning(now):
        pass
    assert passes.pass_stats.last_batch == 6
    assert SchedulerState.objects.get(pk=1).version == before + 1  # one version bump for the whole batch
    states = dict(Lease.objects.filter(pk__in=[w.pk for w in waiting]).values_list("name", "state"))
    assert states["too-big"] == LeaseState.REJECTED
    # Four run now; the fifth waits behind them (queued, or reserved after them by backfilling).
    assert sorted(states[f"w{i}"] for i in range(5)).count(LeaseState.ACTIVE) == 4
    assert LeaseState.NEW not in states.values()
    for lease in waiting:
        reports = PlacementReport.objects.filter(subject=f"lease:{lease.pk}")
        assert reports.count() == 1
        audits = AuditEntry.objects.filter(action="lease.submit", target_id=str(lease.pk))
        assert audits.count() == 1
        row = audits.get()
        assert (row.target_type, row.target_label, row.at) == ("lease", str(lease), now)
        assert row.details["type"] == lease.type and row.details["accepted"] is (lease.name != "too-big")
        by_operator = lease.pk == waiting[0].pk
        assert (row.actor, row.actor_label) == ((operator, "olga") if by_operator else (None, "system"))
    assert PlacementReport.objects.get(subject=f"lease:{waiting[-1].pk}").outcome == "rejected"
    assert overcommitted_instants() == []


def test_a_pass_writes_each_decided_request_s_row_once(fleet, monkeypatch):
    """Its state, its run figures and its message in one UPDATE of the row, not one a field: each update of a row
    is a new row version with its index entries, a database's work per request in a burst."""
    now = timezone.now()
    waiting = [intent(f"w{i}", now, cores=2, count=2) for i in range(5)]
    waiting.append(
        intent("too-big", now, type="advance_reservation", cores=4, count=5, start=now + timedelta(hours=1))
    )
    writes: list[tuple[tuple[str, ...], list[int]]] = []
    update_many = applying.update_many

    def spy(rows, fields, *, model=None):
        rows = list(rows)
        if rows and (model or type(rows[0])) is Lease:
            writes.append((tuple(fields), [row.pk for row in rows]))
        return update_many(rows, fields, model=model)

    # Every writer of lease rows in a pass: the journal (applying) and the "placed by the queue" messages.
    monkeypatch.setattr(applying, "update_many", spy)
    monkeypatch.setattr(reporting, "update_many", spy)
    with passes.planning(now):
        pass
    for lease in waiting:
        wrote = [fields for fields, pks in writes if lease.pk in pks]
        assert len(wrote) == 1, (lease.name, writes)
        assert {"state", "message"} <= set(wrote[0])
    rows = {row.name: row for row in Lease.objects.filter(pk__in=[w.pk for w in waiting])}
    assert rows["too-big"].state == LeaseState.REJECTED and rows["too-big"].message
    running = [row for name, row in rows.items() if row.state == LeaseState.ACTIVE]
    assert len(running) == 4
    for row in running:
        assert row.first_start == now and row.message and row.message != rows["too-big"].message


def test_a_request_the_scheduler_cannot_take_is_rejected_alone_and_the_batch_goes_on(fleet, monkeypatch):
    now = timezone.now()
    bad, good = intent("bad", now), intent("good", now)
    unreadable(monkeypatch, "bad")
    with passes.planning(now):
        pass
    bad.refresh_from_db()
    good.refresh_from_db()
    assert bad.state == LeaseState.REJECTED and "a vnode of no size" in bad.message
    assert good.state == LeaseState.ACTIVE
    report = PlacementReport.objects.get(subject=f"lease:{bad.pk}")
    assert report.outcome == "rejected" and report.rows == []


def test_a_cancel_or_the_tick_also_plans_the_waiting_requests(fleet):
    now = timezone.now()
    waiting = intent("waits", now)
    actions.advance(now)  # the lease part of the tick: its pass picks the request up first
    waiting.refresh_from_db()
    assert waiting.state != LeaseState.NEW
    assert PlacementReport.objects.filter(subject=f"lease:{waiting.pk}").count() == 1


def test_a_submission_answers_with_its_own_decision_and_report(fleet):
    now = timezone.now()
    other = intent("stored-earlier", now)
    done = actions.do_submit_lease(None, spec("mine", type="immediate", cores=1), now=now)
    assert done.decision.lease_id == done.lease.pk
    assert done.report.subject == f"lease:{done.lease.pk}"
    assert done.decision.accepted and done.lease.state == LeaseState.ACTIVE
    # The request stored before it was planned in the same pass, and answered with a report of its own.
    other.refresh_from_db()
    assert other.state != LeaseState.NEW
    assert passes.pass_stats.last_batch == 2
    rejected = actions.do_submit_lease(None, spec("never", type="immediate", cores=4, count=5), now=now)
    assert not rejected.decision.accepted
    assert rejected.report.outcome == "rejected" and rejected.report.rows


def test_metrics_show_the_plan_queue(fleet):
    intent("waits", timezone.now())
    text = Client().get("/metrics").content.decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines["slotkeeper_plan_queue_depth"]) == 1
    with passes.planning(timezone.now()):
        pass
    text = Client().get("/metrics").content.decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines["slotkeeper_plan_queue_depth"]) == 0
    assert float(lines["slotkeeper_plan_batch_size_last"]) == 1
    assert float(lines["slotkeeper_plan_passes_total"]) >= 1
    assert "slotkeeper_plan_pass_seconds_last" in lines


def test_metrics_split_a_pass_s_cpu_by_part(fleet):
    """Where a pass's CPU goes, counted in the process that ran it: every part, and the requests' part grows with
    a pass that planned one."""

    def parts() -> dict[str, float]:
        text = Client().get("/metrics").content.decode()
        prefix = 'slotkeeper_plan_pass_cpu_seconds_total{part="'
        return {
            line[len(prefix) :].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(prefix)
        }

    before = parts()
    intent("waits", timezone.now())
    with passes.planning(timezone.now()):
        pass
    after = parts()
    assert set(after) == {"read", "catch_up", "prepare", "requests", "caller", "write"}
    assert after["requests"] > before.get("requests", 0.0)
    assert all(after[part] >= before.get(part, 0.0) for part in after)


# -- catching up instead of reloading -------------------------------------------------------------------------


# Real commits: the scheduler is cached only once its pass commits.
@pytest.mark.django_db(transaction=True)
def test_a_stale_cache_re_reads_only_the_touched_leases_and_equals_a_full_reload(fleet):
    now = timezone.now()
    for i in range(6):
        actions.do_submit_lease(None, spec(f"early{i}", cores=1), now=now)
    stale = restore._cache.value
    assert stale is not None
    # Another process's passes: this process's cache is dropped while they run, then handed back, stale.
    restore.drop_cache()
    later = now + timedelta(seconds=5)
    a = actions.do_submit_lease(None, spec("other-a", cores=2), now=later)
    b = actions.do_submit_lease(None, spec("other-b", type="immediate", cores=1), now=later)
    first = Lease.objects.get(name="early0")
    actions.do_cancel_lease(None, first.pk, now=later)
    behind = SchedulerState.objects.get(pk=1).version - stale.version
    assert behind == 3
    touched = {
        i
        for ids in PlanVersion.objects.filter(version__gt=stale.version).values_list("leases", flat=True)
        for i in ids
    }
    live_touched = Lease.objects.filter(pk__in=touched).exclude(state__in=restore.NOT_PLANNED).count()
    restore._cache.value = stale
    with passes.planning(later) as plan:
        assert restore.cache_stats.how == "caught_up"
        assert restore.cache_stats.behind == 3
        # Only the leases those versions touched (the two new ones, the cancelled one drops out), not all eight.
        assert restore.cache_stats.reread == live_touched
        assert {a.lease.pk, b.lease.pk} <= touched
        assert live_touched < Lease.objects.exclude(state__in=restore.NOT_PLANNED).count()
        state = SchedulerState.objects.get(pk=1)
        assert picture(plan.scheduler) == picture(restore.load(plan.nodes, state.next_rid))
    assert plan.scheduler is stale.scheduler


@pytest.mark.django_db(transaction=True)
def test_a_cache_whose_missed_versions_were_pruned_reloads(fleet):
    now = timezone.now()
    actions.do_submit_lease(None, spec("one"), now=now)
    stale = restore._cache.value
    restore.drop_cache()
    actions.do_submit_lease(None, spec("two"), now=now)
    PlanVersion.objects.all().delete()
    restore._cache.value = stale
    with passes.planning(now):
        assert restore.cache_stats.how == "reloaded"


# -- many requests at once, many processes (PostgreSQL) --------------------------------------------------------


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_are_planned_in_one_pass_and_each_answered_once(fleet, settings, monkeypatch):
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "HEALTH_MAX_AGE_S": 3600}
    # The process's pass figures from zero: an earlier test on this worker (a lease array) planned larger batches.
    monkeypatch.setattr(passes, "pass_stats", passes.PassStats())
    threads_n = 12
    held, release = threading.Event(), threading.Event()
    answers: dict[str, actions.Submitted] = {}
    errors: list[BaseException] = []

    def holder() -> None:
        # Another pass holds the plan lock while every request is stored, so they all wait for the next one.
        try:
            with transaction.atomic():
                planlock.take()
                held.set()
                release.wait(30)
        finally:
            connection.close()

    def submit(i: int) -> None:
        try:
            kind = "immediate" if i % 4 == 0 else "best_effort"
            answers[f"r{i}"] = actions.do_submit_lease(
                None, spec(f"r{i}", type=kind, cores=2, count=2), now=timezone.now()
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    hold = threading.Thread(target=holder)
    hold.start()
    assert held.wait(10)
    workers = [threading.Thread(target=submit, args=(i,)) for i in range(threads_n)]
    for t in workers:
        t.start()
    deadline = time.monotonic() + 20
    while Lease.objects.filter(state=LeaseState.NEW).count() < threads_n and time.monotonic() < deadline:
        time.sleep(0.05)
    release.set()
    hold.join()
    for t in workers:
        t.join(60)
    assert errors == []
    assert len(answers) == threads_n
    # Every request was stored before any pass could run: one pass planned them all.
    assert passes.pass_stats.max_batch == threads_n
    for name, done in answers.items():
        assert done.lease.name == name
        assert done.decision.lease_id == done.lease.pk
        assert done.report.subject == f"lease:{done.lease.pk}"
        assert AuditEntry.objects.filter(action="lease.submit", target_id=str(done.lease.pk)).count() == 1
        assert (
            PlacementReport.objects.filter(subject=f"lease:{done.lease.pk}", requested_by="system").count()
            == 1
        )
    assert not Lease.objects.filter(state=LeaseState.NEW).exists()
    assert overcommitted_instants() == []


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_waiter_in_another_process_is_woken_by_the_pass_that_decides_it(fleet, settings):
    db = django_settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "EMBEDDED_LOOP": "0",
        "LOG_LEVEL": "WARNING",
        # The subprocess checks health age against its own settings.
        "SLOTKEEPER_HEALTH_MAX_AGE_S": "3600",
    }
    with transaction.atomic():
        planlock.take()  # no pass can run in the other process while this transaction holds the lock
        proc = subprocess.Popen(
            [sys.executable, "tests/leases/submit_worker.py", "elsewhere"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=django_settings.BASE_DIR,
        )
        deadline = time.monotonic() + 30
        while not Lease.objects.filter(name="elsewhere").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Lease.objects.filter(name="elsewhere", state=LeaseState.NEW).exists()
        time.sleep(1.0)  # the other process tried the lock, failed, and sleeps
        with passes.planning(timezone.now()):
            pass  # this pass plans the other process's request; it hears of it when this commits
        committed = time.monotonic()
    out, err = proc.communicate(timeout=60)
    answered_after = time.monotonic() - committed
    assert proc.returncode == 0, err
    lease_pk, decided_pk, subject, outcome, heard, _ = out.split()
    assert lease_pk == decided_pk and subject == f"lease:{lease_pk}"
    assert outcome in ("placed", "queued")
    assert int(heard) >= 1  # woken by NOTIFY, not by its (30 s) fallback poll
    assert answered_after < 10


def test_the_requests_a_pass_rejects_raise_no_alert_but_each_its_audit_row(fleet):
    """A rejection is answered to its client (the 409) and kept as an audit row and a metric; it is no operator's
    task, so it raises no alert (200 rejected immediate leases buried the alerts that were: issue 45)."""
    from leases.models import Alert
    from slotkeeper.models import AuditEntry

    now = timezone.now()
    # Four nodes of 4 cores: none takes 8 cores now, so each immediate lease is rejected.
    rejected = [intent(f"huge-{i}", now, type="immediate", cores=8) for i in range(200)]
    placed = intent("small", now, type="immediate", cores=1)
    with passes.planning(now):
        pass
    assert not Alert.objects.exists()
    assert {lease.pk: lease.state for lease in Lease.objects.filter(pk__in=[r.pk for r in rejected])} == {
        lease.pk: LeaseState.REJECTED for lease in rejected
    }
    submits = AuditEntry.objects.filter(action="lease.submit", details__accepted=False)
    assert submits.count() == 200
    assert Lease.objects.get(pk=placed.pk).state == LeaseState.ACTIVE


def test_a_pass_writes_every_report_and_audit_row_chunk_by_chunk(fleet, monkeypatch):
    """A pass writes its reports and audit rows a chunk at a time, pipelined with building the next chunk
    (intents.REPORT_CHUNK): with chunks of two, five requests make two full chunks and a last one of one, and each
    request still has exactly its one report and one audit row, with its own outcome."""
    monkeypatch.setattr(intents, "REPORT_CHUNK", 2)
    now = timezone.now()
    fits = [intent(f"fits-{i}", now, type="immediate", cores=1) for i in range(4)]
    too_big = intent("too-big", now, type="immediate", cores=8)
    with passes.planning(now):
        pass
    for lease, outcome in [*((lease, "placed") for lease in fits), (too_big, "rejected")]:
        report = PlacementReport.objects.get(subject=f"lease:{lease.pk}")
        assert (report.outcome, report.created_at) == (outcome, now)
        assert report.verdicts["counts"]["evaluated"] == 4  # every node's verdict
        audit_row = AuditEntry.objects.get(action="lease.submit", target_id=str(lease.pk))
        assert audit_row.details["accepted"] is (outcome == "placed")
    assert PlacementReport.objects.count() == 5
    assert AuditEntry.objects.filter(action="lease.submit").count() == 5
