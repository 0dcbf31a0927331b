"""When the plan applier runs the queue forecast and what it writes (leases/forecasting.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from fleet import actions as fleet_actions
from leases import forecasting
from leases.actions import advance
from leases.instances.actions import nodes as node_actions
from leases.models import Lease, SchedulerState
from leases.planning import passes, restore
from leases.scheduler import Snapshot
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def submit(client, **body):
    payload = {"name": "job", "type": "best_effort", "duration_s": 600, "nodes": [vm(mem=8192)], **body}
    return client.post("/api/leases/", payload, format="json").json()


def test_a_queue_too_big_for_a_submission_is_forecast_by_the_next_tick(operator, fleet, monkeypatch):
    monkeypatch.setattr(forecasting, "INLINE_WORK", 0)
    submit(operator, type="immediate", nodes=[vm(mem=8192)] * 4)
    submit(operator)  # the future reservation
    queued = submit(operator)
    assert queued["state"] == "queued"
    assert Lease.objects.get(pk=queued["id"]).estimated_start is None
    assert SchedulerState.objects.get().forecast_stale
    advance(timezone.now())
    assert Lease.objects.get(pk=queued["id"]).estimated_start is not None
    assert not SchedulerState.objects.get().forecast_stale


def test_a_forecast_found_slow_in_a_pass_is_left_to_the_ticks_until_one_finds_it_cheap_again(
    operator, fleet, monkeypatch
):
    """On a full 1,000-node fleet a small queue's forecast took 1.7 s inside every pass, so inside every lease
    request's answer: its cost per lease x node is 70 times what the inline limit assumed."""
    real = forecasting.forecast
    runs = []

    def slow(book, *args, **kwargs):
        runs.append(type(book))
        if type(book) is not Snapshot:
            spin = time.thread_time() + 2 * forecasting.INLINE_BUDGET_S
            while time.thread_time() < spin:  # CPU, as a forecast packing a full fleet spends it
                pass
        return real(book, *args, **kwargs)

    first = queue_up(operator, 1)
    assert Lease.objects.get(pk=first[0]).estimated_start is not None
    monkeypatch.setattr(forecasting, "forecast", slow)
    found_slow = submit(operator)["id"]  # a second queued lease: forecast in its own pass, found slow
    assert runs and Snapshot not in runs
    assert Lease.objects.get(pk=found_slow).estimated_start is not None
    runs.clear()
    second = submit(operator)["id"]
    assert runs == [], "found slow once: the next pass does not run it"
    assert Lease.objects.get(pk=second).estimated_start is None
    assert SchedulerState.objects.get().forecast_stale
    advance(timezone.now())  # the tick forecasts from a snapshot, outside the lock, and finds it cheap
    assert runs == [Snapshot]
    assert Lease.objects.get(pk=second).estimated_start is not None
    runs.clear()
    third = submit(operator)["id"]
    assert runs and runs[0] is not Snapshot, "cheap again: back inside the pass"
    assert Lease.objects.get(pk=third).estimated_start is not None


def test_an_unchanged_forecast_writes_nothing_and_runs_again_after_a_minute(operator, fleet, monkeypatch):
    submit(operator, type="immediate", nodes=[vm(mem=8192)] * 4)
    submit(operator)
    queued = submit(operator)
    estimate = Lease.objects.get(pk=queued["id"]).estimated_start
    assert estimate is not None
    runs, written = [], []
    real_forecast, real_write = forecasting.forecast, forecasting.write
    monkeypatch.setattr(forecasting, "forecast", lambda *a, **k: runs.append(1) or real_forecast(*a, **k))
    monkeypatch.setattr(forecasting, "write", lambda e: written.append(real_write(e)) or written[-1])
    advance(timezone.now())  # nothing changed since the submission's pass: not run
    assert runs == []
    later = SchedulerState.objects.get().forecast_at + timedelta(seconds=61)
    for node in fleet:  # fresh health, so no node is excluded a minute on
        node_actions.do_heartbeat(node, fleet_actions.HealthReport(8192, 1000, 90.0, 1.0, 0.1), now=later)
    advance(later)  # a minute on: run again, and nothing to write
    assert runs == [1] and written == [0]
    assert Lease.objects.get(pk=queued["id"]).estimated_start == estimate


def test_passes_with_an_empty_queue_forecast_nothing_once_the_estimates_are_cleared(
    operator, fleet, monkeypatch
):
    """A burst that queues nothing paid a forecast and a read of the leases with estimates in every pass."""
    submit(operator, type="immediate", nodes=[vm(mem=8192)] * 4)
    submit(operator)
    queued = submit(operator)
    assert Lease.objects.get(pk=queued["id"]).estimated_start is not None
    runs = []
    real_forecast = forecasting.forecast
    monkeypatch.setattr(forecasting, "forecast", lambda *a, **k: runs.append(1) or real_forecast(*a, **k))
    for lease in Lease.objects.filter(state__in=["queued", "ready", "active"]).order_by("-pk"):
        operator.post(f"/api/leases/{lease.pk}/cancel/")
    assert runs  # the queue emptied: the forecast ran and cleared the estimate
    lease = Lease.objects.get(pk=queued["id"])
    assert (lease.estimated_start, lease.estimate_note) == (None, "")
    runs.clear()
    placed = submit(operator)
    assert placed["state"] in ("ready", "active")
    submit(operator)
    assert runs == []  # two passes that changed the plan, the queue empty before and after: no forecast
    assert not Lease.objects.exclude(estimated_start=None).exists()
    assert submit(operator, type="immediate", nodes=[vm(mem=8192)] * 2)["state"] != "rejected"  # fleet full
    submit(operator)  # the one future reservation
    waiting = submit(operator)
    assert runs  # the queue is no longer empty: forecast again
    assert waiting["state"] == "queued"
    assert Lease.objects.get(pk=waiting["id"]).estimated_start is not None


# -- a large queue: snapshot under the lock, forecast outside it, written by compare-and-swap -------------------


def queue_up(client, n: int) -> list[int]:
    """Every node full now (one immediate lease of four whole-node VMs), a lease holding aggressive backfilling's
    one future reservation, then `n` leases waiting in the queue with no start of their own."""
    submit(client, type="immediate", nodes=[vm(mem=8192)] * 4)
    submit(client)
    ids = [submit(client)["id"] for _ in range(n)]
    assert Lease.objects.filter(pk__in=ids, state="queued").count() == n
    return ids


def estimates(ids):
    return {
        pk: (s, e)
        for pk, s, e in Lease.objects.filter(pk__in=ids).values_list("pk", "estimated_start", "estimated_end")
    }


@pytest.fixture
def large(monkeypatch):
    # Every queue counts as too large to forecast inside a pass (at 2,000 x 1,000 it is ~1.3 s of CPU).
    monkeypatch.setattr(forecasting, "INLINE_WORK", 0)


def test_a_large_queue_is_forecast_from_a_snapshot_after_the_ticks_pass_has_committed(
    operator, fleet, large, monkeypatch
):
    ids = queue_up(operator, 2)
    assert all(s is None for s, _ in estimates(ids).values())  # too large for the submissions' passes
    outside = len(connection.atomic_blocks)  # the test's own transaction(s), and nothing of a pass
    seen = []
    real = forecasting.forecast
    monkeypatch.setattr(
        forecasting,
        "forecast",
        lambda book, *a, **k: seen.append((type(book), len(connection.atomic_blocks))) or real(book, *a, **k),
    )
    sent = []
    monkeypatch.setattr(
        forecasting.events, "send_on_commit", lambda event, **payload: sent.append((event, payload))
    )
    advance(timezone.now())
    # Computed once, from a snapshot, with no transaction of the pass (nor of the plan lock) still open.
    assert seen == [(Snapshot, outside)]
    # Written after the pass's own events went out: the consoles are told again.
    assert sent[-1] == ("slots-changed", {"leases": sorted(ids)})
    got = estimates(ids)
    assert all(s is not None and e is not None for s, e in got.values())
    state = SchedulerState.objects.get()
    assert (
        not state.forecast_stale and state.forecast_version == state.version and state.forecast_at is not None
    )


def test_a_forecast_overtaken_by_a_pass_that_changes_the_plan_writes_nothing(
    operator, fleet, large, monkeypatch
):
    first = queue_up(operator, 1)
    advance(timezone.now())
    before = estimates(first)
    assert before[first[0]][0] is not None
    second = submit(operator)["id"]  # the queue moved: stale, and too large for the submission's own pass
    assert SchedulerState.objects.get().forecast_stale
    real, runs, writes = forecasting.forecast, [], []
    real_write = forecasting.write

    def overtaken(book, *a, **k):
        got = real(book, *a, **k)
        if not runs:
            runs.append(submit(operator)["id"])  # a submission's pass commits while the forecast runs
        return got

    monkeypatch.setattr(forecasting, "forecast", overtaken)
    monkeypatch.setattr(forecasting, "write", lambda e: writes.append(e) or real_write(e))
    advance(timezone.now())
    assert len(runs) == 1  # the forecast did run: its result was dropped, not skipped
    assert writes == []
    assert estimates([*first, second, runs[0]]) == {**before, second: (None, None), runs[0]: (None, None)}
    assert SchedulerState.objects.get().forecast_stale
    # The next tick takes a new snapshot and writes it: dropping a result only defers it by one tick.
    monkeypatch.setattr(forecasting, "forecast", real)
    advance(timezone.now())
    assert all(s is not None for s, _ in estimates([*first, second, runs[0]]).values())


def test_a_pass_that_changes_nothing_the_forecast_reads_does_not_drop_it(operator, fleet, large, monkeypatch):
    # Every pass bumps the plan version; were that the compare, beat's tick every 5 s would drop every forecast
    # that takes longer (8-10 s of wall time at 2,000 x 1,000 on a loaded machine).
    ids = queue_up(operator, 2)
    real = forecasting.forecast
    versions = []

    def meanwhile(book, *a, **k):
        with passes.planning(timezone.now()):
            pass  # a pass with nothing to do commits a new version
        versions.append(SchedulerState.objects.get().version)
        return real(book, *a, **k)

    monkeypatch.setattr(forecasting, "forecast", meanwhile)
    advance(timezone.now())
    state = SchedulerState.objects.get()
    assert versions == [state.version] and state.forecast_version == state.version - 1
    assert all(s is not None for s, _ in estimates(ids).values())


def test_the_snapshot_does_not_see_the_next_pass_change_the_cached_scheduler(
    operator, fleet, large, monkeypatch, django_capture_on_commit_callbacks
):
    # The cached scheduler is kept after a commit (on_commit) and the next pass changes it in place while the
    # forecast may still be running on another thread: the snapshot must not share what that pass writes.
    with django_capture_on_commit_callbacks(execute=True):
        ids = queue_up(operator, 3)
    jobs = []
    monkeypatch.setattr(forecasting, "complete", jobs.append)
    with django_capture_on_commit_callbacks(execute=True):
        advance(timezone.now())
    (job,) = jobs
    live = restore._cache.value.scheduler
    t = job.now.timestamp()
    expected = forecasting.forecast(job.snapshot, t, job.excluded)
    for change in (
        lambda: operator.post(f"/api/leases/{ids[0] - 2}/cancel", {}, format="json"),  # frees every node
        lambda: submit(operator),
    ):
        with django_capture_on_commit_callbacks(execute=True):  # each pass keeps the scheduler for the next
            change()
    assert Lease.objects.get(pk=ids[0] - 2).state == "cancelled"
    assert restore.cache_stats.how == "kept" and restore._cache.value.scheduler is live  # changed in place
    assert forecasting.forecast(live, t, job.excluded) != expected
    assert job.snapshot.queue == tuple(ids)
    assert forecasting.forecast(job.snapshot, t, job.excluded) == expected


def test_one_forecast_runner_at_a_time(operator, fleet, large):
    ids = queue_up(operator, 1)
    with forecasting.runner() as first:
        assert first
        with forecasting.runner() as second:
            assert not second  # another thread of this process
        if connection.vendor == "postgresql":
            other = connections.create_connection("default")  # another process's session
            try:
                with other.cursor() as cursor:
                    cursor.execute("SELECT pg_try_advisory_lock(%s)", [forecasting.RUNNER_LOCK_ID])
                    assert cursor.fetchone() == (False,)
            finally:
                other.close()
        advance(timezone.now())  # a tick that finds the runner taken leaves the forecast for the next one
        assert estimates(ids)[ids[0]] == (None, None)
        assert SchedulerState.objects.get().forecast_stale
    with forecasting.runner() as again:
        assert again
    advance(timezone.now())
    assert estimates(ids)[ids[0]][0] is not None


def test_a_queue_of_many_vm_leases_counts_its_vms_and_goes_to_the_tick(operator, fleet, monkeypatch):
    """The work was counted in leases: one queued lease of 64 VMs weighed as one of a single VM, and an outside
    tester's batch of 1,000 such leases was forecast inside the batch's own pass (0.8 s of that request)."""
    monkeypatch.setattr(
        forecasting, "INLINE_WORK", 3 * len(fleet)
    )  # three queued VMs on every node, not eight
    submit(operator, type="immediate", nodes=[vm(mem=8192)] * 4)
    submit(operator)  # the future reservation
    queued = submit(operator, nodes=[vm(mem=1024)] * 8)
    assert queued["state"] == "queued"
    assert Lease.objects.get(pk=queued["id"]).estimated_start is None, "left to the tick"
    advance(timezone.now())
    assert Lease.objects.get(pk=queued["id"]).estimated_start is not None
