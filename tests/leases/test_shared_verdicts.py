"""A pass's reports of the requests it queued or rejected share their verdicts by `Scheduler.shared_key`: every
request with the same key gets the same answer from `explain` while the plan stays as it is (on a fleet large
enough for the lazy host order, with exclusions, barred nodes, group spreads and windows that start now or
later), and the key is None where the answer depends on the request itself."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from django.utils import timezone

from fleet.models import PlacementReport
from leases.planning import passes
from leases.scheduler import LeaseRequest, Scheduler
from leases.scheduling.mapper import LAZY_NODES
from tests.leases.conftest import intent
from tests.leases.test_explain_vectorised import VMS, random_plan


def explained(s: Scheduler, req: LeaseRequest, start: float, end: float, excluded) -> tuple:
    got = s.explain(req, start, end, excluded=excluded)
    c = got.columns
    columns = tuple(
        tuple(getattr(c, name).tolist() if hasattr(getattr(c, name), "tolist") else getattr(c, name))
        for name in ("node", "holds", "code", "dim", "need", "free", "allocatable", "rank", "note")
    )
    return columns, tuple(c.codes), tuple(c.texts), c.chosen, c.blockers, got.total, got.holders


@pytest.mark.parametrize("seed", range(4))
def test_requests_with_one_shared_key_get_the_same_verdicts(seed):
    rng = random.Random(seed)
    s = random_plan(rng, LAZY_NODES + 44)  # the lazy host order (mapper.HostOrder) ranks the nodes
    nodes = list(s.table.nodes)
    excluded = {n: "stale: no heartbeat for 90 s" for n in rng.sample(nodes, 5)}
    barred = tuple((n, "missing_capability: lacks accel.gpu") for n in rng.sample(nodes, 4))
    shapes = [(rng.choice(VMS),) * rng.randint(1, 3) for _ in range(3)]
    groups: dict[tuple, list[tuple[LeaseRequest, float, float]]] = defaultdict(list)
    for k in range(60):
        start = rng.choice([s._now, 3000.0])
        duration = rng.choice([600.0, 1800.0])
        spread = rng.choice([None, None, 1])
        req = LeaseRequest(
            50_000 + k,
            rng.choice(["best_effort", "immediate"]),
            s._now,
            None,
            duration,
            rng.choice(shapes),
            spread=spread,
            taken=((nodes[0], 1),) if spread else (),
            barred=barred if rng.random() < 0.3 else (),
        )
        key = s.shared_key(req, start, start + duration)
        assert key is not None  # a request the plan does not hold, that the mapper never tried
        groups[key].append((req, start, start + duration))
    assert max(len(members) for members in groups.values()) >= 4
    compared = 0
    for members in groups.values():
        first = explained(s, *members[0], excluded)
        for other in members[1:]:
            assert explained(s, *other, excluded) == first
            compared += 1
    assert compared >= 20


def test_the_key_is_none_where_the_answer_depends_on_the_request_itself():
    rng = random.Random(7)
    s = random_plan(rng, LAZY_NODES + 44)
    req = LeaseRequest(60_000, "best_effort", s._now, None, 600.0, (VMS[1],))
    s.propose(req, 3000.0, 3600.0, {})  # the mapper's last order was built for this very request
    assert s.shared_key(req, 3000.0, 3600.0) is None
    assert s.shared_key(req, 3000.0, 4800.0) is not None  # another window: that order is not the one used
    held = next(rec for rec in s.leases.values() if rec.chain())  # a lease with live reservations of its own
    assert s.shared_key(held.request, 3000.0, 3600.0) is None


def test_a_pass_explains_each_shape_and_window_of_what_it_rejects_once(fleet, monkeypatch):
    """Twelve immediate requests of one shape on a fleet with room for four: four run, eight are rejected, and the
    eight rejections' reports come from one explanation; each request still has its own report and outcome."""
    calls = []
    real = Scheduler.explain
    monkeypatch.setattr(
        Scheduler, "explain", lambda self, *a, **k: calls.append(a[0].id) or real(self, *a, **k)
    )
    now = timezone.now()
    leases = [intent(f"same-{i}", now, type="immediate", cores=4) for i in range(12)]
    with passes.planning(now):
        pass
    outcomes = {
        r.subject: r.outcome
        for r in PlacementReport.objects.filter(subject__in=[f"lease:{lease.pk}" for lease in leases])
    }
    assert sorted(outcomes.values()) == ["placed"] * 4 + ["rejected"] * 8
    rejected = [lease.pk for lease in leases if outcomes[f"lease:{lease.pk}"] == "rejected"]
    assert len(set(calls) & set(rejected)) == 1
    stored = {r.verdicts["summary"] for r in PlacementReport.objects.filter(outcome="rejected")}
    assert len(stored) == 1
