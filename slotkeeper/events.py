"""Live updates: small "something changed" events, sent only after the transaction that caused them commits.

Consumers forward them to browsers, which re-fetch the affected partial. Sending after commit means a browser never
re-fetches before the change is visible, and a rolled-back change is never announced.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

CONSOLE_GROUP = "console"


def send_now(event: str, **payload: Any) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(CONSOLE_GROUP, {"type": "console.event", "event": event, **payload})
    except Exception:
        # A broadcast is a hint to re-fetch, never the record: losing one (Redis away) must not fail the write
        # that already committed. Consoles resync on reconnect and by their polling fallback.
        log.warning("broadcast failed", extra={"event": event}, exc_info=True)


def send_on_commit(event: str, **payload: Any) -> None:
    transaction.on_commit(lambda: send_now(event, **payload))
