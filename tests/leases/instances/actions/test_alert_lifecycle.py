"""Alerts an operator acts on (issue 45): one alert per kind and subject while it is open (counted, not repeated),
resolved by the system with the reason once its cause ends, and none for an answer a client already received."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from leases.alerts import raise_alert
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic
from leases.models import Alert
from slotkeeper.logging import ExpectedAnswersFilter

pytestmark = pytest.mark.django_db


def test_an_alert_raised_again_for_the_same_subject_counts_instead_of_adding_a_row(fleet):
    now = timezone.now()
    first = raise_alert("node_dead", "n1 is dead", now, node=fleet[0])
    again = raise_alert("node_dead", "n1 is dead (seen again)", now + timedelta(seconds=5), node=fleet[0])
    other = raise_alert("node_dead", "n2 is dead", now, node=fleet[1])
    assert again.pk == first.pk and other.pk != first.pk
    first.refresh_from_db()
    assert (first.count, first.last_seen_at, first.message) == (
        2,
        now + timedelta(seconds=5),
        "n1 is dead (seen again)",
    )
    assert Alert.objects.count() == 2


def test_a_node_declared_dead_and_readmitted_leaves_its_alert_resolved_with_the_reason(fleet):
    now = timezone.now()
    node_actions.do_declare_dead(None, fleet[0].pk, reason="PSU failed", now=now)
    alert = Alert.objects.get(kind="node_dead")
    periodic.tick(now)
    assert Alert.objects.get(pk=alert.pk).resolved_at is None, "still dead: still an operator's task"
    fleet_actions.do_readmit(None, fleet[0].pk, reason="PSU replaced", now=now)
    periodic.tick(now + timedelta(seconds=1))
    alert.refresh_from_db()
    assert alert.resolved_at is not None
    assert alert.resolution == "node n1 was re-admitted; it is offline"
    # Dead again later: a new alert, the old one stays resolved.
    node_actions.do_declare_dead(None, fleet[0].pk, reason="PSU failed again", now=now + timedelta(seconds=2))
    assert Alert.objects.filter(kind="node_dead", resolved_at=None).exclude(pk=alert.pk).count() == 1


def test_a_client_error_is_logged_at_info_once_a_minute_per_path_and_a_server_error_stays(rf):
    noted = ExpectedAnswersFilter()

    def record(status: int, path: str, at: float) -> logging.LogRecord:
        r = logging.LogRecord("django.request", logging.WARNING, "", 0, "Conflict: %s", (path,), None)
        r.status_code, r.request, r.created = status, rf.post(path), at
        return r

    first = record(409, "/api/leases/", 1000.0)
    assert noted.filter(first) and first.levelname == "INFO"
    assert not noted.filter(record(409, "/api/leases/", 1030.0))
    assert noted.filter(record(409, "/api/nodes/7/heartbeat", 1030.0))
    assert noted.filter(record(409, "/api/leases/", 1061.0))
    server = logging.LogRecord("django.request", logging.ERROR, "", 0, "Internal Server Error", (), None)
    server.status_code = 500
    assert noted.filter(server) and server.levelname == "ERROR"
