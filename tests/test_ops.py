"""Operability endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import healthy

pytestmark = pytest.mark.django_db


def test_healthz_answers_without_any_dependency_even_for_an_unknown_host():
    response = Client(HTTP_HOST="10.1.2.3:8000").get("/healthz")
    assert (response.status_code, response.content) == (200, b"ok")


def test_readyz_checks_the_database_and_migrations():
    response = Client().get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["ready"] is True
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["migrations"] == "ok"


def test_metrics_count_heartbeats_placements_nodes_and_the_queue(register_node, operator):
    node, agent = register_node("tank")
    agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json")
    operator.post("/api/placement/preview", {"mem_mib": 1024}, format="json")
    text = Client().get("/metrics").content.decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines['slotkeeper_nodes{status="online"}']) == 1
    assert float(lines["slotkeeper_heartbeats_total"]) >= 1
    assert float(lines['slotkeeper_placements_total{kind="preview",outcome="placed"}']) >= 1
    assert "slotkeeper_queue_length" in lines
