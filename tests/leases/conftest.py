from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.nodestate import BASELINE_FLOOR_MIB, HOST_RESERVE_MIB
from leases.instances.actions import nodes as node_actions
from leases.lifecycle import TERMINAL_LEASE_STATES
from leases.planning import intents, restore
from leases.scheduler import Scheduler


@pytest.fixture(autouse=True)
def _fresh_scheduler_cache():
    # Tests roll the database back between cases; a scheduler cached in this process must not outlive that.
    restore.drop_cache()
    yield
    restore.drop_cache()


# Declared so that 8 GiB is allocatable (docs/capacity.md).
DECLARED_MIB = 8192 + HOST_RESERVE_MIB + BASELINE_FLOOR_MIB


@pytest.fixture
def fleet(db):
    """Four healthy nodes of 4 cores and 8 GiB allocatable (14 GiB declared, less the 4 GiB host reserve and the
    2 GiB baseline floor), heartbeating now (the placer's checks need fresh health)."""
    nodes = []
    for i in range(1, 5):
        node, _ = fleet_actions.do_register_node(
            None,
            name=f"n{i}",
            cpu_cores=4,
            mem_total_mib=DECLARED_MIB,
            disk_total_gib=100,
            capabilities=[],
            now=timezone.now(),
        )
        report = fleet_actions.HealthReport(
            mem_total_mib=DECLARED_MIB, mem_used_mib=1000, disk_free_gib=90.0, cpu_pct=1.0, load1=0.1
        )
        nodes.append(node_actions.do_heartbeat(node, report, now=timezone.now()))
    return nodes


def vm(cores=1, mem=1024, disk=0):
    return {"cpu_cores": cores, "mem_mib": mem, "disk_gib": disk}


def intent(name: str, now, *, type="best_effort", cores=1, count=1, start=None):
    """A stored lease request waiting for a pass (state `new`), as do_submit_lease stores it before it waits."""
    from leases.models import Lease

    return Lease.objects.create(
        name=name,
        type=type,
        submitted_at=now,
        requested_start=start,
        duration_s=3600,
        vnodes=[vm(cores=cores)] * count,
    )


def unreadable(monkeypatch, name: str) -> None:
    """The lease called `name` cannot even be turned into a scheduler request: `request_of` raises for it where a
    pass submits the waiting requests (leases/planning/intents.py)."""
    real = intents.request_of

    def request_of(lease, *args):
        if lease.name == name:
            raise ValueError("a vnode of no size")
        return real(lease, *args)

    monkeypatch.setattr(intents, "request_of", request_of)


def count_loads(monkeypatch) -> list:
    """A list that grows by one each time a pass loads a scheduler from the database: when it finds no current
    one in the cache (leases/planning/restore.py), and when it restarts its batch (leases/planning/intents.py)."""
    loads: list = []
    real = restore.load

    def counted(*a):
        loads.append(1)
        return real(*a)

    monkeypatch.setattr(restore, "load", counted)
    monkeypatch.setattr(intents, "load", counted)
    return loads


def picture(sched: Scheduler) -> dict:
    """What a scheduler holds that planning depends on, in plain values: every unfinished lease with its state and
    reservations, the slot table's rows, the queue and the next reservation id. Two schedulers that agree here
    plan the same."""
    done = {s.value for s in TERMINAL_LEASE_STATES}
    leases = {
        lid: (
            str(rec.state),
            rec.in_future,
            sorted(
                (r.rid, r.kind, r.start, r.end, r.status, tuple(sorted(r.nodes.items())))
                for r in rec.reservations
            ),
        )
        for lid, rec in sched.leases.items()
        if str(rec.state) not in done
    }
    rows = sorted(
        (row.rid, row.lease_id, row.kind, row.start, row.end, tuple(sorted(row.alloc.items())))
        for row in sched.table.reservations()
    )
    return {"leases": leases, "rows": rows, "queue": list(sched.queue), "next_rid": sched.next_rid}
