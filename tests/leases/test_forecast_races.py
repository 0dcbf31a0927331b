"""The large queue's forecast against real passes on other connections. One commits while the forecast runs: it
is not held up (the plan lock is free), and the forecast, which no longer describes the plan, writes nothing
(SQLite, the tests' file database, and PostgreSQL). One holds SchedulerState's row: the forecast's write waits no
longer than the plan lock's timeout (PostgreSQL)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.utils import timezone

from leases import forecasting
from leases.actions import advance
from leases.models import Lease, SchedulerState
from slotkeeper import planlock
from tests.conftest import requires_postgres
from tests.leases.test_forecasting import estimates, queue_up, submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_pass_commits_while_the_forecast_runs_and_the_forecast_writes_nothing(operator, fleet, monkeypatch):
    monkeypatch.setattr(forecasting, "INLINE_WORK", 0)
    ids = queue_up(operator, 2)
    before = estimates(ids)
    assert all(s is None for s, _ in before.values())
    running, released = threading.Event(), threading.Event()
    real = forecasting.forecast

    def slow(book, *a, **k):
        running.set()
        released.wait(10)
        return real(book, *a, **k)

    monkeypatch.setattr(forecasting, "forecast", slow)
    errors: list[BaseException] = []

    def tick():
        try:
            advance(timezone.now())
        except BaseException as exc:  # surfaced below: a failure in the thread must fail the test
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        assert running.wait(10)
        started = time.perf_counter()
        with transaction.atomic():
            assert planlock.try_take()  # the forecast runs without the plan lock
        late = submit(operator)["id"]  # a real pass, on this thread's connection, commits meanwhile
        took = time.perf_counter() - started
        assert thread.is_alive() and not released.is_set()
    finally:
        released.set()
        thread.join(20)
    assert not errors
    assert took < 5  # was: waiting for the whole forecast (8-10 s at 2,000 x 1,000 on a loaded machine)
    assert estimates([*ids, late]) == {**before, late: (None, None)}  # nothing written
    assert SchedulerState.objects.get().forecast_stale
    advance(timezone.now())  # the next tick's forecast holds, and is written
    assert all(s is not None for s, _ in estimates([*ids, late]).values())
    assert Lease.objects.filter(pk=late, state="queued").exists()


@requires_postgres
def test_the_forecasts_write_waits_no_longer_than_the_plan_lock_timeout(operator, fleet, monkeypatch):
    # A pass holds SchedulerState's row for as long as it plans; the forecast's write waits for it, but bounded.
    monkeypatch.setattr(forecasting, "INLINE_WORK", 0)
    monkeypatch.setattr(planlock, "timeout_s", lambda: 0.3)
    ids = queue_up(operator, 1)
    jobs: list[forecasting.Job] = []
    monkeypatch.setattr(forecasting, "complete", jobs.append)
    advance(timezone.now())
    (job,) = jobs
    got = forecasting.forecast(job.snapshot, job.now.timestamp(), job.excluded)
    holding, done = threading.Event(), threading.Event()

    def hold_the_row():
        try:
            with transaction.atomic():
                SchedulerState.objects.select_for_update().get(pk=1)
                holding.set()
                done.wait(5)
        finally:
            connection.close()

    thread = threading.Thread(target=hold_the_row)
    thread.start()
    try:
        assert holding.wait(5)
        started = time.perf_counter()
        assert forecasting.commit(job, got) is None
        took = time.perf_counter() - started
    finally:
        done.set()
        thread.join(10)
    assert took < 2
    assert estimates(ids)[ids[0]] == (None, None)
    assert (
        forecasting.commit(job, got) == 1
    )  # once the row is free, the same result still holds and is written
