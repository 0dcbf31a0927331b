"""When the plan applier runs the queue forecast and what it writes (leases/forecasting.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from leases import forecasting
from leases.actions import advance
from leases.instances.actions import nodes as node_actions
from leases.models import Lease, SchedulerState
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
