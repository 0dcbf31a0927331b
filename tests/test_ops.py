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


def test_the_request_id_travels_into_celery_tasks_and_onto_every_log_line():
    import json
    import logging
    from types import SimpleNamespace

    from slotkeeper.celery import adopt_request_id, carry_request_id
    from slotkeeper.logging import JsonFormatter, RequestIdFilter, request_id_var

    outer = request_id_var.set("-")  # reset at the end: the worker's adoption below sets it for the task
    token = request_id_var.set("req-42")
    headers: dict = {}
    carry_request_id(headers=headers)
    request_id_var.reset(token)
    assert headers["request_id"] == "req-42"

    worker_task = SimpleNamespace(request=SimpleNamespace(request_id=None, headers=headers))
    adopt_request_id(task=worker_task)
    record = logging.LogRecord("fleet", logging.INFO, __file__, 1, "tick done", (), None)
    RequestIdFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert (line["request_id"], line["msg"], line["level"]) == ("req-42", "tick done", "info")
    request_id_var.reset(outer)


def test_the_line_django_writes_about_a_refused_request_carries_its_request_id(caplog, operator):
    import logging

    from slotkeeper.logging import RequestIdFilter

    with caplog.at_level(logging.INFO, logger="django.request"):
        response = operator.post("/api/leases/", {"name": ""}, format="json")
    assert response.status_code == 400
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.getMessage() == "Bad Request: /api/leases/"
    # An answer the client was given, logged at info (slotkeeper.logging.ExpectedAnswersFilter), not a warning.
    assert record.levelname == "INFO"
    RequestIdFilter().filter(record)  # what every handler of ours runs before it writes the line
    assert record.request_id == response["X-Request-ID"] != "-"


def test_every_response_carries_a_request_id_and_honours_the_callers():
    response = Client().get("/login/", HTTP_X_REQUEST_ID="abc123")
    assert response["X-Request-ID"] == "abc123"
    assert len(Client().get("/login/")["X-Request-ID"]) == 16


def test_a_console_request_that_could_not_have_the_plan_lock_is_a_503_with_retry_after(rf):
    from django.db import OperationalError

    from slotkeeper.ops import BusyMiddleware
    from slotkeeper.planlock import PlanBusy

    middleware = BusyMiddleware(lambda request: None)
    for exc in (PlanBusy("busy"), OperationalError("database is locked")):
        response = middleware.process_exception(rf.post("/nodes/1/drain"), exc)
        assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert middleware.process_exception(rf.get("/"), ValueError("a bug")) is None


@pytest.mark.parametrize(
    ("path", "body", "status", "said"),
    [
        (
            "/login/",
            "x=" + "a" * 3_000_000,
            413,
            "The request body is larger than the server reads (2,621,440 bytes",
        ),
        ("/slots/patch/", "x=" + "a" * 3_000_000, 413, "larger than the server reads"),
        ("/login/", "&".join(f"f{i}=1" for i in range(2000)), 400, "too many fields (1,000 at most)"),
    ],
    ids=["login-3MB", "patch-3MB", "login-2000-fields"],
)
def test_a_form_too_large_or_with_too_many_fields_is_told_so_and_logged_as_the_clients_mistake(
    caplog, path, body, status, said
):
    """Signed out, with CSRF checked (the middleware reads the form for its token): every console page answered an
    empty "Bad Request (400)" and Django logged an error with a traceback, which anyone could repeat at will."""
    import logging

    from slotkeeper.logging import ExpectedAnswersFilter

    client = Client(enforce_csrf_checks=True)
    client.get(
        "/login/"
    )  # the CSRF cookie, as a browser has it: the middleware then reads the form for its token
    with caplog.at_level(logging.INFO):
        response = client.post(path, body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == status
    assert said in response.content.decode()
    refused = [r for r in caplog.records if r.name.startswith("django.security.")]
    assert refused, "Django's security logger still says it"
    noted = ExpectedAnswersFilter()
    for record in refused:
        assert noted.filter(record) is True
        assert record.levelname == "INFO" and record.exc_info is None, "the client's mistake, not an error"


@pytest.mark.parametrize(
    ("path", "status", "said"),
    [
        ("/api/leases/?" + "&".join(f"f{i}=1" for i in range(2000)), 400, "too many fields (1,000 at most)"),
        (
            "/api/nodes/?" + "&".join(f"status={i}" for i in range(2000)),
            400,
            "too many fields (1,000 at most)",
        ),
    ],
    ids=["leases-2000-params", "nodes-2000-params"],
)
def test_an_api_query_with_too_many_fields_is_told_so_in_json(operator, path, status, said):
    """Django refuses the query string before DRF reads it (a SuspiciousOperation DRF does not handle): the answer is
    the API's JSON with a message, as every API error, not the console's text or Django's empty page."""
    response = operator.get(path)
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    assert said in response.json()["detail"]
