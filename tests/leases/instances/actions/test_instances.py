"""An operator's transition of one instance: checked by the state machine, with its history and audit rows."""

from __future__ import annotations

import pytest
from django.utils import timezone

from leases.instances.actions import instances
from leases.models import InstanceEvent
from slotkeeper.domain import DomainError, NotFound
from slotkeeper.models import AuditEntry
from tests.leases.instances.helpers import run_lease

pytestmark = pytest.mark.django_db


def test_stopping_an_instance_tells_the_agent_to_stop_it_and_is_audited(fleet):
    _lease, [inst] = run_lease(timezone.now())
    changed = instances.do_transition_instance(
        None, inst.iid, "revoked", now=timezone.now(), reason="bad image"
    )
    assert (changed.state, changed.desired_state) == ("revoked", "stopped")
    assert InstanceEvent.objects.filter(instance=inst, to_state="revoked", reason="bad image").exists()
    entry = AuditEntry.objects.get(action="instance.transition")
    assert (entry.target_id, entry.details) == (str(inst.pk), {"to": "revoked"})


def test_an_illegal_step_and_an_unknown_instance_are_refused_without_a_trace(fleet):
    _lease, [inst] = run_lease(timezone.now())
    with pytest.raises(DomainError, match="placed"):
        instances.do_transition_instance(None, inst.iid, "finished", now=timezone.now())
    with pytest.raises(NotFound):
        instances.do_transition_instance(None, "99-1-0", "revoked", now=timezone.now())
    assert not AuditEntry.objects.filter(action="instance.transition").exists()
