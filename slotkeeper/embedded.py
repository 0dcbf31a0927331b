"""Embedded mode: the periodic work (node sweep, lease tick) runs in a loop inside the web process. The wrapper
around the ASGI application also tells slotkeeper.shutdown when Daphne starts stopping, in both runs.

It is started as a task on Daphne's own event loop at the first request, so broadcasts sent from it reach the
in-memory channel layer on the loop that serves the websockets. Each round runs the same tasks beat would enqueue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from slotkeeper import shutdown
from slotkeeper.periodic import run_periodic

log = logging.getLogger(__name__)

_started = False


def periodic_round() -> None:
    close_old_connections()
    try:
        run_periodic()
    finally:
        close_old_connections()


async def loop_forever(interval: float) -> None:
    """Runs a round every `interval` seconds until shutdown begins, and ends as soon as it does: it does not wait
    for the round in hand, whose thread finishes the step it is in and stops (run_periodic checks between steps)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    unsubscribe = shutdown.on_begin(lambda: loop.call_soon_threadsafe(stopping.set))
    log.info("embedded periodic loop started", extra={"interval_s": interval})
    try:
        while not stopping.is_set():
            round_ = asyncio.ensure_future(sync_to_async(periodic_round, thread_sensitive=False)())
            stop = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({round_, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not round_.done():
                break  # shutdown began mid-round
            if round_.exception() is not None:
                # One bad round must not stop the loop: the next round retries, and the error is logged.
                log.error("embedded periodic round failed", exc_info=round_.exception())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), interval)
    finally:
        unsubscribe()
        log.info("embedded periodic loop stopped")


def with_embedded_loop(app):
    async def wrapper(scope, receive, send):
        global _started
        if not _started and scope["type"] in {"http", "websocket"}:
            _started = True
            # Under Daphne: hear SIGTERM before the loop stops, so nothing is queued on a loop that will not run.
            shutdown.watch_daphne()
            if settings.EMBEDDED_LOOP:
                asyncio.get_running_loop().create_task(loop_forever(settings.EMBEDDED_LOOP_INTERVAL_S))
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if shutdown.begun():
            # Draining (SIGTERM): a request that arrives now, on a connection kept alive, is refused before it does
            # anything, and its connection closed, so the client sends it again to another server.
            return await _refuse_while_stopping(send)
        # Counted while in flight: a SIGTERM answers these before the server stops (shutdown.drain), and each
        # answer closes its connection once shutdown has begun.
        shutdown.request_began()
        try:
            return await app(scope, receive, _closing(send))
        finally:
            shutdown.request_ended()

    return wrapper


def _closing(send):
    async def wrapped(message):
        if message["type"] == "http.response.start" and shutdown.begun():
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return wrapped


async def _refuse_while_stopping(send) -> None:
    body = b'{"detail": "the server is stopping; send the request again"}'
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
