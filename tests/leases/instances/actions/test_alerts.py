"""Resolving an alert by hand: once, with its audit row."""

from __future__ import annotations

import pytest
from django.utils import timezone

from leases.alerts import raise_alert
from leases.instances.actions import alerts
from slotkeeper.domain import DomainError, NotFound
from slotkeeper.models import AuditEntry

pytestmark = pytest.mark.django_db


def test_an_alert_is_resolved_once_and_the_audit_feed_says_who_and_why(db):
    alert = raise_alert("instance_held", "instance 7-1-0 is held", timezone.now())
    alerts.do_resolve_alert(None, alert.pk, now=timezone.now(), reason="node is back")
    alert.refresh_from_db()
    assert alert.resolved_at is not None
    assert AuditEntry.objects.get(action="alert.resolve").reason == "node is back"
    with pytest.raises(DomainError, match="was resolved"):
        alerts.do_resolve_alert(None, alert.pk, now=timezone.now())
    with pytest.raises(NotFound):
        alerts.do_resolve_alert(None, alert.pk + 1, now=timezone.now())
