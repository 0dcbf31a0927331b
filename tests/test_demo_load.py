"""The demo's load follows the fleet (issue 45): more leases when little is committed, none but the odd reservation
when much is, never a long queue; and the operator's day comes round and resolves itself."""

from __future__ import annotations

import random

import pytest

from slotkeeper import demo_load
from slotkeeper.demo_load import HIGH, LOW, MAX_QUEUE, Day, Look, load_step


def submitted(share: float, queued: int = 0, rounds: int = 400) -> list[dict]:
    rng = random.Random(7)
    look = Look(committed_cores=share * 100, allocatable_cores=100, queued=queued)
    return [b for n in range(rounds) for b in load_step(look, rng, n)]


def test_below_the_target_it_submits_more_than_within_and_above_it_submits_only_reservations():
    low, mid, high = submitted(LOW - 0.2), submitted((LOW + HIGH) / 2), submitted(HIGH + 0.05)
    assert len(low) > len(mid) > len(high)
    assert {b["type"] for b in high} == {"advance_reservation"}
    assert 0 < len(high) < 0.25 * len(mid)


def test_no_best_effort_lease_is_added_to_a_full_queue():
    assert not [b for b in submitted(0.2, queued=MAX_QUEUE) if b["type"] == "best_effort"]
    assert [b for b in submitted(0.2, queued=MAX_QUEUE - 1) if b["type"] == "best_effort"]


def test_immediate_leases_only_while_they_are_likely_to_fit():
    assert not [b for b in submitted(0.8) if b["type"] == "immediate"]
    assert [b for b in submitted(0.3) if b["type"] == "immediate"]


@pytest.mark.parametrize("share", [0.0, 0.5, 0.9])
def test_every_body_is_a_valid_lease_request(share, monkeypatch):
    from django.utils import timezone

    from leases.api import serializers
    from leases.api.serializers import LeaseCreateSerializer

    # The field rules only: the fleet the body would be checked against is the demo's (a database), not here.
    monkeypatch.setattr(serializers, "check_against_fleet", lambda attrs: None)

    for body in submitted(share, rounds=50):
        ser = LeaseCreateSerializer(data=body, context={"now": timezone.now()})
        assert ser.is_valid(), (body, ser.errors)


def test_the_operators_day_loses_a_node_then_approves_and_readmits_and_drains_then_undrains():
    day = Day(started=0.0)
    assert day.due(demo_load.FIRST_LOSS_S - 1) == []
    assert day.due(demo_load.FIRST_LOSS_S) == [("lose", None)]
    day.after_loss(demo_load.FIRST_LOSS_S, 7)
    at = demo_load.FIRST_LOSS_S + demo_load.APPROVE_AFTER_S
    assert day.due(at) == [("approve", 7)]
    assert day.due(demo_load.FIRST_LOSS_S + demo_load.READMIT_AFTER_S) == [("readmit", 7)]
    assert day.due(demo_load.FIRST_DRAIN_S) == [("drain", None)]
    day.after_drain(demo_load.FIRST_DRAIN_S, 3)
    assert day.due(demo_load.FIRST_DRAIN_S + demo_load.UNDRAIN_AFTER_S) == [("undrain", 3)]
    # And again, every so often.
    assert ("lose", None) in day.due(demo_load.FIRST_LOSS_S + demo_load.LOSS_EVERY_S)


def test_the_demo_does_not_show_the_fencing_it_caused_but_shows_any_other():
    import logging

    from slotkeeper.management.commands.demo import DemoFencing

    def record(error: str) -> logging.LogRecord:
        r = logging.LogRecord("slotkeeper.agent", logging.ERROR, __file__, 1, "node-fenced", (), None)
        r.fields = {"node": 3, "error": error}
        return r

    ours = record(
        "node small-02 was declared dead (demo: power supply failed (the demo re-admits it)) and is fenced"
    )
    real = record("node small-02 was declared dead (silent for 120 s) and is fenced")
    assert DemoFencing().filter(ours) is False
    assert DemoFencing().filter(real) is True
