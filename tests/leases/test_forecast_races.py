"""The large queue's forecast against a real pass on another connection, committed while the forecast runs: the
pass is not held up by it (the plan lock is free), and the forecast, which no longer describes the plan, writes
nothing. SQLite (the file database of the tests) and PostgreSQL."""

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
