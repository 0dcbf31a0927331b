"""What a node's agent says it runs, ingested inside the heartbeat's transaction (leases/instances/actions/
nodes.py composes the two): running confirms, an exit or a missed report makes the instance unhealthy and asks the
restart policy, and an instance the agent no longer has is unloaded when it should be.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from fleet.models import Node
from leases.instance_rows import LIVE, ON_NODE, step
from leases.instances.actions.restarts import decide_and_restart
from leases.lifecycle import InstanceState
from leases.models import Instance

_I = InstanceState


def ingest_reports(node: Node, reports: Sequence[dict], now: datetime) -> None:
    """What the node's agent says it runs: running confirms, an exit or a missed report makes the instance
    unhealthy and asks the restart policy, and an instance the agent no longer has is unloaded when it should be."""
    by_id = {r["id"]: r for r in reports}
    # Locked, in id order, and read under the lock: a cancel or an approval that changes the same rows either
    # committed before (and this sees its desired_state) or waits for this heartbeat. Read without the lock, a
    # cancel that committed meanwhile was overwritten, leaving instances running with desired_state=stopped.
    instances = list(
        Instance.objects.select_for_update(of=("self",))
        .select_related("lease")
        .filter(node=node, state__in=ON_NODE)
        .exclude(state=_I.LOST)
        .order_by("id")
    )
    for inst in instances:
        report = by_id.get(inst.iid)
        status = report["status"] if report else None
        if report:
            _keep_report(inst, report)
        if inst.desired_state == "running" and inst.state in LIVE:
            _reconcile_running(inst, status, report, now)
        elif inst.desired_state == "stopped" and inst.state in (_I.RUNNING, _I.UNHEALTHY, _I.RESTARTING):
            # Told to stop but still recorded as running (a row left so by an earlier race): stopping, so the agent
            # is told to stop it and the placer stops counting it once it is gone.
            step(inst, _I.STOPPING, now, "desired state is stopped")
            if status in (None, "stopped", "exited", "failed"):
                _confirm_gone(inst, now)
        elif status in (None, "stopped", "exited", "failed"):
            _confirm_gone(inst, now)


def _keep_report(inst: Instance, report: dict) -> None:
    fields = []
    if report.get("exit_code") is not None:
        inst.last_exit_code = report["exit_code"]
        fields.append("last_exit_code")
    if report.get("log_tail"):
        inst.log_tail = report["log_tail"][-50:]
        fields.append("log_tail")
    if report.get("detail"):
        inst.detail = report["detail"][:2000]
        fields.append("detail")
    if fields:
        inst.save(update_fields=fields)


def _reconcile_running(inst: Instance, status: str | None, report: dict | None, now: datetime) -> None:
    if status == "running":
        if inst.state != _I.RUNNING:
            step(inst, _I.RUNNING, now, "agent reports it running")
        return
    if status in ("exited", "failed"):
        why = f"agent reports it {status}"
        if report and report.get("exit_code") is not None:
            why += f" with exit code {report['exit_code']}"
        detail = (report or {}).get("detail") or ""
        if detail and not detail.startswith("exit code"):  # the agent's default detail repeats the code
            why += f": {detail[:200]}"
        _unhealthy(inst, now, why)
    elif status is None and inst.state == _I.RUNNING:
        _unhealthy(inst, now, "missing from the agent's report")


def _unhealthy(inst: Instance, now: datetime, why: str) -> None:
    if inst.state == _I.RESTARTING and inst.restart_not_before is not None:
        return  # waiting for its backoff: the old generation's exit is old news
    if inst.state != _I.UNHEALTHY and not step(inst, _I.UNHEALTHY, now, why):
        return
    decide_and_restart(inst, now, why)


def _confirm_gone(inst: Instance, now: datetime) -> None:
    if inst.state == _I.STOPPING:
        step(inst, _I.STOPPED, now, "agent stopped it")
    if inst.state in (_I.STOPPED, _I.FINISHED, _I.REVOKED, _I.RESCHEDULED, _I.FAILED):
        step(inst, _I.UNLOADED, now, "agent no longer runs it")
