"""Restarts: each decision under the lease's restart policy (leases/instances/rules.py), with its history row, and
the periodic step that restarts what waited out its backoff. `decide_and_restart` runs inside the caller's
transaction (the heartbeat that saw the instance exit); `supervise` claims each due row itself.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from leases.alerts import raise_alert
from leases.instance_rows import next_generation, step
from leases.instances.models import RestartRecord
from leases.instances.rules import RestartPolicy, decide_restart
from leases.lifecycle import InstanceState, instance_id
from leases.models import Instance, Lease

_I = InstanceState


def restart_policy(lease: Lease) -> RestartPolicy:
    return RestartPolicy(**(lease.restart_policy or {}))


def decide_and_restart(inst: Instance, now: datetime, why: str) -> RestartRecord:
    previous = [r.at.timestamp() for r in inst.restarts.filter(decision="restart")]
    decision = decide_restart(restart_policy(inst.lease), previous, now.timestamp())
    next_at = datetime.fromtimestamp(decision.not_before, now.tzinfo) if decision.not_before else None
    record = RestartRecord.objects.create(
        instance=inst,
        at=now,
        attempt=decision.attempt,
        reason=why,
        decision=decision.action,
        next_eligible_at=next_at,
        explanation=decision.reason,
    )
    if decision.action == "exhausted":
        step(inst, _I.FAILED, now, decision.reason)
        inst.desired_state = "stopped"
        inst.save(update_fields=["desired_state"])
        raise_alert(
            "restarts_exhausted", f"instance {inst.iid} failed: {decision.reason}", now, instance=inst
        )
    elif decision.action == "wait":
        step(inst, _I.RESTARTING, now, decision.reason)
        inst.restart_not_before = next_at
        inst.save(update_fields=["restart_not_before"])
    else:
        restart_now(inst, now, decision.reason)
    return record


def restart_now(inst: Instance, now: datetime, reason: str) -> None:
    """A new generation on the same node: the agent sees a new id and starts it (it never reruns a generation)."""
    step(inst, _I.RESTARTING, now, reason)
    inst.generation = next_generation(inst.lease_id, inst.vnode)
    inst.iid = instance_id(inst.lease_id, inst.vnode, inst.generation)
    inst.restart_not_before = None
    inst.save(update_fields=["generation", "iid", "restart_not_before"])


def supervise(now: datetime) -> int:
    """Restarts whose backoff has passed go now (the periodic work). Claims each row with a conditional update so
    two ticks never restart the same instance twice."""
    due = Instance.objects.filter(state=_I.RESTARTING, restart_not_before__lte=now).select_related("lease")
    count = 0
    for inst in due:
        with transaction.atomic():
            claimed = Instance.objects.filter(
                pk=inst.pk, state=_I.RESTARTING, restart_not_before=inst.restart_not_before
            ).update(restart_not_before=None)
            if not claimed:
                continue
            RestartRecord.objects.create(
                instance=inst,
                at=now,
                attempt=inst.restarts.filter(decision="restart").count() + 1,
                reason="backoff passed",
                decision="restart",
                explanation="its backoff has passed",
            )
            restart_now(inst, now, "backoff passed")
            count += 1
    return count
