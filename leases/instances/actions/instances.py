"""An operator moving one instance by hand (the API's transition): one transaction, checked by the instance state
machine, with its history row, its audit row and its event after commit."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from leases.instance_rows import step
from leases.lifecycle import IllegalTransition, InstanceState, instance_transition
from leases.models import Instance
from slotkeeper import audit
from slotkeeper.domain import DomainError, NotFound

# Asking for one of these also tells the agent to stop it.
STOPPING = (InstanceState.STOPPING, InstanceState.REVOKED, InstanceState.STOPPED)


def do_transition_instance(actor, iid: str, target: str, *, now: datetime, reason: str = "") -> Instance:
    with transaction.atomic():
        inst = Instance.objects.select_for_update().filter(iid=iid).first()
        if inst is None:
            raise NotFound(f"instance {iid} does not exist")
        try:
            instance_transition(inst.state, target, ident=inst.iid)
        except IllegalTransition as exc:
            raise DomainError(str(exc)) from None
        step(inst, InstanceState(target), now, reason or f"requested by {audit.actor_label(actor)}")
        if target in STOPPING:
            inst.desired_state = "stopped"
            inst.save(update_fields=["desired_state"])
        audit.record(
            at=now,
            actor=actor,
            action="instance.transition",
            target=inst,
            reason=reason,
            details={"to": target},
        )
    return inst
