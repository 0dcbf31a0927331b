"""The queue forecast's likely range (issue 48 item 4): learnt from how queued leases waited against their first
estimate, measured on a replay, kept per lease, shown on a queued lease's page."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from leases import forecasting
from leases.models import Lease
from leases.replay import ForecastAccuracy, replay, setup
from leases.scheduling.calibration import MIN_SAMPLES, WaitCalibration
from leases.slottable import Res
from leases.traces import Trace, TraceLease
from tests.console.conftest import signed_in
from tests.leases.conftest import intent
from tests.leases.test_forecasting import queue_up


def test_no_range_until_enough_leases_have_waited_and_none_for_a_lease_due_within_a_minute():
    c = WaitCalibration()
    for _ in range(MIN_SAMPLES - 1):
        c.observe(0.0, 1000.0, 250.0)
    assert c.likely(0.0, 4000.0) is None
    c.observe(0.0, 30.0, 30.0)  # an estimate due within a minute teaches nothing
    assert c.likely(0.0, 4000.0) is None
    c.observe(0.0, 1000.0, 250.0)
    got = c.likely(100.0, 4100.0)
    assert got is not None and got.samples == MIN_SAMPLES
    assert (got.low, got.start, got.high) == (1100.0, 1100.0, 1100.0)  # a quarter of the 4,000 s left
    assert c.likely(100.0, 130.0) is None


def test_the_range_spans_the_tenth_to_ninetieth_percentile_of_the_ratios():
    c = WaitCalibration().observe_all((0.0, 100.0, float(r)) for r in range(1, 101))  # ratios 0.01 .. 1.00
    got = c.likely(0.0, 1000.0)
    assert got is not None
    assert (
        got.low == pytest.approx(110.0)
        and got.start == pytest.approx(510.0)
        and got.high == pytest.approx(900.0)
    )


def test_on_a_replay_where_leases_end_early_the_likely_start_is_closer_than_the_estimate():
    """One node; a lease of an hour asked every five minutes, each really running ten: the queue grows, every
    estimate counts the leases ahead at an hour each, and each starts about a sixth of its estimated wait later.
    Learnt from the leases that have started, the likely start is nearer, and the actual start falls in its range."""
    node = Res(100, 1024)
    leases = [
        TraceLease(i, "best_effort", 300.0 * i, None, None, 3600.0, 600.0, (node,)) for i in range(1, 121)
    ]
    trace = Trace("early.lwf", "early", (node,), tuple(leases))
    capacities, config = setup(trace, None)
    accuracy = ForecastAccuracy()
    replay(trace, capacities, config, accuracy=accuracy)
    summary = accuracy.summary()
    likely, baseline = summary["likely"], summary["likely_baseline"]
    assert likely["leases"] >= 40 and likely["leases"] == baseline["leases"]
    assert likely["median_abs_error_s"] < baseline["median_abs_error_s"] / 3
    assert likely["within_10_min"] > baseline["within_10_min"]
    assert likely["range_coverage"] >= 0.8


@pytest.mark.django_db
def test_a_queued_lease_keeps_its_first_estimate_as_later_forecasts_move_it(operator, fleet):
    (queued,) = queue_up(operator, 1)
    first = Lease.objects.get(pk=queued)
    assert first.first_estimate is not None and first.first_estimate == first.estimated_start
    moved = forecasting.Estimate(
        first.estimated_start.timestamp() + 900, first.estimated_end.timestamp() + 900
    )
    assert forecasting.write({queued: moved}) == 1
    again = Lease.objects.get(pk=queued)
    assert again.estimated_start == first.estimated_start + timedelta(seconds=900)
    assert again.first_estimate == first.first_estimate, "what the lease was first told is kept"


@pytest.mark.django_db
def test_a_queued_leases_page_shows_the_likely_range_once_enough_leases_have_started(operator, fleet):
    (queued,) = queue_up(operator, 1)
    lease = Lease.objects.get(pk=queued)
    browser = signed_in("vera", "viewer")
    page = browser.get(f"/leases/{queued}/")
    assert page.status_code == 200 and "Likely start" not in page.content.decode(), "no lease waited yet"
    now = timezone.now()
    for i in range(MIN_SAMPLES):
        done = intent(f"done-{i}", now - timedelta(hours=3))
        # Each waited a quarter of the two hours it was estimated to wait.
        Lease.objects.filter(pk=done.pk).update(
            first_estimate=now - timedelta(hours=1),
            first_start=now - timedelta(hours=2, minutes=30),
            state="done",
        )
    body = browser.get(f"/leases/{queued}/").content.decode()
    assert "Likely start" in body and f"the last {MIN_SAMPLES} queued leases" in body
    shown = re.search(r'most likely about <time datetime="([^"]+)"', body)
    assert shown is not None
    expected = timezone.now() + (lease.estimated_start - timezone.now()) / 4
    assert abs(datetime.fromisoformat(shown[1]) - expected) < timedelta(seconds=5)
