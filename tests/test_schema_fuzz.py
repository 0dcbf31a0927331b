"""Schemathesis over the committed schema (docs/openapi.yaml), in process against the Django app.

Every operation gets a short, seeded run of valid and invalid requests (as an admin; the node-agent operations with
their node's token), and every answer must be no 5xx, a status code the schema documents, and a body that matches the
schema. This is the outside tester's run, kept in CI: a new 500 or a schema that stops telling the truth fails here.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
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
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from fleet import actions as fleet_actions
from leases.api.serializers import ENV_NAME_RE
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
    positive_data_acceptance,
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
        if mode == GenerationMode.POSITIVE:
            within_rules_the_schema_cannot_state(label, case)
        response = case.call(app=wsgi_app, headers=headers)
        sent.append(response.status_code)
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()
    assert sent, f"{label}: no request was sent"


def _within_depth(value, depth: int):
    """`value` with whatever lies deeper than `depth` more levels of objects and arrays left empty."""
    if isinstance(value, dict):
        return {k: _within_depth(v, depth - 1) for k, v in value.items()} if depth > 0 else {}
    if isinstance(value, list):
        return [_within_depth(v, depth - 1) for v in value] if depth > 0 else []
    return value


def within_rules_the_schema_cannot_state(label: str, case) -> None:
    """A valid request, as generated from the schema, moved inside the rules that depend on the clock, the fleet or
    a second field, which JSON Schema cannot state (each is in the operation's description or its fields'): a start
    at or after now (docs/api-input.md), the window's end after its start, a lease's start only on an advance
    reservation, a heartbeat's used memory within its total, a VM no larger than the fleet's largest node. The
    rest of what the schema allows must be accepted as it is (positive_data_acceptance)."""
    now = timezone.now()
    soon = (now + timedelta(hours=1)).isoformat()
    body = case.body if isinstance(case.body, dict) else None
    query = case.query if isinstance(case.query, dict) else None
    if label == "POST /api/leases/" and body is not None:
        if body.get("type") == "advance_reservation":
            body["start"] = soon
        else:
            body.pop("start", None)
        for vm in body.get("nodes", []):
            if isinstance(vm, dict):
                vm["mem_mib"] = min(vm.get("mem_mib", 1), 1024)
                vm["cpu_cores"] = min(vm.get("cpu_cores", 1), 1)
                vm["disk_gib"] = min(vm.get("disk_gib", 0), 10)
        body["groups"] = []
        spec = body.get("spec")
        if body.get("driver") == "process" and not (isinstance(spec, dict) and spec.get("command")):
            body["driver"] = "sim"  # the process driver needs a command, a rule between two fields
        if isinstance(spec, dict) and isinstance(spec.get("env"), dict):
            # A variable's name is letters, digits and '_' (OpenAPI 3.0 has no `propertyNames` to say so).
            spec["env"] = {k: v for k, v in spec["env"].items() if ENV_NAME_RE.fullmatch(k)}
        if isinstance(spec, dict):
            # A driver's own settings may be any JSON nested at most 4 levels (docs/api-input.md; JSON Schema 3.0
            # cannot bound a depth).
            for key, value in list(spec.items()):
                spec[key] = _within_depth(value, 2)
        command = spec.get("command") if isinstance(spec, dict) else None
        # The program (the first item) is not blank; the arguments after it may be (no `prefixItems` in 3.0).
        if isinstance(command, list) and command and not str(command[0]).strip():
            command[0] = "true"
    elif label in ("POST /api/placement/preview", "POST /api/nodes/{id}/drain/") and body is not None:
        for name in ("start", "deadline"):
            if body.get(name) is not None:
                body[name] = soon
    elif label == "GET /api/slots/" and query is not None:
        query.pop("end", None)
        if "start" in query:
            query["start"] = soon
    elif label == "POST /api/nodes/{id}/heartbeat/" and body is not None:
        if isinstance(body.get("mem_used_mib"), int) and isinstance(body.get("mem_total_mib"), int):
            body["mem_used_mib"] = min(body["mem_used_mib"], body["mem_total_mib"])
    elif label == "POST /api/groups/" and body is not None:
        body["name"] = f"g{uuid.uuid4().hex[:12]}"  # a name not taken: a taken one is a conflict (409)
        body["leases"] = []


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
        if "$ref" in content["schema"]
    }
    # A body stated inline (exactly one of two shapes) refuses unknown fields in each of its shapes.
    for item in raw["paths"].values():
        for operation in item.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                for content in operation["requestBody"]["content"].values():
                    for shape in content["schema"].get("oneOf", []):
                        assert shape.get("additionalProperties") is False, shape
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
