"""The embedded loop's large forecasts (leases/forecasting.py, `Background`): computed on a thread of their own,
so the loop's sweep keeps its period while one runs (a forecast of 6-16 s inside the round made every sweep after
it read as the sweep's own outage, and reset every node's grace), and spaced so that they take no more than
about a tenth of the process's time."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
from django.utils import timezone

from fleet.models import SweepState
from leases import forecasting
from leases.actions import advance
from leases.instances.actions import periodic as steps
from leases.models import SchedulerState
from leases.scheduler import Snapshot
from slotkeeper import embedded
from slotkeeper import periodic as rounds
from tests.leases.test_forecasting import estimates, queue_up, submit

pytestmark = pytest.mark.django_db(transaction=True)

FORECAST_S = 3.0
PERIOD_S = 0.2
OUTAGE_GAP_S = 2.0  # the sweep's away past this: 15 s in production, here under the forecast's 3 s


@pytest.fixture
def large(monkeypatch):
    monkeypatch.setattr(forecasting, "INLINE_WORK", 0)


def test_the_loops_sweep_keeps_its_period_while_a_large_forecast_computes(
    operator, fleet, large, monkeypatch, settings
):
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "SWEEP_OUTAGE_GAP_S": OUTAGE_GAP_S}
    ids = queue_up(operator, 2)
    real, computing, computed = forecasting.forecast, [], threading.Event()

    def slow(book, *a, **k):
        if type(book) is Snapshot:
            computing.append(time.monotonic())
            # Busy, as a large forecast is (it holds the GIL but for the switch interval): wall time, so the
            # other threads' share of the GIL (the rounds') does not stretch it.
            spin = time.perf_counter() + FORECAST_S
            while time.perf_counter() < spin:
                pass
            computing.append(time.monotonic())
            computed.set()
        return real(book, *a, **k)

    monkeypatch.setattr(forecasting, "forecast", slow)
    monkeypatch.setattr(rounds, "FORECASTS", forecasting.Background())
    swept = []

    def sweep(now):
        swept.append((time.monotonic(), steps.sweep(now)))

    monkeypatch.setattr(
        rounds, "STEPS", tuple((n, sweep if n == "fleet.sweep" else s, e) for n, s, e in rounds.STEPS)
    )
    embedded.periodic_round()  # the first sweep of a fresh install starts the grace
    grace = SweepState.objects.get().grace_from
    # Rounds for at least the forecast's length and a second more, and until its result is written.
    started = time.monotonic()
    while time.monotonic() < started + 4 * FORECAST_S and (
        time.monotonic() < started + FORECAST_S + 1
        or not (computed.is_set() and all(s for s, _ in estimates(ids).values()))
    ):
        time.sleep(PERIOD_S)  # the loop's interval, as loop_forever waits it between rounds
        embedded.periodic_round()
    assert computed.is_set()
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(swept)]
    # Was: one gap of the whole forecast (the tick computed it inside the round), read as the sweep's outage.
    assert max(gaps) < OUTAGE_GAP_S, gaps
    began, ended = computing
    assert sum(began < at < ended for at, _ in swept) >= 3  # the loop went on while the forecast ran
    assert all(result.resumed_after_s is None for _, result in swept)
    assert SweepState.objects.get().grace_from == grace
    assert all(s is not None for s, _ in estimates(ids).values())  # committed by the thread meanwhile
    assert not SchedulerState.objects.get().forecast_stale


def test_large_forecasts_are_spaced_to_a_tenth_of_the_time_and_the_throttle_is_said_once(
    operator, fleet, large, monkeypatch, caplog
):
    clock = [1000.0]
    background = forecasting.Background(clock=lambda: clock[0])
    threads = []
    start = background.start
    monkeypatch.setattr(background, "start", lambda job: threads.append(start(job)))
    real = forecasting.forecast

    def takes_two_seconds(book, *a, **k):
        if type(book) is Snapshot:
            clock[0] += 2.0
        return real(book, *a, **k)

    monkeypatch.setattr(forecasting, "forecast", takes_two_seconds)

    def tick() -> int:
        before = len(threads)
        advance(timezone.now(), background)
        for thread in threads[before:]:
            thread.join(10)
        return len(threads) - before

    first = queue_up(operator, 1)
    assert tick() == 1
    assert estimates(first)[first[0]][0] is not None
    late = submit(operator)["id"]  # the queue moved: a forecast is due again
    assert SchedulerState.objects.get().forecast_stale
    caplog.set_level(logging.INFO, logger=forecasting.__name__)
    for at in (1002.0 + 1, 1002.0 + 10, 1002.0 + 17.9):  # 2 s of forecast: the next no sooner than 18 s after
        clock[0] = at
        assert tick() == 0
    assert estimates([late])[late] == (None, None)
    assert [r.message for r in caplog.records].count(
        "queue forecast throttled: the last one took long, the next waits"
    ) == 1
    clock[0] = 1002.0 + 18
    assert tick() == 1
    assert estimates([late])[late][0] is not None
