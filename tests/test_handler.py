"""The ASGI handler Daphne runs (slotkeeper/handler.py): the whole middleware stack and the view entered with one
thread hand-off per request, every middleware still applied, probes and errors answered as before."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from django.db import connection

from slotkeeper.asgi import django_asgi_app
from slotkeeper.handler import OneHopASGIHandler, RequestThreads
from slotkeeper.management.commands.issue_token import issue
from tests import asgi

pytestmark = pytest.mark.django_db(transaction=True)


async def call(path, *, method="GET", headers=(), body=b""):
    """One request through the application Daphne serves; returns (status, headers, body)."""
    status, sent, content = await asgi.request(
        django_asgi_app, path, method=method, headers=headers, body=body
    )
    return status, {k.decode().lower(): v.decode() for k, v in sent}, content


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
    # One for request_started, the stack and the view, and the close that sends request_finished. Django's own
    # handler makes one for each signal besides (3), and one for each process_request and process_response of
    # its middleware besides that: 17 for this request.
    assert hops["n"] == 1, hops["n"]


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
    assert hops["n"] == 1
    assert asyncio.run(call("/api/alerts/"))[0] == 401
    assert asyncio.run(call("/api/no-such-thing/"))[0] == 404


@pytest.fixture
def threads_seen(monkeypatch):
    """The thread each part of a request ran on: the request_started receiver, the stack, request_finished."""
    from django.core import signals

    seen: list[tuple[str, int]] = []
    handler = django_asgi_app.application
    stack = handler.get_response

    def get_response(request):
        seen.append(("stack", threading.get_ident()))
        return stack(request)

    def started(**kwargs):
        seen.append(("started", threading.get_ident()))

    def finished(**kwargs):
        seen.append(("finished", threading.get_ident()))

    monkeypatch.setattr(handler, "get_response", get_response)
    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    yield seen
    signals.request_started.disconnect(started)
    signals.request_finished.disconnect(finished)


def test_a_request_runs_on_one_thread_which_the_next_request_reuses(threads_seen):
    async def two_in_turn():
        return [await call("/healthz"), await call("/healthz")]

    assert [status for status, _, _ in asyncio.run(two_in_turn())] == [200, 200]
    assert [part for part, _ in threads_seen] == ["started", "stack", "finished"] * 2
    # Every part of both requests on one thread: the first request's, kept idle and taken by the second (Django's
    # own handler starts a new thread for every request and joins it after).
    assert len({ident for _, ident in threads_seen}) == 1
    assert threads_seen[0][1] != threading.get_ident()  # not the event loop's


def test_requests_at_once_each_have_a_thread_of_their_own(threads_seen, token):
    async def three_at_once():
        auth = [(b"authorization", f"Bearer {token}".encode())]
        return await asyncio.gather(*(call("/api/alerts/", headers=auth) for _ in range(3)))

    handler = django_asgi_app.application
    assert [status for status, _, _ in asyncio.run(three_at_once())] == [200, 200, 200]
    stacks = [ident for part, ident in threads_seen if part == "stack"]
    assert len(stacks) == 3
    # Each request's parts on its own thread; the parts of one request never split across threads.
    for ident in stacks:
        assert [part for part, i in threads_seen if i == ident] == ["started", "stack", "finished"]
    assert len(set(stacks)) == 3
    assert len(handler.threads) >= 3  # all three given back, idle


def test_a_thread_still_running_a_request_is_not_given_to_the_next():
    threads = RequestThreads(keep=2)
    busy = threads.take()
    release = threading.Event()
    running = busy.submit(release.wait, 10)  # a view still running after its client went away
    threads.give_back(busy)
    assert len(threads) == 0
    assert threads.take() is not busy
    release.set()
    assert running.result(timeout=5) is True  # it was left to finish, not cut short

    idle = threads.take()
    idle.submit(lambda: None).result(timeout=5)
    threads.give_back(idle)
    assert len(threads) == 1 and threads.take() is idle


def test_idle_threads_are_kept_up_to_the_bound():
    threads = RequestThreads(keep=2)
    taken = [threads.take() for _ in range(4)]
    for thread in taken:
        thread.submit(lambda: None).result(timeout=5)
        threads.give_back(thread)
    assert len(threads) == 2
    # The ones past the bound were shut down: they take no more work.
    with pytest.raises(RuntimeError):
        taken[-1].submit(lambda: None)
    # The most recently given back is taken first (its thread is the one most likely still warm).
    assert threads.take() is taken[1]


def test_a_response_is_closed_on_its_thread_before_it_is_sent_and_a_streamed_one_after(monkeypatch):
    """request_finished (which gives the database connection back) comes from the one hand-off: before the body
    of a complete response is sent, after the last chunk of a streamed one, whose content is read as it goes."""
    from django.core import signals
    from django.http import StreamingHttpResponse

    order: list[str] = []
    handler = django_asgi_app.application
    stack = handler.get_response

    def finished(**kwargs):
        order.append(f"finished on the loop: {threading.current_thread() is threading.main_thread()}")

    async def run(path):
        order.clear()
        sent: list[dict] = []
        scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": [(b"host", b"testserver")], "scheme": "http",
                 "client": ("127.0.0.1", 1), "server": ("testserver", 80)}  # fmt: skip
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            await asyncio.Event().wait()

        async def send(message):
            order.append(message["type"])
            sent.append(message)

        await django_asgi_app(scope, receive, send)
        return b"".join(m.get("body", b"") for m in sent)

    signals.request_finished.connect(finished)
    try:
        assert asyncio.run(run("/healthz")) == b"ok"
        assert order == ["finished on the loop: False", "http.response.start", "http.response.body"]

        async def chunks():
            yield b"a"
            yield b"b"

        def streamed(request):
            if request.path == "/stream":
                return StreamingHttpResponse(chunks())
            return stack(request)

        monkeypatch.setattr(handler, "get_response", streamed)
        assert asyncio.run(run("/stream")) == b"ab"
        assert order[0] == "http.response.start" and order[-1] == "finished on the loop: False"
        assert order.count("finished on the loop: False") == 1
    finally:
        signals.request_finished.disconnect(finished)


def test_a_client_gone_mid_request_leaves_its_view_to_finish_read_its_body_and_close_once(monkeypatch):
    """The client hangs up while the view runs: the handler returns without waiting for it, and the view's thread
    still runs to the end, can still read the request's body (a lease request whose client went away is still
    decided; it once found the body closed under it and answered 500), and sends request_finished once there."""
    from django.core import signals

    handler = django_asgi_app.application
    stack = handler.get_response
    release = threading.Event()
    finished_on: list[int] = []
    viewed_on: list[int] = []
    bodies: list[bytes] = []

    def slow(request):
        viewed_on.append(threading.get_ident())
        release.wait(10)
        bodies.append(request.body)
        return stack(request)

    def finished(**kwargs):
        finished_on.append(threading.get_ident())

    async def hang_up():
        body = b'{"name": "gone"}'
        scope = {"type": "http", "method": "POST", "path": "/healthz", "raw_path": b"/healthz", "query_string": b"",
                 "root_path": "", "scheme": "http", "client": ("127.0.0.1", 1), "server": ("testserver", 80),
                 "headers": [(b"host", b"testserver"), (b"content-length", str(len(body)).encode())]}  # fmt: skip
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict] = []

        async def receive():
            if messages:
                return messages.pop(0)
            while not viewed_on:  # the view is running: now the client goes
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(django_asgi_app(scope, receive, send), timeout=5)
        return sent

    monkeypatch.setattr(handler, "get_response", slow)
    signals.request_finished.connect(finished)
    try:
        assert asyncio.run(hang_up()) == []  # returned while the view still ran; nothing was sent
        assert finished_on == []
        release.set()
        for _ in range(100):
            if finished_on:
                break
            threading.Event().wait(0.05)
        assert bodies == [b'{"name": "gone"}']
        assert finished_on == viewed_on  # once, on the view's thread
    finally:
        release.set()
        signals.request_finished.disconnect(finished)


def test_a_request_django_cannot_build_answers_400_with_both_signals_sent_once():
    """A query string that is not UTF-8 (Daphne turns such requests away before us; another ASGI server may not):
    Django's own error path, 400, with request_started and request_finished each sent once."""
    from django.core import signals

    seen: list[str] = []

    def started(**kwargs):
        seen.append("started")

    def finished(**kwargs):
        seen.append("finished")

    async def bad_query():
        scope = {"type": "http", "method": "GET", "path": "/api/alerts/", "raw_path": b"/api/alerts/",
                 "query_string": b"a=\xff", "root_path": "", "headers": [(b"host", b"testserver")], "scheme": "http",
                 "client": ("127.0.0.1", 1), "server": ("testserver", 80)}  # fmt: skip
        messages = [{"type": "http.request", "body": b"", "more_body": False}]
        sent: list[dict] = []

        async def receive():
            return messages.pop(0) if messages else await asyncio.Event().wait()

        async def send(message):
            sent.append(message)

        await django_asgi_app(scope, receive, send)
        return sent

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        sent = asyncio.run(bad_query())
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)
    assert sent[0]["status"] == 400
    assert seen == ["started", "finished"]
