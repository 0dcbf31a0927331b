"""The console hub's wire (slotkeeper/livewire.py), without a database or a server: batches encoded and framed once
for every console, written straight to Daphne's sockets, a lagging socket skipped, and lost broadcasts told apart
from late ones."""

from __future__ import annotations

import asyncio
import collections
import functools
import json

import pytest

from slotkeeper import livewire
from slotkeeper.consumers import Hub


class Transport:
    """Twisted's TCP transport as livewire uses it: what writeSomeData took, and what is still buffered."""

    def __init__(self, backlog: int = 0) -> None:
        self.dataBuffer = b"x" * backlog
        self.offset = 0
        self._tempDataLen = 0
        self.connected = True
        self.disconnecting = False
        self.sent: list[bytes] = []
        self.queued: list[bytes] = []

    def writeSomeData(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def write(self, data: bytes) -> None:
        self.queued.append(data)


class Protocol:
    """Daphne's websocket protocol (autobahn's) as livewire uses it."""

    STATE_OPEN = 3
    _perMessageCompress = None

    def __init__(self, transport: Transport) -> None:
        self.state = self.STATE_OPEN
        self.transport = transport
        self.send_queue: collections.deque = collections.deque()

    def sendPreparedMessage(self, prepared) -> None:
        self.transport.write(prepared.payloadHybi)


class Server:
    def __init__(self) -> None:
        self.connections: dict = {}

    async def handle_reply(self, protocol, message) -> None:
        raise AssertionError("the hub must not go through Daphne's reply dispatch")


class Console:
    def __init__(self, server: Server, protocol: Protocol) -> None:
        self.socket = (server, protocol)
        server.connections[protocol] = {}


def text_of(frame: bytes) -> dict:
    """The JSON of one unmasked text frame (RFC 6455 5.2)."""
    assert frame[0] == 0x81  # FIN, text
    length, start = frame[1] & 0x7F, 2
    if length == 126:
        length, start = int.from_bytes(frame[2:4], "big"), 4
    assert frame[1] & 0x80 == 0  # a server's frame is not masked
    return json.loads(frame[start : start + length])


def consoles(count: int, **transport) -> tuple[list[Console], list[Transport]]:
    server = Server()
    transports = [Transport(**transport) for _ in range(count)]
    return [Console(server, Protocol(t)) for t in transports], transports


async def test_a_batch_is_encoded_and_framed_once_for_every_console(monkeypatch):
    made = []
    real = livewire.Frame.batch.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(livewire.Frame, "batch", classmethod(lambda cls, *a: made.append(1) or real(cls, *a)))
    hub = Hub()
    fifty, transports = consoles(50)
    hub.consoles.update(fifty)  # type: ignore[arg-type]
    hub.take({"events": [{"event": "node-changed", "node": n} for n in (3, 8, 3)], "sender": "a", "n": 1})
    await hub.flusher
    assert len(made) == 1
    frames = [t.sent for t in transports]
    assert all(len(f) == 1 for f in frames)
    # One bytes object, the same for all fifty: nothing was encoded or framed per console.
    assert len({id(f[0]) for f in frames}) == 1
    assert text_of(frames[0][0]) == {
        "event": "batch",
        "seq": 1,
        "changed": {"node-changed": [{"node": 3}, {"node": 8}]},
    }


async def test_a_console_whose_socket_lags_is_skipped_and_sees_the_gap_in_the_next_batch():
    hub = Hub()
    (keeping_up, lagging), (fast, slow) = consoles(2)
    hub.consoles.update({keeping_up, lagging})  # type: ignore[arg-type]
    slow.dataBuffer = b"x" * (livewire.MAX_BACKLOG_BYTES + 1)
    await hub.send(livewire.Frame.batch(1, {"lease-changed": {("lease", "1"): {"lease": 1}}}))
    slow.dataBuffer = b""
    await hub.send(livewire.Frame.batch(2, {"lease-changed": {("lease", "2"): {"lease": 2}}}))
    assert [text_of(f)["seq"] for f in fast.sent] == [1, 2]
    assert [text_of(f)["seq"] for f in slow.sent] == [2]  # 1 never went: the page resyncs on 2
    assert slow.queued == []  # and nothing was buffered for it meanwhile


def test_a_frame_goes_behind_bytes_twisted_still_holds_never_before_them():
    transport = Transport()
    transport._tempDataLen = 10  # a hello still queued by the ordinary path
    livewire.send_now(transport, b"batch")
    assert transport.sent == [] and transport.queued == [b"batch"]


def test_a_partial_send_queues_the_rest():
    transport = Transport()
    transport.writeSomeData = lambda data: 2  # type: ignore[method-assign]
    livewire.send_now(transport, b"abcdef")
    assert transport.queued == [b"cdef"]


@pytest.mark.django_db  # the auth middleware closes old connections before it looks the user up
async def test_daphne_s_socket_is_found_behind_channels_session_and_auth_middleware():
    from channels.auth import AuthMiddlewareStack

    found = {}

    async def app(scope, receive, send):
        found["socket"] = livewire.daphne_socket(send)

    server, protocol = Server(), Protocol(Transport())
    stack = AuthMiddlewareStack(app)
    await stack({"type": "websocket", "headers": [], "path": "/ws/console/"}, None,
                functools.partial(server.handle_reply, protocol))  # fmt: skip
    assert found["socket"] == (server, protocol)


async def test_any_other_server_s_send_is_left_alone():
    async def send(message):
        pass

    assert livewire.daphne_socket(send) is None


@pytest.mark.parametrize(
    ("heard", "later", "lost"),
    [
        # (sender, n) in the order heard; whether anything counts as lost at once, and LATE_S later.
        ([("a", 1), ("a", 2), ("a", 3)], False, False),
        ([("a", 5), ("a", 6)], False, False),  # joined mid-stream: the first number heard is where it starts
        ([("a", 1), ("a", 3), ("a", 2)], False, False),  # two threads of one sender, the other way round
        ([("a", 1), ("a", 3)], False, True),  # 2 never came
        ([("a", 1), ("b", 1), ("a", 2), ("b", 3)], False, True),  # b's 2 never came
        ([("a", 1), ("a", 5000)], True, True),  # thousands gone: no point waiting
    ],
)
def test_a_broadcast_is_lost_when_a_later_one_of_its_sender_came_and_it_did_not_within_late_s(
    heard, later, lost
):
    senders = livewire.Senders()
    at_once = any([senders.heard(sender, n, now=100.0) for sender, n in heard])
    assert at_once is later
    assert (at_once or senders.lost(now=100.0 + livewire.LATE_S)) is lost


def test_a_loss_is_reported_once():
    senders = livewire.Senders()
    for n in (1, 3):
        senders.heard("a", n, now=0.0)
    assert senders.lost(now=livewire.LATE_S) is True
    assert senders.lost(now=2 * livewire.LATE_S) is False
    assert senders.heard("a", 2, now=3.0) is False  # the late one, after all: already resynced, no second gap


async def test_a_lost_broadcast_makes_the_next_batch_skip_a_number(monkeypatch):
    monkeypatch.setattr(livewire, "LATE_S", 0.3)  # well past the coalescing window, so 3 has left before
    hub = Hub()
    [console], [transport] = consoles(1)
    hub.consoles.add(console)  # type: ignore[arg-type]
    hub.take({"events": [{"event": "lease-changed", "lease": 1}], "sender": "a", "n": 1})
    await hub.flusher
    hub.take({"events": [{"event": "lease-changed", "lease": 3}], "sender": "a", "n": 3})
    await hub.flusher
    await asyncio.sleep(0.6)  # 2 does not come: the hub says so with no event to carry
    await hub.flusher
    assert [(m["seq"], m["changed"]) for m in map(text_of, transport.sent)] == [
        (1, {"lease-changed": [{"lease": 1}]}),
        (2, {"lease-changed": [{"lease": 3}]}),
        (4, {}),
    ]
