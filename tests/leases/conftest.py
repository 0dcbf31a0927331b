from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from leases import store
from leases.instances.actions import nodes as node_actions


@pytest.fixture(autouse=True)
def _fresh_scheduler_cache():
    # Tests roll the database back between cases; a scheduler cached in this process must not outlive that.
    store.drop_cache()
    yield
    store.drop_cache()


@pytest.fixture
def fleet(db):
    """Four healthy nodes of 4 cores and 8 GiB, heartbeating now (the placer's checks need fresh health)."""
    nodes = []
    for i in range(1, 5):
        node, _ = fleet_actions.do_register_node(
            None,
            name=f"n{i}",
            cpu_cores=4,
            mem_total_mib=8192,
            disk_total_gib=100,
            capabilities=[],
            now=timezone.now(),
        )
        report = fleet_actions.HealthReport(
            mem_total_mib=8192, mem_used_mib=1000, disk_free_gib=90.0, cpu_pct=1.0, load1=0.1
        )
        nodes.append(node_actions.do_heartbeat(node, report, now=timezone.now()))
    return nodes


def vm(cores=1, mem=1024, disk=0):
    return {"cpu_cores": cores, "mem_mib": mem, "disk_gib": disk}
