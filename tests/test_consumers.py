"""The console websocket: authenticated users only, "changed" events batched per connection; when the channel layer
(Redis) is away, consoles are refused or closed with 4013 ("try again later") and the client gauge stays true."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from redis.exceptions import ConnectionError as RedisConnectionError

from slotkeeper import consumers, events, livewire, metrics
from slotkeeper.consumers import ConsoleConsumer, hub
from slotkeeper.management.commands.issue_token import grant_role
from tests.conftest import requires_redis

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _a_channel_layer_per_test():
    """Channels keeps one layer per process, and channels_redis binds its receive lock to the event loop of the
    first receive that waits on it; each async test runs on a loop of its own. Without a fresh layer, a test that
    followed one whose receive was cancelled met "Lock ... is bound to a different event loop" on Redis, and its
    hub closed the console with 4013. (Daphne runs one loop for its whole life.)"""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def connect(user):
    communicator = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/console/")
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


async def test_anonymous_users_are_refused():
    _communicator, connected, code = await connect(AnonymousUser())
    assert not connected
    assert code == 4401


async def test_a_user_without_a_role_is_refused():
    user = await sync_to_async(get_user_model().objects.create_user)("nobody", password="pw-only-for-tests")
    _communicator, connected, code = await connect(user)
    assert (connected, code) == (False, 4401)


async def test_a_viewer_hears_a_burst_of_changes_as_one_batch():
    def make_viewer():
        user = get_user_model().objects.create_user("vera", password="pw-only-for-tests")
        grant_role(user, "viewer")
        return user

    user = await sync_to_async(make_viewer)()
    communicator, connected, _ = await connect(user)
    assert connected
    hello = await communicator.receive_json_from(timeout=5)
    assert hello == {"event": "hello", "role": "viewer", "seq": hub().seq}
    await sync_to_async(events.send_batch)(
        [
            {"event": "node-changed", "node": 1},
            {"event": "node-changed", "node": 1},
            {"event": "slots-changed"},
        ]
    )
    batch = await communicator.receive_json_from(timeout=5)
    assert batch["event"] == "batch"
    assert batch["seq"] == hello["seq"] + 1
    # Each kind once, its events without the kind repeated, duplicates gone.
    assert batch["changed"] == {"node-changed": [{"node": 1}], "slots-changed": [{}]}
    await communicator.disconnect()


def test_events_of_a_transaction_leave_once_after_commit_and_never_after_a_rollback(monkeypatch):
    from django.db import transaction

    sent = []
    monkeypatch.setattr(events, "send_batch", lambda batch: sent.append(batch))
    with transaction.atomic():
        events.send_on_commit("node-changed", node=1)
        events.send_on_commit("node-changed", node=1)
        events.send_on_commit("lease-changed", lease=7)
        assert sent == []  # nothing before commit
    assert sent == [[{"event": "node-changed", "node": 1}, {"event": "lease-changed", "lease": 7}]]
    sent.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        events.send_on_commit("node-changed", node=2)
        raise RuntimeError("rolled back")
    with transaction.atomic():
        events.send_on_commit("slots-changed")
    assert sent == [[{"event": "slots-changed"}]]  # the rolled-back event is gone for good


async def test_two_consoles_of_one_process_get_the_same_batch_from_one_group_member():
    def make_viewers():
        users = []
        for name in ("v1", "v2"):
            user = get_user_model().objects.create_user(name, password="pw-only-for-tests")
            grant_role(user, "viewer")
            users.append(user)
        return users

    first_user, second_user = await sync_to_async(make_viewers)()
    first, ok1, _ = await connect(first_user)
    second, ok2, _ = await connect(second_user)
    assert ok1 and ok2
    await first.receive_json_from(timeout=5)
    await second.receive_json_from(timeout=5)
    assert len(hub().consoles) == 2
    await sync_to_async(events.send_batch)([{"event": "lease-changed", "lease": 1}])
    await sync_to_async(events.send_batch)([{"event": "lease-changed", "lease": 2}])
    seen = []
    for console in (first, second):
        got = []
        while len(got) < 2:
            batch = await console.receive_json_from(timeout=5)
            got += [e["lease"] for e in batch["changed"]["lease-changed"]]
        seen.append(sorted(got))
    assert seen == [[1, 2], [1, 2]]
    await first.disconnect()
    await second.disconnect()
    assert hub().consoles == set()
    assert hub().receiver is None  # the last console left: nothing of this loop stays registered in the layer


def make_viewer(name: str):
    user = get_user_model().objects.create_user(name, password="pw-only-for-tests")
    grant_role(user, "viewer")
    return user


async def console_hears_a_batch(user, lease: int, *, disconnect: bool = True) -> None:
    console, connected, _ = await connect(user)
    assert connected
    assert (await console.receive_json_from(timeout=5))["event"] == "hello"
    await sync_to_async(events.send_batch)([{"event": "lease-changed", "lease": lease}])
    batch = await console.receive_json_from(timeout=5)
    assert batch["changed"] == {"lease-changed": [{"lease": lease}]}
    if disconnect:
        await console.disconnect()


def test_the_hub_serves_consoles_on_successive_event_loops():
    """A test's loop, then the next test's (or a restarted server's): the second loop's consoles hear their batch,
    and no loop leaves a group member behind (on the in-memory layer, one nobody reads fills up to capacity)."""
    from channels.layers import get_channel_layer

    user = make_viewer("vera")
    for lease in (1, 2, 3):
        asyncio.run(console_hears_a_batch(user, lease))
    layer = get_channel_layer()
    if hasattr(layer, "groups"):  # the in-memory layer shows its members; channels_redis keeps them in Redis
        assert layer.groups.get(events.CONSOLE_GROUP, {}) == {}


# -- the channel layer going away (issue 15) -------------------------------------------------------------------


async def clients() -> float:
    """This process's slotkeeper_websocket_clients, as /metrics reports it (a live gauge of its metrics files)."""
    return await sync_to_async(metrics.value)(consumers.GAUGE)


class LayerThatGoesAway:
    """A channel layer that answers until `go_away()`, then fails the way channels_redis does when Redis stops:
    its blocked receive raises redis-py's ConnectionError (a RedisError, not the builtin ConnectionError)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.receives: list[str] = []

    async def new_channel(self, prefix: str = "specific.") -> str:
        return prefix + "fake!1"

    async def group_add(self, group: str, channel: str) -> None:
        if self.gone.is_set():
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    async def group_discard(self, group: str, channel: str) -> None:
        await self.group_add(group, channel)

    async def receive(self, channel: str) -> dict:
        self.receives.append(channel)
        await self.gone.wait()
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    def go_away(self) -> None:
        self.gone.set()


async def viewer(name: str):
    return await sync_to_async(make_viewer)(name)


async def test_a_console_connecting_while_redis_is_stopped_is_refused_with_try_again_later_not_a_500(
    monkeypatch,
):
    """The real channels_redis against a port nobody listens on: the handshake is refused politely. Before, the
    RedisError escaped connect() and Daphne answered the upgrade with HTTP 500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    layer = RedisChannelLayer(hosts=[f"redis://127.0.0.1:{closed_port}/0"])
    monkeypatch.setattr(consumers, "get_channel_layer", lambda: layer)
    before = await clients()
    console, connected, _ = await connect(await viewer("vera"))
    # Accepted, then closed with the code: a refusal before accept would reach the browser as 403 / 1006.
    assert connected
    assert await console.receive_output(timeout=5) == {
        "type": "websocket.close",
        "code": consumers.TRY_AGAIN_LATER,
    }
    assert await clients() == before
    assert hub().consoles == set()
    await console.disconnect()
    assert await clients() == before


async def test_an_open_console_is_told_to_try_again_later_when_redis_goes_away_and_the_gauge_drops_to_the_truth(
    monkeypatch,
):
    layer = LayerThatGoesAway()
    monkeypatch.setattr(consumers, "get_channel_layer", lambda: layer)
    before = await clients()
    first, ok1, _ = await connect(await viewer("v1"))
    second, ok2, _ = await connect(await viewer("v2"))
    assert ok1 and ok2
    assert await clients() == before + 2
    # One receive on the layer for the whole process, none per console: a console's own receive was what died
    # with 1011 when Redis stopped.
    assert layer.receives == ["specific.fake!1"]

    layer.go_away()
    for console in (first, second):
        await console.receive_json_from(timeout=5)  # hello
        closed = await console.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": consumers.TRY_AGAIN_LATER}
        await console.disconnect()  # what Daphne sends once the socket is closed
    assert await clients() == before

    # While it stays away, a console that comes back is refused with the same code and never counted.
    again, _, _ = await connect(await viewer("v3"))
    assert await again.receive_output(timeout=5) == {
        "type": "websocket.close",
        "code": consumers.TRY_AGAIN_LATER,
    }
    assert await clients() == before
    await again.disconnect()
    assert await clients() == before


async def test_the_gauge_counts_a_reconnected_console_once():
    user = await viewer("vera")
    before = await clients()
    for _ in range(3):
        console, connected, _ = await connect(user)
        assert connected
        assert await clients() == before + 1
        await console.disconnect()
        assert await clients() == before


async def test_a_console_that_fails_is_uncounted_even_though_disconnect_is_never_called(monkeypatch):
    async def fail(self, text_data=None, bytes_data=None):
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(ConsoleConsumer, "receive", fail)
    before = await clients()
    console, connected, _ = await connect(await viewer("vera"))
    assert connected and await clients() == before + 1
    await console.send_to(text_data="ping")
    with pytest.raises(RuntimeError, match="a bug in a handler"):
        await console.wait(timeout=5)
    assert await clients() == before
    assert hub().consoles == set()


def test_the_try_again_later_code_is_one_daphne_can_send():
    """Daphne's websocket library refuses to send any close code but 1000 and 3000-4999: with 1013 the close
    raised inside the hub and every console stayed open on a hub that heard nothing (seen in the e2e run)."""
    from autobahn.websocket.protocol import WebSocketProtocol

    sent = []
    protocol = WebSocketProtocol()
    protocol.state = WebSocketProtocol.STATE_OPEN
    protocol.sendCloseFrame = lambda code=None, reasonUtf8=None, isReply=False: sent.append(code)
    protocol.sendClose(code=consumers.TRY_AGAIN_LATER)
    assert sent == [consumers.TRY_AGAIN_LATER]


# -- timing and gaps (issue 13 item 6) ---------------------------------------------------------------------------


async def test_a_quiet_console_hears_the_first_change_at_once_and_the_window_holds_only_what_follows(
    monkeypatch,
):
    """With a window of 2 s the first change still arrives in well under a second: only what follows it within
    the window waits. (A trailing window made every change wait for it: 50 ms of a 100 ms budget.)"""
    monkeypatch.setattr(consumers, "COALESCE_S", 2.0)
    console, connected, _ = await connect(await viewer("vera"))
    assert connected
    await console.receive_json_from(timeout=5)  # hello
    started = time.monotonic()
    await sync_to_async(events.send_batch)([{"event": "node-changed", "node": 1}])
    first = await console.receive_json_from(timeout=5)
    assert time.monotonic() - started < 0.5
    assert first["changed"] == {"node-changed": [{"node": 1}]}
    await sync_to_async(events.send_batch)([{"event": "node-changed", "node": 2}])
    assert await console.receive_nothing(timeout=1.0)  # inside the window: held
    second = await console.receive_json_from(timeout=5)
    assert second["changed"] == {"node-changed": [{"node": 2}]}
    assert second["seq"] == first["seq"] + 1
    await console.disconnect()


async def test_a_broadcast_that_never_arrives_makes_the_next_batch_skip_a_number(monkeypatch):
    """The sender numbers its broadcasts; 2 of 1, 2, 3 stands for one the channel layer dropped. The console gets
    1 and 3 in consecutive batches and then, when 2 has not come within LATE_S, a batch that skips a number, which
    is what makes the page resync (static/console/console.js)."""
    monkeypatch.setattr(livewire, "LATE_S", 0.1)
    numbers = iter([("sender-a", 1), ("sender-a", 3)])
    monkeypatch.setattr(events, "_number", lambda: next(numbers))
    console, connected, _ = await connect(await viewer("vera"))
    assert connected
    hello = await console.receive_json_from(timeout=5)
    for lease in (1, 3):
        await sync_to_async(events.send_batch)([{"event": "lease-changed", "lease": lease}])
    got = [await console.receive_json_from(timeout=5) for _ in range(3)]
    assert [b["seq"] - hello["seq"] for b in got] == [1, 2, 4]
    assert got[2]["changed"] == {}
    await console.disconnect()


@requires_redis
async def test_a_broadcast_redis_drops_over_capacity_makes_the_consoles_resync(monkeypatch):
    """The real channels_redis core layer, with room for one message per member: while the hub is slow to read,
    group_send drops the rest without a word. The numbers show it."""
    from django.conf import settings

    monkeypatch.setattr(livewire, "LATE_S", 0.2)
    layer = RedisChannelLayer(hosts=[settings.REDIS_URL], capacity=1, prefix=f"gap{time.monotonic_ns()}")
    slow_receive = layer.receive

    async def receive(channel):
        message = await slow_receive(channel)
        await asyncio.sleep(0.3)
        return message

    monkeypatch.setattr(layer, "receive", receive)
    monkeypatch.setattr(consumers, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    console, connected, _ = await connect(await viewer("vera"))
    assert connected
    hello = await console.receive_json_from(timeout=5)
    for lease in range(1, 6):
        await sync_to_async(events.send_batch)([{"event": "lease-changed", "lease": lease}])
    # A gap shows only when a later broadcast arrives: one more, once the hub has caught up.
    await asyncio.sleep(1.0)
    await sync_to_async(events.send_batch)([{"event": "lease-changed", "lease": 6}])
    seqs = [hello["seq"]]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and all(b - a == 1 for a, b in itertools.pairwise(seqs)):
        seqs.append((await console.receive_json_from(timeout=10))["seq"])
    assert any(b - a > 1 for a, b in itertools.pairwise(seqs)), seqs
    await console.disconnect()
    await layer.flush()


class LayerWithOneBadMessage(LayerThatGoesAway):
    """Hands the hub a message it cannot read, then a good one, then waits."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: list[dict] = [
            {"type": "console.event", "events": ["not an event"], "sender": "s", "n": 1},
            {
                "type": "console.event",
                "events": [{"event": "lease-changed", "lease": 7}],
                "sender": "s",
                "n": 2,
            },
        ]

    async def receive(self, channel: str) -> dict:
        if self.queue:
            await asyncio.sleep(0.2)  # after the console's hello
            return self.queue.pop(0)
        return await super().receive(channel)


async def test_a_message_the_hub_cannot_read_is_dropped_without_closing_the_consoles(monkeypatch):
    layer = LayerWithOneBadMessage()
    monkeypatch.setattr(consumers, "get_channel_layer", lambda: layer)
    console, connected, _ = await connect(await viewer("vera"))
    assert connected
    await console.receive_json_from(timeout=5)  # hello
    batch = await console.receive_json_from(timeout=5)
    assert batch["changed"] == {"lease-changed": [{"lease": 7}]}
    await console.disconnect()
