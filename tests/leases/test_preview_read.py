"""A preview is a read (leases/planning/reading.py `consulting`): asked of the scheduler the last pass committed,
when this process holds it current, with no plan lock, no version and no journal; a planning pass otherwise.
Either way it answers exactly as a pass at the same instant would, and never from a scheduler a pass is
changing."""

from __future__ import annotations

import threading
from unittest.mock import patch

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import Node
from leases import actions as lease_actions
from leases.models import Lease, PlanVersion, SchedulerState
from leases.planning import passes, reading, restore
from slotkeeper import planlock
from tests.conftest import requires_postgres
from tests.leases.conftest import intent, vm

pytestmark = pytest.mark.django_db

ASK = {"mem_mib": 4096, "disk_gib": 0, "cpu_cores": 1, "capabilities": [], "count": 2, "preferred_node": None}


def submit(client, **body):
    payload = {"name": "job", "type": "immediate", "duration_s": 3600, "nodes": [vm()], **body}
    return client.post("/api/leases/", payload, format="json")


@pytest.fixture
def kept(fleet, django_capture_on_commit_callbacks):
    """A fleet with a pass committed in this process, so its scheduler is cached (as in a running server)."""
    with django_capture_on_commit_callbacks(execute=True), passes.planning(timezone.now()):
        pass
    assert restore._cache.value is not None
    return fleet


def plan_marks() -> tuple[int, int]:
    return SchedulerState.objects.get(pk=1).version, PlanVersion.objects.count()


def answer(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "report"}


def test_a_preview_on_the_current_scheduler_takes_no_plan_lock_and_writes_no_version(kept):
    before = plan_marks()
    with patch.object(planlock, "take", side_effect=AssertionError("took the plan lock")):
        body, report = lease_actions.do_preview(None, ASK, now=timezone.now())
    assert body["outcome"] == "placed" and len(body["verdicts"]) == 4
    assert plan_marks() == before
    assert report.pk is not None  # still kept and audited


def test_a_preview_read_answers_exactly_as_a_preview_in_a_pass(
    operator, kept, django_capture_on_commit_callbacks
):
    Node.objects.filter(name="n2").update(capabilities=["accel.gpu"])
    Node.objects.filter(name="n3").update(status="draining", drain_reason="maintenance")
    with django_capture_on_commit_callbacks(execute=True):
        assert submit(operator, nodes=[vm(cores=3, mem=6144)]).status_code == 201
    now = timezone.now()
    before = plan_marks()
    read, _ = lease_actions.do_preview(None, ASK, now=now)
    assert plan_marks() == before  # it was a read
    restore.drop_cache()  # the next preview must run a pass (a reload) to answer
    passed, _ = lease_actions.do_preview(None, ASK, now=now)
    assert plan_marks()[0] == before[0] + 1  # it was a pass
    assert answer(read) == answer(passed)
    assert read["verdicts"] and any(v["reason_code"] for v in read["verdicts"])


def test_a_preview_read_gives_the_verdicts_of_the_lease_submitted_after_it(
    operator, kept, django_capture_on_commit_callbacks
):
    """Issue 11's contract, on the read path: the preview and the lease's own report agree node by node."""
    Node.objects.filter(name="n2").update(capabilities=["accel.gpu"])
    with django_capture_on_commit_callbacks(execute=True):
        submit(operator, nodes=[vm(cores=3, mem=6144)])
    before = plan_marks()
    preview = operator.post("/api/placement/preview", {**ASK, "duration_s": 600}, format="json").json()
    assert plan_marks() == before
    lease = submit(operator, duration_s=600, nodes=[vm(cores=1, mem=4096)] * 2).json()
    report = operator.get(f"/api/leases/{lease['id']}/").json()["placement_reports"][0]

    def key(rows):
        return sorted(
            (v["node"], v["fit"], v["holds"], v["reason_code"], v["reason"], v["chosen"]) for v in rows
        )

    assert key(preview["verdicts"]) == key(report["verdicts"])
    assert preview["nodes"] == report["chosen"]


def test_a_preview_runs_a_pass_when_a_request_waits_and_so_plans_it_first(kept):
    waiting = intent("early", timezone.now())
    before = plan_marks()
    lease_actions.do_preview(None, ASK, now=timezone.now())
    assert plan_marks()[0] == before[0] + 1
    assert Lease.objects.get(pk=waiting.pk).state != "new"


def test_a_preview_runs_a_pass_when_another_process_committed_since(kept):
    # Another process's pass: the version moved on, with what it touched.
    state = SchedulerState.objects.get(pk=1)
    SchedulerState.objects.filter(pk=1).update(version=state.version + 1)
    PlanVersion.objects.create(version=state.version + 1, leases=[])
    lease_actions.do_preview(None, ASK, now=timezone.now())
    assert restore.cache_stats.how == "caught_up"
    assert plan_marks()[0] == state.version + 2


def test_a_preview_runs_a_pass_when_a_node_changed_capacity(kept):
    Node.objects.filter(name="n1").update(cpu_cores=8)
    before = plan_marks()
    lease_actions.do_preview(None, ASK, now=timezone.now())
    assert restore.cache_stats.how == "reloaded" and plan_marks()[0] == before[0] + 1


def test_a_pass_waits_for_a_read_to_finish_before_it_takes_the_scheduler(kept):
    taken = []
    with reading.consulting(timezone.now()) as plan:
        sched = plan.scheduler
        passing = threading.Thread(target=lambda: taken.append(restore._take_cached()))
        passing.start()
        passing.join(0.3)
        assert passing.is_alive() and not taken  # the pass waits: the read is still asking
    passing.join(5)
    assert taken[0].scheduler is sched and restore._cache.value is None


def test_a_read_does_not_ask_the_scheduler_a_pass_has_taken(kept):
    restore._take_cached()  # a pass in another thread has it, and has not committed
    before = plan_marks()
    with reading.consulting(timezone.now()):
        pass
    assert plan_marks()[0] == before[0] + 1  # it ran a pass of its own


def test_a_read_that_fails_drops_the_cached_scheduler(kept):
    with pytest.raises(RuntimeError), reading.consulting(timezone.now()):
        raise RuntimeError("a question that failed half-way")
    assert restore._cache.value is None
    assert restore._cache_lock.acquire(blocking=False)  # and gave the lock back
    restore._cache_lock.release()


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_only_a_previews_record_commits_without_waiting_for_the_disk(operator, fleet):
    """The preview's report and audit row commit with synchronous_commit off (a record of a question: the disk's
    slowest flushes were most of its p99); the setting ends with that transaction, and a planning pass, which
    decides, never asks for it."""
    with CaptureQueriesContext(connection) as asked:
        got = operator.post(
            "/api/placement/preview", {k: v for k, v in ASK.items() if v is not None}, format="json"
        )
    assert got.status_code == 200, got.content
    sql = [q["sql"] for q in asked.captured_queries]
    relaxed = [i for i, s in enumerate(sql) if "synchronous_commit" in s]
    report_insert = next(i for i, s in enumerate(sql) if s.startswith('INSERT INTO "fleet_placementreport"'))
    assert relaxed and relaxed[0] < report_insert, sql
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    with CaptureQueriesContext(connection) as passed:
        assert submit(operator).status_code == 201
    assert not [q for q in passed.captured_queries if "synchronous_commit" in q["sql"]]
