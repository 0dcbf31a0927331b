"""Schemathesis over the committed schema (docs/openapi.yaml), in process against the Django app.

Every operation gets a short, seeded run of valid and invalid requests (as an admin; the node-agent operations with
their node's token), and every answer must be no 5xx, a status code the schema documents, and a body that matches the
schema. This is the outside tester's run, kept in CI: a new 500 or a schema that stops telling the truth fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from fleet import actions as fleet_actions
from leases.models import Instance
from slotkeeper.management.commands.issue_token import issue
from tests.conftest import client_with_token

pytestmark = pytest.mark.django_db

SCHEMA = schemathesis.openapi.from_path(Path(__file__).resolve().parent.parent / "docs" / "openapi.yaml")
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}
# The node agent's two operations take a node token, and only for that node: the fuzz pins the id to it.
AGENT_OPERATIONS = {"POST /api/nodes/{id}/heartbeat/", "GET /api/nodes/{id}/assignments/"}
# negative_data_rejection: a request the schema forbids (an unknown field, `?offset=null`, `nodes: []`) must be
# refused, so the schema states every rule a client can check before sending.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    content_type_conformance,
    negative_data_rejection,
]
# Requests per operation: 10 valid + 6 invalid, so 608 in all (38 operations), about 30 s of CPU on 2 cores.
EXAMPLES = {GenerationMode.POSITIVE: 10, GenerationMode.NEGATIVE: 6}

_handler = None


def wsgi_app(environ, start_response):
    """Django's WSGI handler, minus its habit of closing the database connection at the end of every request (it
    would end the test's transaction); Django's own test client unhooks the same signal for the same reason."""
    global _handler
    if _handler is None:
        _handler = WSGIHandler()  # built on first use: it loads the middleware, which needs the settings
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        response = _handler(environ, start_response)
        body = b"".join(response)
        response.close()
        return [body]
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def world(db):
    """A small fleet with something in every list, so the 200 answers (nulls included) are checked too: a node
    that heartbeats, one that never did, a running lease, and a dead node's reschedule proposal and alert."""
    nodes = {}
    for name in ("tank", "architect", "morpheus"):
        node, token = fleet_actions.do_register_node(
            None,
            name=name,
            cpu_cores=16,
            mem_total_mib=61440,
            disk_total_gib=500,
            capabilities=[],
            now=timezone.now(),
        )
        nodes[name] = (node, token)
    for name in ("tank", "architect"):
        report = fleet_actions.HealthReport(
            mem_total_mib=61440, mem_used_mib=6144, disk_free_gib=400.0, cpu_pct=5.0, load1=0.3
        )
        fleet_actions.do_heartbeat(nodes[name][0], report, now=timezone.now())
    admin_token = issue("ada", "admin")
    admin = client_with_token(admin_token)
    for name in ("web", "batch"):
        response = admin.post(
            "/api/leases/",
            {"name": name, "type": "immediate", "duration_s": 3600, "nodes": [{"mem_mib": 1024}]},
            format="json",
        )
        assert response.status_code == 201, response.content
    lost = Instance.objects.filter(node__isnull=False).first()
    if lost is not None and lost.node.name != "tank":
        fleet_actions.do_declare_dead(None, lost.node_id, reason="PSU", now=timezone.now())
    assert (
        admin.post("/api/groups/", {"name": "web", "policy": "anti_affinity"}, format="json").status_code
        == 201
    )
    tank, tank_token = nodes["tank"]
    return {"admin": admin_token, "agent": tank_token, "agent_node": tank.pk}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_no_operation_answers_5xx_or_outside_its_schema(world, label, mode):
    operation = OPERATIONS[label]
    agent = label in AGENT_OPERATIONS
    token = world["agent"] if agent else world["admin"]
    headers = {"Authorization": f"Bearer {token}"}
    path_parameters = {"id": world["agent_node"]} if agent else None
    sent = []

    @settings(
        max_examples=EXAMPLES[mode],
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(mode, path_parameters=path_parameters))
    def run(case):
        response = case.call(app=wsgi_app, headers=headers)
        sent.append(response.status_code)
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()
    assert sent, f"{label}: no request was sent"


def test_every_request_body_refuses_fields_it_does_not_name():
    """The server answers an unknown field with a 400 (slotkeeper/serializers.py); the schema must say so, for each
    body and each body nested in one, or a generated client sends fields that can only fail."""
    raw = SCHEMA.raw_schema
    components = raw["components"]["schemas"]
    bodies = {
        content["schema"]["$ref"].rsplit("/", 1)[-1]
        for item in raw["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "requestBody" in operation
        for content in operation["requestBody"]["content"].values()
    }
    seen, open_ = set(), []
    while bodies:
        name = bodies.pop()
        seen.add(name)
        body = components[name]
        if body.get("additionalProperties") is not False:
            open_.append(name)
        for prop in body.get("properties", {}).values():
            ref = prop.get("$ref") or prop.get("items", {}).get("$ref")
            if ref and ref.rsplit("/", 1)[-1] not in seen and "Enum" not in ref:
                bodies.add(ref.rsplit("/", 1)[-1])
    assert len(seen) > 15
    assert open_ == []
