"""The console's websocket: authenticated viewers join one group and receive small "something changed" events.

Consumers stay thin: the page re-fetches the affected partial over HTTP, so rendering stays in ordinary views.
Events are coalesced per connection for a short window, so a burst of heartbeats becomes one message per kind and
object rather than a storm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from slotkeeper import metrics
from slotkeeper.events import CONSOLE_GROUP
from slotkeeper.roles import role_of

COALESCE_S = 0.05


class ConsoleConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        role = await database_sync_to_async(role_of)(user) if user is not None else None
        if role is None:
            # 4401: the page shows "signed out" and stops reconnecting.
            await self.close(code=4401)
            return
        self.pending: dict[tuple, dict] = {}
        self.flush_task: asyncio.Task | None = None
        try:
            await self.channel_layer.group_add(CONSOLE_GROUP, self.channel_name)
        except (ConnectionError, OSError):
            # The channel layer (Redis) is away: close with 1013 "try again later" rather than failing the
            # handshake with a 500; the page falls back to polling and reconnects with backoff.
            await self.close(code=1013)
            return
        await self.accept()
        metrics.add_gauge("slotkeeper_websocket_clients", 1)
        self.counted = True
        await self.send(text_data=json.dumps({"event": "hello", "role": role}))

    async def disconnect(self, code):
        if getattr(self, "counted", False):
            metrics.add_gauge("slotkeeper_websocket_clients", -1)
            self.counted = False
        # Redis away: its group membership expires on its own.
        with contextlib.suppress(ConnectionError, OSError):
            await self.channel_layer.group_discard(CONSOLE_GROUP, self.channel_name)
        if getattr(self, "flush_task", None):
            self.flush_task.cancel()

    async def receive(self, text_data=None, bytes_data=None):
        if text_data == "ping":
            await self.send(text_data="pong")

    async def console_event(self, message):
        for payload in message.get("events") or [{k: v for k, v in message.items() if k != "type"}]:
            key = tuple(sorted((k, str(v)) for k, v in payload.items()))
            self.pending[key] = payload
        if self.flush_task is None or self.flush_task.done():
            self.flush_task = asyncio.create_task(self._flush_soon())

    async def _flush_soon(self):
        await asyncio.sleep(COALESCE_S)
        batch, self.pending = list(self.pending.values()), {}
        if batch:
            await self.send(text_data=json.dumps({"event": "batch", "events": batch}))
