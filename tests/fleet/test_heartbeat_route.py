"""The heartbeat answered in front of Django (slotkeeper/heartbeat_route.py), through the ASGI application as
Daphne calls it: the steady heartbeat is answered at once and written by the flush within its interval; whatever
changes a status, is refused, or is not plainly valid is the view's, with the view's answer, at once.

On SQLite and PostgreSQL both (transactional: the view and the flush run on threads of their own). The racing
writers and the real Daphne (SIGTERM, SIGKILL) are in test_heartbeat_flush.py, on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application
from django.db import connection
from django.utils import timezone

from fleet import actions
from fleet.models import HealthSample, Node, NodeStatus
from leases.instances.actions import nodes as node_actions
from slotkeeper import shutdown
from slotkeeper.auth import node_tokens
from slotkeeper.heartbeat_route import Flusher, HeartbeatRoute
from slotkeeper.models import hash_token, new_token
from tests.conftest import healthy
from tests.fleet.test_bad_input import HOSTILE_HEARTBEATS

pytestmark = pytest.mark.django_db(transaction=True)

INTERVAL_S = 0.1


def in_thread(fn):
    """`fn` on asgiref's thread for sync code, its connection given back to the pool after each call: one left
    checked out kept the test database from being dropped."""

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(call)


# What a flush may take on top of its interval on this shared two-core machine (load 5-10 while tests run).
SLACK_S = 1.5


@pytest.fixture(autouse=True)
def _fresh_shutdown_state():
    shutdown._begun.clear()
    yield
    shutdown._begun.clear()


@pytest.fixture
def route():
    flusher = Flusher(INTERVAL_S)
    yield HeartbeatRoute(get_asgi_application(), flusher)
    flusher.close()
    flusher.notices.join(3)  # its connection gone before the test database is dropped


async def post(app, node_id, token, body, *, content_type=b"application/json", host=b"testserver"):
    """One request through the ASGI application; returns (status, headers, parsed body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": f"/api/nodes/{node_id}/heartbeat",
        "raw_path": f"/api/nodes/{node_id}/heartbeat".encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", host),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", content_type),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    scope["headers"].append((b"content-length", str(len(raw)).encode()))
    chunks = [{"type": "http.request", "body": raw[: len(raw) // 2], "more_body": True}]
    chunks.append({"type": "http.request", "body": raw[len(raw) // 2 :], "more_body": False})
    sent: list[dict] = []

    async def receive():
        if chunks:
            return chunks.pop(0)
        await asyncio.Event().wait()  # the client stays: Django listens for a disconnect while it answers

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {name.lower(): value for name, value in start["headers"]}
    parsed = json.loads(content) if headers.get(b"content-type") == b"application/json" else content
    return start["status"], headers, parsed


def register(name="tank"):
    node, token = actions.do_register_node(
        None,
        name=name,
        cpu_cores=16,
        mem_total_mib=61440,
        disk_total_gib=500,
        capabilities=[],
        now=timezone.now(),
    )
    return node, token


row = in_thread(lambda pk: Node.objects.get(pk=pk))


async def known(route, name="tank"):
    """A node whose first heartbeat (through the view: token looked up, brought online) this process remembers."""
    node, token = await in_thread(register)(name)
    status, _, body = await post(route, node.pk, token, healthy())
    assert (status, body["status"]) == (200, "online")
    assert len(route.flusher.buffer) == 0  # the view wrote it
    return node, token


async def remembered(token, seconds=SLACK_S):
    deadline = time.monotonic() + seconds
    while (entry := node_tokens.get(hash_token(token))) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return entry


async def flushed_within(node_id, predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate(await row(node_id)):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_steady_heartbeat_is_answered_at_once_and_written_within_one_flush(route):
    node, token = await known(route)
    status, headers, body = await post(route, node.pk, token, healthy(mem_used_mib=7777))
    assert status == 200
    assert body["status"] == "online" and body["server_time"].endswith("Z")
    assert headers[b"content-type"] == b"application/json"
    assert len(route.flusher.buffer) == 1
    assert (await row(node.pk)).obs_mem_used_mib == 6144  # not written yet: buffered
    assert await flushed_within(node.pk, lambda n: n.obs_mem_used_mib == 7777, INTERVAL_S + SLACK_S)
    stored = await row(node.pk)
    assert stored.last_heartbeat_at.isoformat().replace("+00:00", "Z") == body["server_time"]


async def test_an_online_nodes_token_new_to_this_process_is_looked_up_by_the_route_and_buffered(route):
    # Another process brought it online; this one (just restarted) has never seen its token.
    node, token = await known(route)
    node_tokens.clear()
    status, _, body = await post(route, node.pk, token, healthy(mem_used_mib=7100))
    assert (status, body["status"]) == (200, "online")
    assert len(route.flusher.buffer) == 1
    assert await flushed_within(node.pk, lambda n: n.obs_mem_used_mib == 7100, INTERVAL_S + SLACK_S)


async def test_an_unknown_token_is_the_views_401(route):
    node, _ = await known(route)
    status, _, _ = await post(route, node.pk, new_token("skn"), healthy())
    assert status == 401
    assert len(route.flusher.buffer) == 0


async def test_a_node_with_its_token_known_but_offline_comes_back_at_once_through_the_view(route):
    node, token = await known(route)
    await in_thread(Node.objects.filter(pk=node.pk).update)(status=NodeStatus.OFFLINE)
    await in_thread(node_actions.sweep)(timezone.now())  # nothing else changes
    # This process still remembers it online: the flush finds the status moved and brings it back then.
    status, _, body = await post(route, node.pk, token, healthy())
    assert status == 200
    assert await flushed_within(node.pk, lambda n: n.status == NodeStatus.ONLINE, INTERVAL_S + SLACK_S)
    # Remembered offline (the sweep ran in this process): the view brings it back before it answers.
    await in_thread(Node.objects.filter(pk=node.pk).update)(status=NodeStatus.OFFLINE)
    entry = await remembered(token)  # the flush puts it back after the node row's commit
    node_tokens.update(dataclasses.replace(entry, status=NodeStatus.OFFLINE.value))
    status, _, body = await post(route, node.pk, token, healthy())
    assert (status, body["status"]) == (200, "online")
    assert len(route.flusher.buffer) == 0
    assert (await row(node.pk)).status == NodeStatus.ONLINE


@pytest.mark.parametrize(("overrides", "field"), HOSTILE_HEARTBEATS)
async def test_a_hostile_heartbeat_is_the_views_400_and_nothing_is_written(route, overrides, field):
    node, token = await known(route)
    before = await row(node.pk)
    status, _, body = await post(route, node.pk, token, {**healthy(mem_used_mib=1), **overrides})
    assert status == 400 and field in body
    assert len(route.flusher.buffer) == 0
    await asyncio.sleep(INTERVAL_S * 2)
    after = await row(node.pk)
    assert (after.last_heartbeat_at, after.obs_mem_used_mib) == (before.last_heartbeat_at, 6144)
    assert await in_thread(HealthSample.objects.filter(node_id=node.pk).count)() == 1


async def test_another_nodes_token_is_a_403_and_a_rotated_one_a_401(route):
    tank, tank_token = await known(route, "tank")
    morpheus, _ = await known(route, "morpheus")
    status, _, body = await post(route, morpheus.pk, tank_token, healthy())
    assert status == 403 and "tank" in body["detail"]
    await in_thread(actions.do_rotate_token)(None, tank.pk, now=timezone.now())
    status, _, _ = await post(route, tank.pk, tank_token, healthy())
    assert status == 401
    assert len(route.flusher.buffer) == 0


async def test_a_node_declared_dead_here_is_refused_at_once(route):
    node, token = await known(route)
    await in_thread(node_actions.do_declare_dead)(None, node.pk, reason="disk on fire", now=timezone.now())
    status, _, body = await post(route, node.pk, token, healthy())
    assert (status, body["code"]) == (409, "fenced")


async def test_a_node_fenced_by_another_process_is_written_nothing_and_refused_after_the_flush(route):
    # Another process declared it dead: this one's cache was not told, so the heartbeat in hand is answered as
    # before; the flush's guard finds the fence, writes nothing, and the next heartbeat is the view's 409.
    node, token = await known(route)
    fenced_at = timezone.now()
    await in_thread(Node.objects.filter(pk=node.pk).update)(
        status=NodeStatus.DEAD, fenced_at=fenced_at, fence_reason="gone"
    )
    status, _, _ = await post(route, node.pk, token, healthy(mem_used_mib=9999))
    assert status == 200
    await asyncio.sleep(INTERVAL_S * 3)
    stored = await row(node.pk)
    assert stored.obs_mem_used_mib == 6144 and stored.status == NodeStatus.DEAD
    assert stored.last_fenced_heartbeat_at is not None  # it called after the fence: the node page says so
    status, _, body = await post(route, node.pk, token, healthy())
    assert (status, body["code"]) == (409, "fenced")


async def test_a_token_rotated_by_another_process_writes_nothing_and_is_refused_after_the_flush(route):
    node, token = await known(route)
    await in_thread(Node.objects.filter(pk=node.pk).update)(token_digest=hash_token(new_token("skn")))
    assert (await post(route, node.pk, token, healthy(mem_used_mib=9999)))[0] == 200
    await asyncio.sleep(INTERVAL_S * 3)
    assert (await row(node.pk)).obs_mem_used_mib == 6144
    assert (await post(route, node.pk, token, healthy()))[0] == 401


async def test_a_drain_made_elsewhere_is_kept_and_the_heartbeat_still_written(route):
    node, token = await known(route)
    await in_thread(Node.objects.filter(pk=node.pk).update)(status=NodeStatus.DRAINING, drain_reason="bios")
    assert (await post(route, node.pk, token, healthy(mem_used_mib=8000)))[0] == 200
    assert await flushed_within(node.pk, lambda n: n.obs_mem_used_mib == 8000, INTERVAL_S + SLACK_S)
    assert (await row(node.pk)).status == NodeStatus.DRAINING


async def test_what_is_buffered_is_written_when_shutdown_begins_and_later_heartbeats_go_to_the_view(route):
    route.flusher.interval_s = 60  # no periodic flush in this test: only the last one
    nodes = [await known(route, f"n{i}") for i in range(5)]
    for node, token in nodes:
        assert (await post(route, node.pk, token, healthy(mem_used_mib=5000)))[0] == 200
    assert len(route.flusher.buffer) == 5
    await in_thread(shutdown.begin)(
        "test", exit_deadline_s=None
    )  # Daphne's SIGTERM, as watch_daphne hears it
    for node, _ in nodes:
        assert (await row(node.pk)).obs_mem_used_mib == 5000
    node, token = nodes[0]
    assert (await post(route, node.pk, token, healthy(mem_used_mib=4000)))[0] == 200
    assert (await row(node.pk)).obs_mem_used_mib == 4000  # written in its request
    assert len(route.flusher.buffer) == 0


async def test_a_heartbeat_for_a_host_django_does_not_serve_is_its_400(route):
    node, token = await known(route)
    status, _, _ = await post(route, node.pk, token, healthy(), host=b"evil.example")
    assert status == 400
    assert len(route.flusher.buffer) == 0


async def test_the_buffered_answer_is_the_views_answer(route, settings):
    node, token = await known(route)
    buffered = await post(route, node.pk, token, healthy())
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "HEARTBEAT_BUFFER": False}
    through_view = await post(route, node.pk, token, healthy())
    assert buffered[0] == through_view[0] == 200
    assert buffered[2].keys() == through_view[2].keys()
    assert buffered[2]["status"] == through_view[2]["status"]
    view_headers = {k: v for k, v in through_view[1].items() if k not in (b"x-request-id", b"content-length")}
    assert {k: v for k, v in buffered[1].items() if k != b"content-length"} == view_headers


# -- found by an outsider's requests ---------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"[" * 1000 + b"]" * 1000, b"[" * 5000, b'{"a":' * 2000])
async def test_a_report_nested_a_thousand_deep_is_the_views_400_not_a_500(route, raw):
    node, token = await known(route)
    status, _, body = await post(route, node.pk, token, raw)
    assert status == 400 and "nested deeper" in body["detail"], (status, body)
    assert len(route.flusher.buffer) == 0


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        (b"application/jsonx", 415),
        (b"application/json; charset=utf-16", 400),
        (b"application/json-patch+json", 415),
    ],
)
async def test_a_media_type_the_view_refuses_is_refused_here_too(route, content_type, expected):
    node, token = await known(route)
    status, _, _ = await post(route, node.pk, token, healthy(), content_type=content_type)
    assert status == expected
    assert len(route.flusher.buffer) == 0


async def test_the_view_s_own_media_types_are_buffered(route):
    node, token = await known(route)
    for content_type in (
        b"application/json",
        b"application/json; charset=utf-8",
        b"Application/JSON;charset=UTF-8",
    ):
        status, _, _ = await post(route, node.pk, token, healthy(), content_type=content_type)
        assert status == 200, content_type
    assert len(route.flusher.buffer) == 1  # one node: its latest report


async def test_a_long_report_is_checked_by_the_view_on_a_thread_not_on_the_loop(route):
    """A report of many instances took the event loop 1.3 s (10,000 ids) to 5 s (16,000), every other request of
    the process waiting; past MAX_INSTANCES the view, on a request thread, checks and writes it."""
    from slotkeeper.heartbeat_route import MAX_INSTANCES

    node, token = await known(route)
    status, _, _ = await post(route, node.pk, token, {**healthy(), "instances": [f"i-{n}" for n in range(5)]})
    assert status == 200 and len(route.flusher.buffer) == 1  # a short one is the route's
    await flushed_within(node.pk, lambda r: len(route.flusher.buffer) == 0, SLACK_S)
    many = [f"i-{n}" for n in range(MAX_INSTANCES + 1)]
    status, _, _ = await post(route, node.pk, token, {**healthy(), "instances": many})
    assert status == 200
    assert len(route.flusher.buffer) == 0  # the view wrote it, at once
