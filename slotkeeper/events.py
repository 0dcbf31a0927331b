"""Live updates: small "something changed" events, sent only after the transaction that caused them commits.

Consumers forward them to browsers, which re-fetch the affected partial. Sending after commit means a browser never
re-fetches before the change is visible, and a rolled-back change is never announced. The events of one transaction
leave as ONE batch message (deduplicated), so a bulk approval of 500 moves is one channel-layer call, not 1,500.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

CONSOLE_GROUP = "console"
_BUFFER = "_slotkeeper_events"


def send_batch(events: list[dict[str, Any]]) -> None:
    layer = get_channel_layer()
    if layer is None or not events:
        return
    try:
        async_to_sync(layer.group_send)(CONSOLE_GROUP, {"type": "console.event", "events": events})
    except Exception:
        # A broadcast is a hint to re-fetch, never the record: losing one (Redis away) must not fail the write
        # that already committed. Consoles resync on reconnect and by their polling fallback.
        log.warning("broadcast failed", extra={"events": len(events)}, exc_info=True)


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
    connection.__dict__[_BUFFER].append({"event": event, **payload})
