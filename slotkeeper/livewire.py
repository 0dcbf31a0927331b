"""What the console hub puts on the wire, and how: one batch encoded once and framed once for every console of the
process, and the gaps that tell a console it missed something.

The message a console receives:

    {"event": "batch", "seq": 17, "changed": {"node-changed": [{"node": 3}, {"node": 8}], "slots-changed": [{}]}}

`seq` counts the hub's batches (one hub per Daphne process, slotkeeper/consumers.py); a console that sees a number
other than the last one plus one missed a batch and re-fetches everything. The events of a kind are listed once
under the kind, without repeating it in each: a node-changed event was 36 bytes of JSON as {"event": "node-changed",
"node": 3} and is 10 as {"node":3}, and the browser only looks at the kinds.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from typing import Any

# A console whose socket still holds this much unsent (a browser that stopped reading, a slow link) is skipped
# rather than buffered for without bound; the gap in `seq` makes it resync when it reads again.
MAX_BACKLOG_BYTES = 1 << 20
# A broadcast that has not arrived this long after a later one from the same sender is taken as lost. Not at
# once: two threads of one process (two requests of one Daphne) can reach the channel layer in the other order.
LATE_S = 1.0


def key(payload: dict[str, Any]) -> tuple:
    """Identity of an event within a batch: two node-changed for node 3 are one. Its own items where they hash
    (ids, the common case: no str() per value on the hub's path for every event), their text where they do not
    (slots-changed carries a list of leases)."""
    try:
        found = tuple(sorted(payload.items()))
        hash(found)
    except TypeError:
        return tuple(sorted((k, str(v)) for k, v in payload.items()))
    return found


@dataclass
class Frame:
    """One batch, serialised once. `data` is the UTF-8 text every console receives; `wire` the whole websocket
    frame, built on first use and then written as it is to every socket Daphne serves."""

    text: str
    data: bytes
    _prepared: Any = field(default=None, repr=False)

    @classmethod
    def batch(cls, seq: int, changed: dict[str, dict[tuple, dict]]) -> Frame:
        body = {kind: list(items.values()) for kind, items in changed.items()}
        text = json.dumps({"event": "batch", "seq": seq, "changed": body}, separators=(",", ":"))
        return cls(text, text.encode())

    def prepared(self):
        if self._prepared is None:
            from autobahn.websocket.protocol import PreparedMessage

            # A server's frames are not masked (RFC 6455 5.1), so the same bytes serve every connection.
            self._prepared = PreparedMessage(self.data, False, False, False)
        return self._prepared


def daphne_socket(send) -> tuple[Any, Any] | None:
    """(Daphne's server, the connection's autobahn protocol) behind an ASGI `send`, or None when `send` is
    anything else (channels' test communicator, another server).

    Daphne hands each application `partial(server.handle_reply, protocol)`; channels' session middleware wraps it
    in a bound method that keeps it as `real_send` (and saves sessions only for HTTP responses, never for a
    websocket.send). Going to the protocol directly skips, per console and message, the middleware, Daphne's reply
    dispatch, autobahn's framing and UTF-8 encoding of the same text, and the debug-log arguments autobahn
    formats even with debug off: together most of Daphne's CPU per console message (bench/bench_console_ws.py).
    """
    for _ in range(8):
        if isinstance(send, functools.partial):
            server = getattr(send.func, "__self__", None)
            protocol = send.args[0] if send.args else None
            if (
                server is not None
                and hasattr(server, "connections")
                and hasattr(protocol, "sendPreparedMessage")
            ):
                return server, protocol
            return None
        send = getattr(getattr(send, "__self__", None), "real_send", None)
        if send is None:
            return None
    return None


def backlog(transport) -> int:
    """Bytes Twisted still holds for this socket (written, not yet accepted by the kernel)."""
    try:
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    except (AttributeError, TypeError):
        return 0


def write(server, protocol, frame: Frame) -> bool:
    """Writes `frame` to one Daphne websocket; False when it was not sent (closed, not yet open, or too far
    behind), so the caller counts it as missed."""
    connection = server.connections.get(protocol)
    if connection is None or connection.get("disconnected") or protocol.state != protocol.STATE_OPEN:
        return False
    transport = protocol.transport
    if transport is None or backlog(transport) > MAX_BACKLOG_BYTES:
        return False
    if getattr(protocol, "_perMessageCompress", None) is None and not getattr(protocol, "send_queue", None):
        send_now(transport, frame.prepared().payloadHybi)
    else:
        protocol.sendPreparedMessage(frame.prepared())
    return True


def send_now(transport, data: bytes) -> None:
    """Hands `data` to the kernel at once when Twisted holds nothing else for this socket; else queues it behind.

    `transport.write` only queues: the socket is registered for writing, the reactor's next turn sends, and then
    unregisters it. Per console and batch that was two epoll_ctl calls and a loop turn, the largest share of
    Daphne's CPU left after the framing (bench/bench_console_ws.py, cProfile). Twisted's own `writeSomeData` does
    the send (it returns how much went, or the ConnectionLost it met); the rest, or everything on a transport
    without it (TLS), goes through `write` as before, so the order of bytes on the socket never changes."""
    some = getattr(transport, "writeSomeData", None)
    if some is None or backlog(transport) or not transport.connected or transport.disconnecting:
        transport.write(data)
        return
    sent = some(data)
    if not isinstance(sent, int):
        transport.write(data)  # the connection is going: let Twisted find out on its own path
    elif sent < len(data):
        transport.write(data[sent:])


@dataclass
class Senders:
    """The broadcasts heard from each sender (slotkeeper/events.py numbers them per process): `heard` says whether
    one went missing, that is whether some number below the highest heard has stayed unheard for LATE_S."""

    expected: dict[str, int] = field(default_factory=dict)
    holes: dict[tuple[str, int], float] = field(default_factory=dict)
    heard_at: dict[str, float] = field(default_factory=dict)

    def heard(self, sender: str | None, n: int | None, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if sender is not None and n is not None:
            self.heard_at[sender] = now
            expected = self.expected.get(sender)
            if expected is None:
                # The first heard from this sender (a hub that just joined, a sender that just started): no gap.
                self.expected[sender] = n + 1
            elif n >= expected:
                if n - expected > 1000:
                    self.holes[(sender, expected)] = now - LATE_S  # a lot is gone: no need to wait
                else:
                    for missing in range(expected, n):
                        self.holes[(sender, missing)] = now
                self.expected[sender] = n + 1
            else:
                self.holes.pop((sender, n), None)
        return self.lost(now)

    def lost(self, now: float | None = None) -> bool:
        """True (once) when a hole has waited LATE_S: that broadcast is gone."""
        now = time.monotonic() if now is None else now
        gone = [hole for hole, since in self.holes.items() if now - since >= LATE_S]
        for hole in gone:
            del self.holes[hole]
        if len(self.heard_at) > 256:
            # Senders come and go (Celery children, restarted servers): forget those silent for ten minutes.
            for sender, at in list(self.heard_at.items()):
                if now - at > 600:
                    del self.heard_at[sender]
                    self.expected.pop(sender, None)
        return bool(gone)

    def waiting(self) -> bool:
        return bool(self.holes)
