"""Clean shutdown inside the process: a broadcast never holds a committed write longer than its bound, and never
once shutdown has begun; the embedded periodic loop ends at once; a process still busy at its deadline exits.
(The real SIGTERM of a loaded Daphne and Celery worker is tests/e2e/test_shutdown.py.)"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest
from asgiref.sync import sync_to_async

from slotkeeper import embedded, events, periodic, shutdown

BOUND_S = 0.2


class HangingLayer:
    """A channel layer whose group_send never completes (Redis accepted the connection and went silent)."""

    def __init__(self) -> None:
        self.sends = 0

    async def group_send(self, group, message):
        self.sends += 1
        await asyncio.Event().wait()


class DaemonThreadExecutor(concurrent.futures.Executor):
    """Runs each call on a daemon thread: a test that hangs in it (the bug it guards against) fails by its
    timeout instead of keeping pytest from exiting."""

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        return future


@pytest.fixture(autouse=True)
def fresh_shutdown_state():
    shutdown._begun.clear()
    yield
    shutdown._begun.clear()


@pytest.fixture
def hanging_layer(monkeypatch):
    layer = HangingLayer()
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(events, "SEND_TIMEOUT_S", BOUND_S)
    return layer


def timed(call) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_a_broadcast_outside_any_event_loop_returns_within_its_bound_when_the_layer_hangs(hanging_layer):
    # A Celery task or a management command: no loop serves the thread.
    took = timed(lambda: events.send_batch([{"event": "node-changed", "node": 1}]))
    assert hanging_layer.sends == 1
    assert took < BOUND_S + 1


async def test_a_broadcast_from_a_request_thread_returns_within_its_bound_when_the_layer_hangs(hanging_layer):
    # A Daphne request: the view's thread sends on the loop that serves it, and that loop keeps running.
    send = sync_to_async(events.send_batch, thread_sensitive=False, executor=DaemonThreadExecutor())
    started = time.monotonic()
    await asyncio.wait_for(send([{"event": "lease-changed", "lease": 7}]), BOUND_S + 3)
    assert hanging_layer.sends == 1
    assert time.monotonic() - started < BOUND_S + 1.5


def test_a_broadcast_from_a_request_thread_whose_loop_has_stopped_returns_at_once(hanging_layer):
    """What kept a stopped Daphne alive: a request thread outlives the loop (SIGTERM stopped it mid-request),
    commits, and its broadcast, queued on the stopped loop by async_to_sync, waited forever."""
    loop = asyncio.new_event_loop()
    in_view, loop_stopped, returned = threading.Event(), threading.Event(), threading.Event()

    def view() -> None:
        in_view.set()
        loop_stopped.wait(5)
        events.send_batch([{"event": "lease-changed", "lease": 7}])
        returned.set()

    async def request() -> None:
        await sync_to_async(view, thread_sensitive=False, executor=DaemonThreadExecutor())()

    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()
    served = asyncio.run_coroutine_threadsafe(request(), loop)
    assert in_view.wait(5)
    loop.call_soon_threadsafe(loop.stop)
    server.join(5)
    assert not loop.is_running()
    started = time.monotonic()
    loop_stopped.set()
    assert returned.wait(3), "the broadcast waited on a stopped event loop"
    assert time.monotonic() - started < 1
    assert hanging_layer.sends == 0  # nothing was queued where it could never run
    threading.Thread(target=loop.run_forever, daemon=True).start()  # lets the request end, for a tidy close
    served.result(3)
    loop.call_soon_threadsafe(loop.stop)


def test_once_shutdown_has_begun_a_broadcast_is_skipped(hanging_layer):
    shutdown.begin("test", exit_deadline_s=None)
    took = timed(lambda: events.send_batch([{"event": "node-changed", "node": 1}]))
    assert hanging_layer.sends == 0
    assert took < 0.1


async def test_the_embedded_loop_ends_at_once_when_shutdown_begins_even_mid_round(monkeypatch):
    in_round, release = threading.Event(), threading.Event()

    def slow_round() -> None:
        in_round.set()
        release.wait(10)

    monkeypatch.setattr(embedded, "periodic_round", slow_round)
    task = asyncio.ensure_future(embedded.loop_forever(interval=60))
    try:
        assert await asyncio.to_thread(in_round.wait, 5)
        shutdown.begin("test", exit_deadline_s=None)
        await asyncio.wait_for(task, 1)
    finally:
        release.set()
        task.cancel()


async def test_between_rounds_the_embedded_loop_ends_at_once_when_shutdown_begins(monkeypatch):
    rounds = []
    monkeypatch.setattr(embedded, "periodic_round", lambda: rounds.append(1))
    task = asyncio.ensure_future(embedded.loop_forever(interval=60))
    try:
        while not rounds:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # now asleep for the 60 s interval
        shutdown.begin("test", exit_deadline_s=None)
        await asyncio.wait_for(task, 1)
    finally:
        task.cancel()
    assert rounds == [1]


def test_a_periodic_round_stops_between_steps_once_shutdown_began(monkeypatch):
    ran = []

    def first(now) -> None:
        ran.append("first")
        shutdown.begin("test", exit_deadline_s=None)

    monkeypatch.setattr(
        periodic, "STEPS", (("first", first, None), ("second", lambda now: ran.append("second"), None))
    )
    periodic.run_periodic()
    assert ran == ["first"]


def test_a_process_still_busy_at_its_deadline_exits(monkeypatch):
    exited = threading.Event()
    monkeypatch.setattr(shutdown.os, "_exit", lambda code: exited.set())
    monkeypatch.setattr(shutdown.faulthandler, "dump_traceback", lambda **_: None)
    shutdown.begin("test", exit_deadline_s=0.1)
    assert exited.wait(3)


def test_shutdown_subscribers_hear_it_once_even_when_one_fails():
    heard = []

    def broken() -> None:
        raise RuntimeError("its loop is closed")

    unsubscribe = [shutdown.on_begin(broken), shutdown.on_begin(lambda: heard.append(1))]
    try:
        shutdown.begin("test", exit_deadline_s=None)
        shutdown.begin("again", exit_deadline_s=None)
    finally:
        for undo in unsubscribe:
            undo()
    assert heard == [1]


def test_every_middleware_runs_async_under_daphne():
    """One sync-only middleware puts every request through a thread -> loop -> thread hop, and a thread caught in
    it when Daphne's loop stops waits forever (the stopped Daphne then lives until the exit deadline)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    sync_only = [
        path for path in settings.MIDDLEWARE if not getattr(import_string(path), "async_capable", False)
    ]
    assert sync_only == []


@pytest.mark.django_db
async def test_probes_and_request_ids_answer_through_the_async_stack(async_client):
    healthz = await async_client.get("/healthz")
    assert (healthz.status_code, healthz.content) == (200, b"ok")
    readyz = await async_client.get("/readyz")
    assert readyz.status_code == 200
    login = await async_client.get("/login/", headers={"X-Request-ID": "req-1"})
    assert (login.status_code, login["X-Request-ID"]) == (200, "req-1")
