"""What a queue pass costs on a busy fleet: work that cannot change its answer is not done again for every
queued lease (leases/scheduling/backfill.py). Found sending one lease request at a time to a 1,000-node fleet
with a queue: each request's pass re-listed every reservation ahead, and the usable nodes, for every queued lease
at every instant it tried (150-500 ms of CPU a request at 40-400 queued)."""

from __future__ import annotations

from leases.scheduler import LeaseRequest, Scheduler, SchedulerConfig
from leases.slottable import Res

T = 1.8e9
NODE = Res(400, 16384, 100, 0, 0)


def busy(nodes: int = 6) -> Scheduler:
    """Every node full for an hour (one immediate lease each), and three best-effort leases of three whole-node
    VMs queued while four of the six nodes are draining: with two usable nodes none fits, now or later."""
    s = Scheduler({n: NODE for n in range(1, nodes + 1)}, SchedulerConfig())
    for n in range(1, nodes + 1):
        s.submit(LeaseRequest(n, "immediate", T, None, 3600 + 60 * n, (NODE,)), T)
    for i in (101, 102, 103):
        s.submit(LeaseRequest(i, "best_effort", T, None, 600, (NODE,) * 3), T, DRAINING, defer=True)
    return s


DRAINING = {n: "draining" for n in (1, 2, 3, 4)}


def test_one_queue_pass_lists_the_instants_ahead_once_not_once_per_queued_lease(monkeypatch):
    s = busy()
    listed = []
    real = type(s)._future_points
    monkeypatch.setattr(type(s), "_future_points", lambda self, now: listed.append(now) or real(self, now))
    s.run_queue(T + 1)
    assert s.queue == [101, 102, 103]
    assert listed == [T + 1], (
        "each queued lease tried the instants ahead, listed once: no commit changed them"
    )


def test_a_pass_with_every_node_excluded_tries_no_queued_lease(monkeypatch):
    s = busy()
    tried = []
    real = type(s)._plan_asap
    monkeypatch.setattr(
        type(s), "_plan_asap", lambda self, rec, *a, **k: tried.append(rec) or real(self, rec, *a, **k)
    )
    s.advance(T + 5, {n: "stale: its health report is too old" for n in s.table.nodes})
    assert tried == [] and s.queue == [101, 102, 103]
    s.advance(T + 6, DRAINING)
    assert len(tried) == 3, "with nodes usable again the queue is tried as before"


def test_the_usable_nodes_are_listed_once_per_set_of_exclusions():
    s = busy()
    s.use_exclusions({2: "draining"})
    first = s._usable_nodes()
    assert list(first) == [1, 3, 4, 5, 6]
    assert s._usable_nodes() is first
    s.use_exclusions({2: "draining", 4: "dead"})
    assert list(s._usable_nodes()) == [1, 3, 5, 6]
