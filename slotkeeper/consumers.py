"""The console's websocket: authenticated users receive small "something changed" events; the page re-fetches the
affected partial over HTTP, so rendering stays in ordinary views.

Fan-out is per process, not per connection: one hub per Daphne process is the only member of the console group.
It receives each batch once, coalesces what arrives within COALESCE_S (the first change after a quiet spell goes
at once), serialises and frames it once, and writes the same bytes to every console of the process
(slotkeeper/livewire.py). With a group member per console, every console received, parsed and handled every event
itself (with a thread hop per message), and at 1,000 changes/s for 100 consoles Daphne fell 15 s behind and the
channel layer dropped 39 % of the events as expired (bench/bench_console_ws.py).

Batches are numbered per hub, and the hello says where a console starts: a console that sees a number skipped
re-fetches everything. The hub skips one itself when a broadcast never reached it (the channel layer drops them
silently past `expiry` or `capacity`) or when it could not write to a console that lags.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from slotkeeper import livewire, metrics
from slotkeeper.events import CONSOLE_GROUP
from slotkeeper.roles import role_of

log = logging.getLogger(__name__)

# 25 ms: a change that follows another waits at most this long, a quarter of the 100 ms budget (issue 13). At 50 ms
# the window alone was half of it; with the batch framed once and written straight to the sockets, twice the
# messages cost Daphne about the same CPU in all (bench/bench_console_ws.py, variant window50).
COALESCE_S = 0.025
# Close code for "the live channel is away, try again later": the page falls back to polling and reconnects.
# 4013, the private-use mirror of the standard 1013: Daphne's websocket library (autobahn) sends only 1000 and
# 3000-4999 and raises on anything else, so a close with 1013 never left the server and the console stayed open
# on a hub that no longer received anything.
TRY_AGAIN_LATER = 4013
# What the channel layer raises when it is away. channels_redis lets redis-py's errors through, and
# redis.exceptions.ConnectionError derives from RedisError, not from the builtin ConnectionError: catching only
# ConnectionError/OSError let a stopped Redis fail every console handshake with HTTP 500. TimeoutError: our own
# bound on joining (JOIN_TIMEOUT_S) and redis-py's socket timeouts.
LAYER_AWAY: tuple[type[BaseException], ...] = (RedisError, ConnectionError, OSError, TimeoutError)
# A Redis that hangs rather than refuses must not hold a handshake open for ever.
JOIN_TIMEOUT_S = 5.0
GAUGE = "slotkeeper_websocket_clients"


class Hub:
    """This process's single member of the console group, for one event loop (see the module docstring).

    Everything a hub holds belongs to the loop it runs on: its receive task, its flush task, and inside the channel
    layer the receive lock that channels_redis binds to the loop of its first contended waiter. So there is one
    hub per event loop (`hub()`), and a hub stops receiving and leaves the group when its last console leaves.
    Before, one hub served every loop of the process: a test's second loop (or a restarted server's) met the
    first loop's receive still registered in the layer, and a console's disconnect failed now and then with
    "Lock ... is bound to a different event loop" (channels_redis keeps one receive lock per layer).

    Its batches are numbered (`seq`, slotkeeper/livewire.py). A broadcast the channel layer lost (heard of by the
    numbers each sender puts on its broadcasts) makes the next batch skip a number, and so does a console the hub
    had to skip: either way the console sees the gap and re-fetches everything, rather than keeping a stale
    fragment until the next change of its kind.
    """

    def __init__(self) -> None:
        self.consoles: set[ConsoleConsumer] = set()
        # kind -> event identity -> the event without its kind: deduplicated as it arrives.
        self.pending: dict[str, dict[tuple, dict]] = {}
        self.seq = 0
        self.missed = False
        self.senders = livewire.Senders()
        self.channel: str | None = None
        self.receiver: asyncio.Task | None = None
        self.flusher: asyncio.Task | None = None
        self.late_check: asyncio.TimerHandle | None = None
        self.last_flush = 0.0
        # Created on the loop the hub belongs to, and used only there.
        self.lock = asyncio.Lock()

    async def join(self, console: ConsoleConsumer) -> None:
        """Raises one of LAYER_AWAY when the channel layer is away (the console is then closed, TRY_AGAIN_LATER)."""
        async with self.lock:
            if self.receiver is None or self.receiver.done():
                layer = get_channel_layer()
                if self.channel is not None:
                    # The previous receiver died with the layer: its group member would otherwise linger and
                    # fill up with batches nobody reads when the same Redis comes back with its data.
                    stale, self.channel = self.channel, None
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(layer.group_discard(CONSOLE_GROUP, stale), 2)
                channel = await layer.new_channel()
                await asyncio.wait_for(layer.group_add(CONSOLE_GROUP, channel), JOIN_TIMEOUT_S)
                self.channel = channel
                self.receiver = asyncio.get_running_loop().create_task(self._receive(layer, channel))
            self.consoles.add(console)

    async def leave(self, console: ConsoleConsumer) -> None:
        async with self.lock:
            self.consoles.discard(console)
            if not self.consoles:
                await self._stop()

    async def _stop(self) -> None:
        """No console is left: stop receiving and leave the group, so nothing of this loop stays registered in
        the channel layer, and no group member lingers that nobody reads (each would hold up to the layer's
        capacity of messages until they expire)."""
        receiver, self.receiver = self.receiver, None
        if receiver is not None and not receiver.done():
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiver
        channel, self.channel = self.channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                # Bounded: the layer may be the thing that went away.
                await asyncio.wait_for(get_channel_layer().group_discard(CONSOLE_GROUP, channel), 2)
        if self.flusher is not None and self.flusher.done():
            self.flusher = None
        if self.late_check is not None:
            self.late_check.cancel()
            self.late_check = None
        # Whoever joins next starts from its hello and a resync: what was heard before means nothing to it.
        self.pending, self.senders, self.missed = {}, livewire.Senders(), False

    async def _receive(self, layer, channel: str) -> None:
        try:
            while True:
                message = await layer.receive(channel)
                try:
                    self.take(message)
                except Exception:
                    # One malformed message is dropped (its sender's count shows the consoles a gap); only the
                    # layer failing below closes every console.
                    log.warning("console hub dropped a message it could not read", exc_info=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The layer went away (Redis stopped). Every console is told to come back later; when they reconnect,
            # joining makes a new receiver once the layer answers again, and the pages resync on connect.
            consoles, self.consoles = list(self.consoles), set()
            log.warning(
                "console hub lost the channel layer: closing %d consoles", len(consoles), exc_info=True
            )
            for console in consoles:
                try:
                    await console.close(code=TRY_AGAIN_LATER)
                except Exception:
                    log.warning("could not close a console", exc_info=True)

    def take(self, message: dict) -> None:
        """One group message: its events into the pending batch, its number into the record of each sender."""
        for payload in message.get("events") or []:
            kind = payload.get("event")
            if not kind:
                continue
            rest = {k: v for k, v in payload.items() if k != "event"}
            self.pending.setdefault(kind, {})[livewire.key(rest)] = rest
        if self.senders.heard(message.get("sender"), message.get("n")):
            self.missed = True
        if self.senders.waiting() and self.late_check is None:
            self.late_check = asyncio.get_running_loop().call_later(livewire.LATE_S, self._check_late)
        self._kick()

    def _check_late(self) -> None:
        self.late_check = None
        if self.senders.lost():
            self.missed = True
            self._kick()
        if self.senders.waiting():
            self.late_check = asyncio.get_running_loop().call_later(livewire.LATE_S, self._check_late)

    def _kick(self) -> None:
        if (self.pending or self.missed) and (self.flusher is None or self.flusher.done()):
            self.flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        # The first change after a quiet spell goes out at once; a burst is coalesced into one message per window.
        wait = self.last_flush + COALESCE_S - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        while self.pending or self.missed:
            # A lost broadcast skips a number, so every console sees the gap and resyncs.
            self.seq += 2 if self.missed else 1
            frame = livewire.Frame.batch(self.seq, self.pending)
            self.pending, self.missed = {}, False
            await self.send(frame)
            self.last_flush = time.monotonic()
            if self.pending or self.missed:  # arrived while sending: keep the window, then send them too
                await asyncio.sleep(COALESCE_S)

    async def send(self, frame: livewire.Frame) -> None:
        """The same frame to every console: written straight to the sockets Daphne serves (no await, no copy),
        through channels' ordinary send for any other server (tests' communicators)."""
        others = []
        for console in list(self.consoles):
            if console.socket is None:
                others.append(console.send(text_data=frame.text))
                continue
            try:
                livewire.write(*console.socket, frame)
            except Exception:
                log.warning("could not write a batch to a console", exc_info=True)
        if others:
            await asyncio.gather(*others, return_exceptions=True)


# One hub per event loop. Weak keys: a loop that is gone (a finished test's) takes its hub with it.
_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """The hub of the running event loop (Daphne has one loop, so one hub per process)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub()
    return found


class ConsoleConsumer(AsyncWebsocketConsumer):
    # No channel of its own: the hub receives for every console of the process. With the default alias, channels
    # gives each consumer a channel and keeps a receive on it open for the consumer's life; when Redis stopped,
    # that receive raised inside the consumer, Daphne closed the socket with 1011 (not the "try again later" the page expects)
    # and never called disconnect(), so the client gauge kept counting the dead socket. An alias that names no
    # layer makes channels leave the layer to the hub.
    channel_layer_alias = "console-consumers-use-the-hub"

    counted = False
    # (Daphne's server, this connection's protocol) when Daphne serves it: the hub writes batches there directly.
    socket: tuple | None = None

    async def __call__(self, scope, receive, send):
        # Every way out of a console, a close the client sent, one the hub sent, or the consumer failing, ends
        # here, once: so the gauge is decremented exactly for the sockets it counted, and the hub forgets this
        # console even when disconnect() was never called.
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._forget()

    async def connect(self):
        user = self.scope.get("user")
        role = await database_sync_to_async(role_of)(user) if user is not None else None
        if role is None:
            # 4401: the page shows "signed out" and stops reconnecting.
            await self.close(code=4401)
            return
        try:
            await hub().join(self)
        except LAYER_AWAY:
            # The channel layer (Redis) is away: refuse with "try again later" rather than failing the handshake
            # with a 500; the page falls back to polling and reconnects with backoff. Accepted first, uncounted:
            # a handshake refused before accept reaches the browser as HTTP 403 and close code 1006, and the page
            # could not tell "Redis is away" from "the server is gone".
            log.warning("console refused: the channel layer is away", exc_info=True)
            await self.accept()
            await self.close(code=TRY_AGAIN_LATER)
            return
        await self.accept()
        metrics.add_gauge(GAUGE, 1)
        self.counted = True
        self.socket = livewire.daphne_socket(self.base_send)
        # `seq`: the batch this console heard last, so the next one it hears is seq + 1 unless it missed one.
        await self.send(text_data=json.dumps({"event": "hello", "role": role, "seq": hub().seq}))

    async def disconnect(self, code):
        await self._forget()

    async def _forget(self) -> None:
        if self.counted:
            self.counted = False
            metrics.add_gauge(GAUGE, -1)
        with contextlib.suppress(Exception):
            await hub().leave(self)

    async def receive(self, text_data=None, bytes_data=None):
        if text_data == "ping":
            await self.send(text_data="pong")
