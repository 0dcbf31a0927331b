"""Passes name the requests they decided (slotkeeper/planwake.py), and a waiter looks at its row only when a pass
named it: before, every waiter read its lease at every pass."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from leases.lifecycle import LeaseState
from leases.planning import passes, waiting
from slotkeeper import planwake
from tests.leases.conftest import intent


def start_waiter(lease_id: int, since: int, looks: list[str], answer: list) -> threading.Thread:
    """A thread waiting for the request `lease_id` (waiting.await_decision), each of its reads of a lease row in
    `looks`, its answer in `answer`."""

    def waiter() -> None:
        def counted(execute, sql, params, many, context):
            if "leases_lease" in sql:
                looks.append(sql)
            return execute(sql, params, many, context)

        try:
            with connection.execute_wrapper(counted):
                answer.append(waiting.await_decision(lease_id, timezone.now(), since=since))
        finally:
            connection.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    return thread


def test_a_payload_names_the_decided_requests_or_says_it_cannot():
    assert planwake.parse(planwake.payload(7, [3, 41])) == {3, 41}
    assert planwake.parse(planwake.payload(7, [])) == frozenset()
    assert planwake.parse(planwake.payload(7, range(10**6, 10**6 + 2000))) is None  # too long for NOTIFY: "*"
    assert len(planwake.payload(7, range(10**6, 10**6 + 2000))) < 8000
    assert planwake.parse("7") is None  # an older release's payload: the version alone
    assert planwake.parse("7 x,1") is None


def test_named_since_is_true_only_for_a_pass_that_named_the_request_or_named_nothing_readable():
    before = planwake.ticket()
    assert not planwake.named_since(before, 5)
    planwake._bump(frozenset({6}))
    assert not planwake.named_since(before, 5)
    planwake._bump(frozenset({5, 6}))
    assert planwake.named_since(before, 5)
    later = planwake.ticket()
    planwake._bump(None)
    assert planwake.named_since(later, 5)  # unknown: look
    assert not planwake.named_since(planwake.ticket(), 5)
    # A waiter that slept through more passes than are remembered cannot know: it looks.
    old = planwake.ticket()
    for _ in range(300):
        planwake._bump(frozenset())
    assert planwake.named_since(old, 5)


@pytest.mark.django_db(transaction=True)
def test_a_waiter_reads_its_row_only_after_the_pass_that_decided_it(fleet, monkeypatch):
    monkeypatch.setattr(planwake, "FALLBACK_POLL_S", 30.0)  # no look on the fallback poll during the test
    planwake._ensure_listener()  # on PostgreSQL: every pass is heard of from here on
    assert planwake.hears_all()
    since = planwake.ticket()
    lease = intent("waits", timezone.now())
    looks: list[str] = []
    answer: list = []
    waiting._pass_turn.acquire()  # the waiter cannot run a pass itself: it has to be woken
    try:
        thread = start_waiter(lease.pk, since, looks, answer)
        for _ in range(5):  # passes that decided other requests
            planwake._bump(frozenset({lease.pk + 1000}))
            time.sleep(0.02)
        time.sleep(0.2)
        assert looks == [] and thread.is_alive()
        with passes.planning(timezone.now()):
            pass  # decides the request and names it
    finally:
        waiting._pass_turn.release()
    thread.join(20)
    assert not thread.is_alive()
    assert answer and answer[0].pk == lease.pk and answer[0].state != LeaseState.NEW
    assert len(looks) == 1  # the one read that returned the decided row


@pytest.mark.django_db(transaction=True)
def test_a_waiter_that_cannot_hear_every_pass_looks_at_every_wake_up(fleet, monkeypatch):
    """On PostgreSQL before the listener is up, or after its connection was lost, another process's pass goes
    unheard: a waiter then looks whenever it wakes, as it did before passes named their requests."""
    monkeypatch.setattr(planwake, "FALLBACK_POLL_S", 30.0)
    monkeypatch.setattr(planwake, "hears_all", lambda: False)
    since = planwake.ticket()
    lease = intent("waits", timezone.now())
    looks: list[str] = []
    waiting._pass_turn.acquire()
    try:
        thread = start_waiter(lease.pk, since, looks, [])
        time.sleep(0.2)
        first = len(looks)
        assert first == 1  # it looked once, before its first sleep
        for _ in range(3):
            planwake._bump(frozenset({lease.pk + 1000}))
            time.sleep(0.1)
        assert len(looks) == first + 3
        with passes.planning(timezone.now()):
            pass
    finally:
        waiting._pass_turn.release()
    thread.join(20)
    assert not thread.is_alive()
