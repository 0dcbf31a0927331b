"""The ASGI handler Daphne runs (slotkeeper/handler.py): the whole middleware stack and the view entered with one
thread hand-off per request, every middleware still applied, probes and errors answered as before."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref import sync
from django.db import connection

from slotkeeper.asgi import django_asgi_app
from slotkeeper.handler import OneHopASGIHandler
from slotkeeper.management.commands.issue_token import issue

pytestmark = pytest.mark.django_db(transaction=True)


async def call(path, *, method="GET", headers=(), body=b""):
    """One request through the application Daphne serves; returns (status, headers, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-length", str(len(body)).encode()), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    chunks = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive():
        if chunks:
            return chunks.pop(0)
        await asyncio.Event().wait()  # the client stays while the answer is made

    async def send(message):
        sent.append(message)

    await django_asgi_app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, content


@pytest.fixture
def hops(monkeypatch):
    """Counts the sync_to_async hand-offs made while the test runs."""
    counted = {"n": 0}
    original = sync.SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        counted["n"] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counting)
    return counted


@pytest.fixture
def token():
    raw = issue("hop", "operator")
    connection.close()  # the requests run on threads of their own
    return raw


def test_daphne_serves_django_through_the_one_hop_handler():
    assert isinstance(django_asgi_app.application, OneHopASGIHandler)


def test_an_api_request_is_one_hand_off_to_the_stack_and_the_view(hops, token):
    status, _, body = asyncio.run(
        call("/api/alerts/", headers=[(b"authorization", f"Bearer {token}".encode())])
    )
    assert status == 200, body
    assert json.loads(body)["count"] == 0
    # One for the stack and the view, and one each for the request_started and request_finished receivers
    # (Django sends those signals itself). Django's own handler made one for each process_request and
    # process_response of its middleware besides: 17 for this request.
    assert hops["n"] <= 3, hops["n"]


def test_every_middleware_still_applies(token):
    status, headers, _ = asyncio.run(
        call("/api/alerts/", headers=[(b"authorization", f"Bearer {token}".encode())])
    )
    assert status == 200
    assert headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware
    assert headers["x-frame-options"] == "DENY"  # XFrameOptionsMiddleware
    assert headers["x-request-id"]  # ours
    # CSRF: a console form posted without its token is refused.
    status, _, _ = asyncio.run(call("/leases/new", method="POST", body=b"name=x"))
    assert status in (302, 403)  # the login redirect comes first for an anonymous visitor


def test_probes_unknown_paths_and_unauthenticated_requests_answer_as_before(hops):
    status, _, body = asyncio.run(call("/healthz"))
    assert (status, body) == (200, b"ok")
    assert hops["n"] <= 3
    assert asyncio.run(call("/api/alerts/"))[0] == 401
    assert asyncio.run(call("/api/no-such-thing/"))[0] == 404
