"""A lease request whose `submit` raises part-way through a planning pass is answered alone: the scheduler is left
exactly as it was before that submit (the leases it preempted, the reservations it added, its journal), the rest of
the batch is planned and committed, and the next pass schedules as usual. Before, the half-made changes stayed in
the journal of a lease the pass had forgotten, `apply` raised KeyError, the pass rolled back with the request still
`new`, and every later pass failed the same way: scheduling stopped for good."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import placement
from leases import actions
from leases.lifecycle import LeaseState
from leases.models import Alert, Lease, Reservation, SchedulerState
from leases.planning import intents, passes, restore
from leases.scheduler import Scheduler
from tests.leases.conftest import count_loads, intent, picture, unreadable, vm
from tests.leases.invariants import overcommitted_instants

# Real commits: the scheduler is cached only once its pass commits, and these tests compare the cached one.
pytestmark = pytest.mark.django_db(transaction=True)


def cached_scheduler() -> Scheduler:
    cached = restore._cache.value
    assert cached is not None, "the pass committed, so its scheduler is cached"
    return cached.scheduler


def reloaded_scheduler(now) -> Scheduler:
    return restore.load(placement.states_from_rows(now), SchedulerState.objects.get(pk=1).next_rid)


@pytest.fixture
def busy(fleet):
    """Three of the four nodes run one best-effort lease (a whole node per vnode); the fourth is free."""
    now = timezone.now()
    victim = actions.do_submit_lease(
        None,
        actions.LeaseSpec(name="victim", type="best_effort", duration_s=7200, vnodes=[vm(cores=4)] * 3),
        now=now,
    ).lease
    assert victim.state == LeaseState.ACTIVE
    return now, victim


def inject_fault_after_commit(monkeypatch, lease_id: int, seen: list) -> None:
    """`_commit` of `lease_id` does its work (the preemptions before it are done too), then raises: the scheduler
    is left half-changed, as any defect deep in a submit would leave it."""
    real = Scheduler._commit

    def commit_then_fail(self, rec, plan, now):
        real(self, rec, plan, now)
        if rec.request.id == lease_id:
            seen.append(list(plan.preempt))
            raise RuntimeError("injected fault after the reservation was made")

    monkeypatch.setattr(Scheduler, "_commit", commit_then_fail)


def test_a_submit_that_raises_after_preempting_is_answered_alone_and_undone(busy, monkeypatch):
    now, victim = busy
    before = {r.rid: (r.status, r.start, r.end) for r in Reservation.objects.filter(lease=victim)}
    later = now + timedelta(seconds=1)
    # Oldest first: one request before the bad one, the bad one, one after it.
    first = intent("first", later, type="immediate", cores=2)
    # Three whole nodes from 30 minutes on, for an hour: only by preempting the victim (n4 is half taken by
    # `first`), so the fault strikes after the victim was suspended or requeued and the reservation placed.
    bad = intent(
        "bad", later, type="advance_reservation", cores=4, count=3, start=later + timedelta(minutes=30)
    )
    last = intent("last", later, type="best_effort", cores=2)
    seen: list = []
    inject_fault_after_commit(monkeypatch, bad.pk, seen)

    with passes.planning(later):
        pass

    assert seen == [[victim.pk]], "the fault must strike after the submit preempted the victim"
    bad.refresh_from_db()
    first.refresh_from_db()
    last.refresh_from_db()
    victim.refresh_from_db()
    # The bad request is answered: rejected with the reason, an alert, never planned again.
    assert bad.state == LeaseState.REJECTED
    assert "RuntimeError: injected fault" in bad.message
    assert Alert.objects.filter(kind="failed_placement", lease=bad).exists()
    assert not Reservation.objects.filter(lease=bad).exists()
    # The rest of the batch is decided and committed.
    assert first.state == LeaseState.ACTIVE
    assert last.state == LeaseState.ACTIVE
    # The victim was never preempted: the submit that preempted it is undone.
    assert victim.state == LeaseState.ACTIVE
    assert {r.rid: (r.status, r.start, r.end) for r in Reservation.objects.filter(lease=victim)} == before
    assert overcommitted_instants() == []
    # The scheduler kept in memory is the one the database describes.
    assert picture(cached_scheduler()) == picture(reloaded_scheduler(later))

    # And the next pass schedules as usual, with the fault gone or not.
    monkeypatch.undo()
    after = actions.do_submit_lease(
        None,
        actions.LeaseSpec(
            name="after", type="advance_reservation", duration_s=600, vnodes=[vm(cores=4)] * 3,
            start=later + timedelta(minutes=30),
        ),
        now=later + timedelta(seconds=1),
    )  # fmt: skip
    assert after.lease.state == LeaseState.READY
    assert picture(cached_scheduler()) == picture(reloaded_scheduler(later + timedelta(seconds=1)))
    assert overcommitted_instants() == []


def test_a_request_whose_submit_always_raises_does_not_stop_later_passes(busy, monkeypatch):
    # The fault stays: every pass would meet it again if the request were left `new`.
    now, _ = busy
    later = now + timedelta(seconds=1)
    bad = intent(
        "bad", later, type="advance_reservation", cores=4, count=3, start=later + timedelta(minutes=30)
    )
    inject_fault_after_commit(monkeypatch, bad.pk, [])
    with passes.planning(later):
        pass
    bad.refresh_from_db()
    assert bad.state == LeaseState.REJECTED
    for seconds in (2, 3):
        placed = actions.do_submit_lease(
            None,
            actions.LeaseSpec(name=f"next{seconds}", type="immediate", duration_s=600, vnodes=[vm(cores=1)]),
            now=now + timedelta(seconds=seconds),
        )
        assert placed.lease.state == LeaseState.ACTIVE
    assert picture(cached_scheduler()) == picture(reloaded_scheduler(now + timedelta(seconds=3)))
    assert overcommitted_instants() == []


def test_a_submit_that_raises_before_changing_anything_costs_no_reload(fleet, monkeypatch):
    # A request whose records cannot even be built (request_of raises) touched nothing: the pass goes on with the
    # scheduler it has.
    now = timezone.now()
    bad, good = intent("bad", now), intent("good", now)
    unreadable(monkeypatch, "bad")
    loads = count_loads(monkeypatch)
    with passes.planning(now):
        pass
    cached = cached_scheduler()
    with passes.planning(now):
        pass
    bad.refresh_from_db()
    good.refresh_from_db()
    assert bad.state == LeaseState.REJECTED and good.state == LeaseState.ACTIVE
    assert len(loads) == 1  # the first pass's load only
    assert cached_scheduler() is cached


def test_a_defect_that_fails_every_submit_costs_a_pass_a_few_restarts_not_one_per_request(fleet, monkeypatch):
    # Each restart reloads the scheduler and submits the batch's earlier requests again: one per request of a
    # 500-request batch would hold the plan lock for minutes. Past MAX_RESTARTS the rest wait for the next pass.
    now = timezone.now()
    waiting = [intent(f"w{i}", now) for i in range(intents.MAX_RESTARTS + 2)]

    def broken(self, req, now, excluded=None, *, defer=False):
        raise RuntimeError("every submit fails")

    monkeypatch.setattr(Scheduler, "submit", broken)
    loads = count_loads(monkeypatch)
    with passes.planning(now):
        pass
    states = [Lease.objects.get(pk=w.pk).state for w in waiting]
    assert states == [LeaseState.REJECTED] * intents.MAX_RESTARTS + [LeaseState.NEW] * 2
    assert len(loads) == 1 + intents.MAX_RESTARTS  # the pass's own load, then one per restart
    assert Alert.objects.filter(kind="failed_placement").count() == intents.MAX_RESTARTS
    # The next pass answers the rest; once the defect is gone, requests are placed again.
    with passes.planning(now):
        pass
    assert set(Lease.objects.filter(pk__in=[w.pk for w in waiting]).values_list("state", flat=True)) == {
        LeaseState.REJECTED
    }
    monkeypatch.undo()
    placed = actions.do_submit_lease(
        None, actions.LeaseSpec(name="fine", type="immediate", duration_s=600, vnodes=[vm(cores=1)]), now=now
    )
    assert placed.lease.state == LeaseState.ACTIVE
    assert picture(cached_scheduler()) == picture(reloaded_scheduler(now))
    assert overcommitted_instants() == []


def test_a_cancel_that_raises_part_way_rolls_the_whole_pass_back_and_drops_the_cached_scheduler(
    busy, monkeypatch
):
    # Not the submit's failure mode: a cancel's exception leaves `planning`, so its transaction rolls back and the
    # half-changed scheduler is never cached; nothing stays `new` to fail the next pass. Kept as a guard.
    now, victim = busy
    later = now + timedelta(seconds=1)

    def broken(self, now):
        raise RuntimeError("injected fault after the lease's VMs were stopped")

    monkeypatch.setattr(Scheduler, "_reevaluate", broken)
    with pytest.raises(RuntimeError):
        actions.do_cancel_lease(None, victim.pk, now=later)
    assert restore._cache.value is None
    victim.refresh_from_db()
    assert victim.state == LeaseState.ACTIVE
    monkeypatch.undo()
    placed = actions.do_submit_lease(
        None,
        actions.LeaseSpec(name="next", type="immediate", duration_s=600, vnodes=[vm(cores=1)]),
        now=later,
    )
    assert placed.lease.state == LeaseState.ACTIVE
    assert picture(cached_scheduler()) == picture(reloaded_scheduler(later))
    assert overcommitted_instants() == []
