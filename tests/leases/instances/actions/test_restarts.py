"""Restarts: bounded, with backoff, then failed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from leases.instances.actions import periodic
from leases.instances.models import RestartRecord
from leases.models import Alert
from tests.leases.instances.helpers import report_all, run_lease

pytestmark = pytest.mark.django_db


def test_a_crash_looping_instance_is_restarted_with_backoff_then_failed(fleet):
    now = timezone.now()
    _lease, [inst] = run_lease(now)
    report_all(now)
    t = now
    for _ in range(8):
        inst.refresh_from_db()
        if inst.state == "failed":
            break
        t += timedelta(seconds=0.5)
        periodic.tick(t)  # due restarts go
        inst.refresh_from_db()
        report_all(t, **{inst.iid: "exited"})
    inst.refresh_from_db()
    assert inst.state == "failed"
    history = list(RestartRecord.objects.filter(instance=inst).values_list("attempt", "decision"))
    # Attempt 1 goes at once, attempt 2 waits 1 s, attempt 3 waits 2 s; the fourth failure finds 3 restarts in the
    # window and the policy exhausted.
    assert [d for _, d in history if d == "restart"] == ["restart"] * 3
    assert history[-1][1] == "exhausted"
    assert any(d == "wait" for _, d in history)
    assert inst.generation == 3  # one new generation per restart: the agent never reruns a generation
    assert Alert.objects.filter(kind="restarts_exhausted", instance=inst).exists()
    waits = RestartRecord.objects.filter(instance=inst, decision="wait").order_by("at")
    assert all(w.next_eligible_at is not None for w in waits)
