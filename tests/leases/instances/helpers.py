"""Helpers shared by the instance lifecycle tests (moved from tests/leases/test_instances.py)."""

from __future__ import annotations

from fleet import actions as fleet_actions
from fleet.models import Node
from leases import actions, instance_rows
from leases.instances.actions import nodes as node_actions
from leases.models import Instance
from tests.leases.conftest import vm


def healthy(node, now, instances=()):
    node = Node.objects.get(pk=node.pk)
    report = fleet_actions.HealthReport(node.mem_total_mib, 1000, 90.0, 1.0, 0.1, tuple(instances))
    return node_actions.do_heartbeat(node, report, now=now)


def run_lease(now, *, vnodes=1, mem=1024, name="job", **policy) -> tuple:
    spec = actions.LeaseSpec(name=name, type="immediate", duration_s=3600, vnodes=[vm(mem=mem)] * vnodes)
    result = actions.do_submit_lease(None, spec, now=now)
    lease = result.lease
    if policy:
        for key, value in policy.items():
            setattr(lease, key, value)
        lease.save(update_fields=list(policy))
    return lease, list(Instance.objects.filter(lease=lease).order_by("vnode"))


def report_all(now, **status_by_iid):
    """Every node's agent reports what it runs: all placed instances running unless told otherwise."""
    for node in Node.objects.exclude(status="dead"):
        reports = []
        for inst in Instance.objects.filter(node=node, state__in=instance_rows.LIVE, desired_state="running"):
            status = status_by_iid.get(inst.iid, "running")
            if status != "absent":
                reports.append(
                    {"id": inst.iid, "status": status, "exit_code": 3 if status == "exited" else None}
                )
        healthy(node, now, reports)
