"""The console's websocket: authenticated users receive small "something changed" events; the page re-fetches the
affected partial over HTTP, so rendering stays in ordinary views.

Fan-out is per process, not per connection: one hub per Daphne process is the only member of the console group.
It receives each batch once, coalesces what arrives within COALESCE_S, serialises it once and writes the same text
to every console of the process. With a group member per console, every console received, parsed and handled
every event itself (with a thread hop per message), and at 1,000 changes/s for 100 consoles Daphne fell 15 s
behind and the channel layer dropped 39 % of the events as expired (bench/bench_console_ws.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer

from slotkeeper import metrics
from slotkeeper.events import CONSOLE_GROUP
from slotkeeper.roles import role_of

log = logging.getLogger(__name__)

COALESCE_S = 0.05
# Close code for "the live channel is away, try again later": the page falls back to polling and reconnects.
TRY_AGAIN_LATER = 1013


class Hub:
    """This process's single member of the console group (see the module docstring)."""

    def __init__(self) -> None:
        self._reset(None)

    def _reset(self, loop) -> None:
        self.loop = loop
        self.consoles: set[ConsoleConsumer] = set()
        self.pending: dict[tuple, dict] = {}
        self.receiver: asyncio.Task | None = None
        self.flusher: asyncio.Task | None = None
        self.last_flush = 0.0

    async def join(self, console: ConsoleConsumer) -> None:
        """Raises ConnectionError/OSError when the channel layer is away (the console then closes with 1013)."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self._reset(
                loop
            )  # a new event loop (a test, a restarted server): nothing of the old one is usable
        if self.receiver is None or self.receiver.done():
            layer = get_channel_layer()
            channel = await layer.new_channel()
            await layer.group_add(CONSOLE_GROUP, channel)
            self.receiver = loop.create_task(self._receive(layer, channel))
        self.consoles.add(console)

    def leave(self, console: ConsoleConsumer) -> None:
        self.consoles.discard(console)

    async def _receive(self, layer, channel: str) -> None:
        try:
            while True:
                message = await layer.receive(channel)
                for payload in message.get("events") or []:
                    self.pending[tuple(sorted((k, str(v)) for k, v in payload.items()))] = payload
                if self.flusher is None or self.flusher.done():
                    self.flusher = asyncio.get_running_loop().create_task(self._flush())
        except asyncio.CancelledError:
            raise
        except Exception:
            # The layer went away (Redis stopped). Every console is told to come back later; when they reconnect,
            # joining makes a new receiver once the layer answers again, and the pages resync on connect.
            log.warning("console hub lost the channel layer", exc_info=True)
            for console in list(self.consoles):
                with contextlib.suppress(Exception):
                    await console.close(code=TRY_AGAIN_LATER)
            self.consoles.clear()

    async def _flush(self) -> None:
        # The first change after a quiet spell goes out at once; a burst is coalesced into one message per window.
        wait = self.last_flush + COALESCE_S - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        while self.pending:
            batch, self.pending = list(self.pending.values()), {}
            text = json.dumps({"event": "batch", "events": batch})
            consoles = list(self.consoles)
            await asyncio.gather(*(c.send(text_data=text) for c in consoles), return_exceptions=True)
            self.last_flush = time.monotonic()
            if self.pending:  # arrived while sending: keep the window, then send them too
                await asyncio.sleep(COALESCE_S)


HUB = Hub()


class ConsoleConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        role = await database_sync_to_async(role_of)(user) if user is not None else None
        if role is None:
            # 4401: the page shows "signed out" and stops reconnecting.
            await self.close(code=4401)
            return
        try:
            await HUB.join(self)
        except (ConnectionError, OSError):
            # The channel layer (Redis) is away: refuse with "try again later" rather than failing the handshake
            # with a 500; the page falls back to polling and reconnects with backoff.
            await self.close(code=TRY_AGAIN_LATER)
            return
        await self.accept()
        metrics.add_gauge("slotkeeper_websocket_clients", 1)
        self.counted = True
        await self.send(text_data=json.dumps({"event": "hello", "role": role}))

    async def disconnect(self, code):
        HUB.leave(self)
        if getattr(self, "counted", False):
            metrics.add_gauge("slotkeeper_websocket_clients", -1)
            self.counted = False

    async def receive(self, text_data=None, bytes_data=None):
        if text_data == "ping":
            await self.send(text_data="pong")
