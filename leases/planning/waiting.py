"""A lease request's waiter (group commit): `await_decision` returns once a pass has decided the request, which
this caller runs itself when the plan lock is free, or otherwise sleeps until a pass commits (slotkeeper/planwake.py)
and looks again; every wait is bounded."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from leases import reads
from leases.lifecycle import LeaseState
from leases.models import Lease
from leases.planning.passes import LockTaken, planning
from slotkeeper import planlock, planwake

# Threads of one process take turns at running a pass for the waiting requests; the others wait to be woken.
_pass_turn = threading.Lock()


def await_decision(lease_id: int, now: datetime, *, since: int | None = None) -> Lease:
    """Returns the lease row once a planning pass has decided the request `lease_id` (stored in state `new`),
    read as that pass left it, in the same query that finds it decided: whoever holds
    the plan lock plans every waiting request, so this caller either runs that pass itself (the lock was free) or
    sleeps until a pass commits (planwake) and looks again. Bounded: when no pass has committed for
    PLAN_LOCK_TIMEOUT_S it waits for the lock as every other writer does, and if even that times out it withdraws
    the request and raises PlanBusy (503). While passes keep committing it keeps waiting: intents are planned
    oldest first, so its turn comes within (requests ahead / MAX_BATCH) passes.

    It looks at its row only when it may have been decided: first (unless `since`, a planwake ticket taken before
    the request was stored, says no pass has named it since), then after a pass that named it (planwake), after
    a sleep that no pass ended (the fallback poll) and once the bound is reached; at every wake-up while this
    process cannot hear every pass (planwake.hears_all)."""
    if transaction.get_connection().in_atomic_block:
        # Inside a caller's transaction the intent is invisible to other processes: plan it here, in it.
        with planning(now):
            pass
        return Lease.objects.get(pk=lease_id)
    began = time.monotonic()
    deadline = began + planlock.timeout_s()
    look = since is None or not planwake.hears_all() or planwake.named_since(since, lease_id)
    seen = since
    while True:
        ticket = planwake.ticket()
        # Without the listener (not started yet, or its connection lost) another process's pass goes unheard:
        # look at every wake-up, as before passes named their requests.
        trusted = planwake.hears_all()
        if (
            look
            or seen is None
            or not trusted
            or planwake.named_since(seen, lease_id)
            or time.monotonic() >= deadline
        ):
            lease = reads.lease_row(lease_id)  # a request deleted meanwhile raises, as before it was decided
            if lease.state != LeaseState.NEW:
                return lease
        look, seen = False, ticket
        # A pass run after a wait plans at the time it runs, not at the time the request came in.
        at = now + timedelta(seconds=time.monotonic() - began) if time.monotonic() - began > 0.05 else now
        if time.monotonic() >= deadline:
            try:
                with planning(at):
                    continue
            except planlock.PlanBusy:
                # Answered 503 "try again", the request must have changed nothing: withdraw the intent, unless
                # a pass has taken it meanwhile (passes lock the intents they plan, so this waits for that one).
                if Lease.objects.filter(pk=lease_id, state=LeaseState.NEW).delete()[0]:
                    raise
                look = True
                continue
        if _try_pass(at):
            continue
        if getattr(settings, "DB_POOL", False):
            # A sleeping waiter gives its pooled connection back: a burst of waiters would otherwise hold every
            # connection of the pool while the pass that would wake them waits for one.
            transaction.get_connection().close()
        if planwake.wait(ticket, min(planwake.FALLBACK_POLL_S, max(0.0, deadline - time.monotonic()))):
            deadline = time.monotonic() + planlock.timeout_s()  # a pass committed: the queue is moving
        else:
            look = True  # no pass was heard of: look anyway (a lost notification, a deleted request)


def _try_pass(now: datetime) -> bool:
    if not _pass_turn.acquire(blocking=False):
        return False
    try:
        with planning(now, try_lock=True):
            pass
        return True
    except LockTaken:
        return False
    finally:
        _pass_turn.release()
