"""Embedded mode: the periodic work (node sweep, lease tick) runs in a loop inside the web process.

It is started as a task on Daphne's own event loop at the first request, so broadcasts sent from it reach the
in-memory channel layer on the loop that serves the websockets. Each round runs the same tasks beat would enqueue.
"""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

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
    log.info("embedded periodic loop started", extra={"interval_s": interval})
    while True:
        try:
            await sync_to_async(periodic_round, thread_sensitive=False)()
        except Exception:
            # One bad round must not stop the loop: the next round retries, and the error is logged with context.
            log.exception("embedded periodic round failed")
        await asyncio.sleep(interval)


def with_embedded_loop(app):
    async def wrapper(scope, receive, send):
        global _started
        if not _started and settings.EMBEDDED_LOOP and scope["type"] in {"http", "websocket"}:
            _started = True
            asyncio.get_running_loop().create_task(loop_forever(settings.EMBEDDED_LOOP_INTERVAL_S))
        return await app(scope, receive, send)

    return wrapper
