"""Live updates: small "something changed" events, sent only after the transaction that caused them commits.

Consumers forward them to browsers, which re-fetch the affected partial. Sending after commit means a browser never
re-fetches before the change is visible, and a rolled-back change is never announced. The events of one transaction
leave as ONE batch message (deduplicated), so a bulk approval of 500 moves is one channel-layer call, not 1,500.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import threading
import uuid
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from slotkeeper import shutdown

log = logging.getLogger(__name__)

CONSOLE_GROUP = "console"
_BUFFER = "_slotkeeper_events"
# The longest a committed write waits for its broadcast. A healthy Redis answers in a millisecond; a layer that
# hangs (Redis half away, a full capacity) costs the request this much once, never more.
SEND_TIMEOUT_S = 2.0
# Every broadcast carries (sender, n), n counting up from 1 in each process, so a console hub can tell a batch that
# never reached it (the channel layer drops group messages still queued after its `expiry`, or past its `capacity`,
# without telling anyone) from one that is merely late, and have its consoles resync. The id is made per process
# id, on first use: Celery's prefork children inherit the module, and two children counting under one id would
# look like gaps to every hub.
_sender: tuple[int, str, itertools.count] | None = None
_sender_lock = threading.Lock()


def _number() -> tuple[str, int]:
    global _sender
    with _sender_lock:
        if _sender is None or _sender[0] != os.getpid():
            _sender = (os.getpid(), f"{os.getpid()}-{uuid.uuid4().hex[:8]}", itertools.count(1))
        return _sender[1], next(_sender[2])


def send_batch(events: list[dict[str, Any]]) -> None:
    """Broadcasts one batch to every console; returns within SEND_TIMEOUT_S (plus a second) whatever the layer
    does, and never raises. A broadcast is a hint to re-fetch, never the record: losing one (Redis away, the
    process stopping) must not fail or hold up the write that already committed. Consoles resync on reconnect
    and by their polling fallback."""
    layer = get_channel_layer()
    if layer is None or not events:
        return
    if shutdown.begun():
        # The server's loop is stopping or stopped: a send queued on it would never run (see slotkeeper/shutdown).
        log.info("broadcast skipped: shutting down", extra={"events": len(events)})
        return
    try:
        sender, n = _number()
        message = {"type": "console.event", "events": events, "sender": sender, "n": n}
        _send_bounded(layer, message, SEND_TIMEOUT_S)
    except Exception:
        log.warning("broadcast failed", extra={"events": len(events)}, exc_info=True)


def _send_bounded(layer, message: dict[str, Any], timeout: float) -> None:
    async def send() -> None:
        await asyncio.wait_for(layer.group_send(CONSOLE_GROUP, message), timeout)

    loop = _serving_loop()
    if loop is None:
        # No loop serves this thread (a Celery task, a management command): async_to_sync runs the send on a
        # private loop of its own, where the wait_for above fires.
        async_to_sync(send)()
        return
    if not loop.is_running():
        # The loop this request came from has stopped (the server is on its way out): a send queued there would
        # wait forever, which is what async_to_sync does.
        raise RuntimeError("the event loop of this request has stopped")
    # On the serving loop, because the in-memory layer's queues belong to it. The wait here is bounded too: the
    # loop may stop between the check above and the send, and then the wait_for never fires.
    future = asyncio.run_coroutine_threadsafe(send(), loop)
    try:
        future.result(timeout + 1)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the broadcast did not finish in {timeout + 1:g} s") from None


def _serving_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop whose sync_to_async thread this is (Daphne's, a test's), as async_to_sync finds it."""
    if getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) != os.getpid():
        return None
    return getattr(SyncToAsync.threadlocal, "main_event_loop", None)


def send_now(event: str, **payload: Any) -> None:
    send_batch([{"event": event, **payload}])


def _flush(connection) -> None:
    events = connection.__dict__.pop(_BUFFER, [])
    unique = list({tuple(sorted((k, str(v)) for k, v in e.items())): e for e in events}.values())
    send_batch(unique)


def send_on_commit(event: str, **payload: Any) -> None:
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        send_now(event, **payload)
        return
    # One flush per transaction. If the flush is no longer registered (the savepoint or transaction that
    # registered it rolled back), the buffered events belonged to that rolled-back work: start afresh.
    registered = any(getattr(func, "_slotkeeper_flush", False) for _, func, _ in connection.run_on_commit)
    if not registered:
        connection.__dict__[_BUFFER] = []

        def flush() -> None:
            _flush(connection)

        flush._slotkeeper_flush = True  # type: ignore[attr-defined]
        transaction.on_commit(flush)
    # setdefault: a flush that already ran (a test's captured on-commit hooks run it before the transaction ends)
    # took the buffer with it.
    connection.__dict__.setdefault(_BUFFER, []).append({"event": event, **payload})
