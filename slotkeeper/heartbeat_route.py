"""The agent's heartbeat, answered in front of Django when nothing about it needs Django.

`POST /api/nodes/{id}/heartbeat` is most of the traffic a fleet sends (10,000 nodes at a 5 s interval are 2,000 a
second), and Django's request cycle alone costs more than that on two cores (docs/benchmarks/heartbeats.md).
This ASGI route answers the common heartbeat itself: a node token this process resolved recently
(slotkeeper.auth.node_tokens; a token it has not seen it looks up itself, as the view's authentication does, on a
thread), for the node in the path, whose remembered status is online or draining (so the
heartbeat changes no status), with a body the heartbeat's rules accept (fleet/heartbeat_rules.py, else the
HeartbeatSerializer itself). It answers 200 with what the view answers, `{"status", "server_time"}`, and leaves
the report in the process's buffer (fleet/heartbeats.py), which a task on the server's loop flushes every
HEARTBEAT_FLUSH_S with set-based statements (leases/instances/actions/heartbeats.py).

Everything else goes to Django unchanged, with the body replayed: the first heartbeat of a token, a node coming
back (its status changes through the compare-and-swap path at once), another node's token, a rotated or unknown
token, a fenced node (the look-up does not remember its token), any body the rules refuse (the view answers 400 with its field messages), and every
heartbeat once shutdown has begun. So the agent's contract (URL, bodies, status codes, the auth header) is the
view's, and only the answer's timing and the write's moment differ.

What buffering costs, on purpose: a fence, a rotation or a drain made in another process is seen at the next
flush (its guarded UPDATE), not at the next heartbeat; until then, at most one interval, that node is answered
as before and what it said is dropped at the flush. A clean stop (SIGTERM) flushes what is buffered before the
loop stops; a crash loses at most the heartbeats of one interval and the flush in progress, and each node says
the same again within its own interval.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import logging
import re
import threading

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.http.request import split_domain_port, validate_host
from django.utils import timezone

from fleet import token_notices
from fleet.actions import HealthReport
from fleet.api.serializers import HeartbeatSerializer
from fleet.heartbeat_rules import plain_report
from fleet.heartbeats import HeartbeatBuffer, Pending
from fleet.models import NodeStatus
from leases.instances.actions import heartbeats
from slotkeeper import metrics, shutdown
from slotkeeper.auth import authenticate_token, bearer_from, node_tokens
from slotkeeper.models import hash_token
from slotkeeper.timing import ROUTE

log = logging.getLogger(__name__)

PATH = re.compile(r"^/api/nodes/([1-9][0-9]{0,17})/heartbeat/?$")
# The view's URL name: a heartbeat answered here is timed under the same route as one Django answers.
VIEW_NAME = "api:node-heartbeat"
# A heartbeat with many instances is a few KiB; anything bigger goes to Django, which bounds its own uploads.
MAX_BODY = 64 * 1024
# This route checks a report on the event loop, where every other request of the process waits meanwhile: a
# report of more instances than this goes to Django, which checks it on a request thread. (An outsider's heartbeat
# of 16,000 ids held the loop 5 s, and /healthz with it.)
MAX_INSTANCES = 100
# The media types DRF's JSON parser takes for this view, exactly: anything else is Django's to answer (415, 400).
_JSON = re.compile(rb"application/json\s*(;\s*charset=\"?utf-8\"?\s*)?", re.IGNORECASE)
BUFFERED = frozenset((NodeStatus.ONLINE.value, NodeStatus.DRAINING.value))
# The security headers Django's middleware adds to the view's answer (SecurityMiddleware, XFrameOptions), and
# DRF's own, so the two answers differ in nothing a client can see but their timing.
HEADERS = [
    (b"content-type", b"application/json"),
    (b"allow", b"POST, OPTIONS"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def _refuse_constant(name: str) -> float:
    # DRF's JSON parser is strict: NaN and Infinity are not JSON.
    raise ValueError(f"{name} is not JSON")


class Flusher:
    """This process's heartbeat buffer and the one writer of it: a task on the server's loop every `interval_s`,
    and a last flush when shutdown begins (and at exit, for servers that do not announce it)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.buffer = HeartbeatBuffer()
        self._lock = threading.Lock()  # one flush at a time: the periodic one and the last one
        self._task: asyncio.Task | None = None
        self._closed = False
        self._unsubscribe = lambda: None
        self.notices = token_notices.Listener()

    @property
    def closed(self) -> bool:
        return self._closed

    def add(self, entry: Pending) -> None:
        self.buffer.add(entry)
        if self._task is None:
            self._unsubscribe = shutdown.on_begin(self.close)
            atexit.register(self.close)
            self.notices.start()  # other processes' rotations and fences, heard within milliseconds
        if self._task is None or self._task.done():
            # Started on the first heartbeat, on the loop that serves it; started again if it ever ended (a loop
            # of a test that closed), so nothing waits in the buffer for a flush that will not come.
            self._task = asyncio.get_running_loop().create_task(self._run())

    def flush(self) -> heartbeats.Flushed | None:
        """Writes what is buffered now; call it from a thread of its own, never from the loop."""
        with self._lock:
            batch = self.buffer.take()
            if not batch:
                return None
            try:
                return heartbeats.flush(batch)
            except Exception:
                # The database is away or the statement failed: keep the reports for the next round rather than
                # losing a whole interval of the fleet's health.
                self.buffer.restore(batch)
                log.exception("heartbeat flush failed; kept for the next one", extra={"nodes": len(batch)})
                return None
            finally:
                close_old_connections()

    async def _run(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.interval_s)
            if self._closed:
                break
            await sync_to_async(self.flush, thread_sensitive=False)()

    def close(self) -> None:
        """The last flush, on a thread of its own (Daphne calls this on its loop's thread, where Django refuses
        to touch the database), waited for within the shutdown's deadline."""
        self._closed = True
        self.notices.stop()
        self._unsubscribe()
        atexit.unregister(self.close)
        done = threading.Thread(target=self.flush, name="heartbeat-last-flush")
        done.start()
        done.join(shutdown.EXIT_DEADLINE_S / 2)
        if self._task is not None and not self._task.done():
            # It would end at its next wake-up anyway; cancelled, a loop that is closing has nothing pending.
            with contextlib.suppress(RuntimeError):  # that loop is closed already
                self._task.get_loop().call_soon_threadsafe(self._task.cancel)


class HeartbeatRoute:
    def __init__(self, app, flusher: Flusher | None = None) -> None:
        self.app = app
        self.flusher = flusher or Flusher(settings.SLOTKEEPER["HEARTBEAT_FLUSH_S"])

    async def __call__(self, scope, receive, send):
        match = PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None or not settings.SLOTKEEPER["HEARTBEAT_BUFFER"]:
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more and size <= MAX_BODY:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if not more:
            await self.resolve(scope)
        answer = None if more else self.accept(int(match.group(1)), scope, body)
        if answer is None:
            return await self.app(scope, _replay(body, more, receive), send)
        scope[ROUTE] = VIEW_NAME
        headers = [*HEADERS, (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return None

    async def resolve(self, scope) -> None:
        """A node token this process has not seen (a restart, a new node): looked up as the view would
        (slotkeeper.auth.authenticate_token, which remembers it unless the node is fenced), on a thread, so that
        a whole fleet's first heartbeats after a deploy do not each cost a trip through Django."""
        raw = _bearer(scope)
        if raw is not None and node_tokens.get(hash_token(raw)) is None and not shutdown.begun():
            await sync_to_async(_look_up, thread_sensitive=False)(raw)

    def accept(self, node_id: int, scope, body: bytes) -> bytes | None:
        """The answer to a heartbeat this route may take, with the report buffered; None to leave it to Django.
        Runs on the loop: no database, only the token cache and the rules."""
        if shutdown.begun() or self.flusher.closed:
            return None  # the last flush may have run: write at once
        headers = dict(scope.get("headers") or ())
        raw = _bearer(scope)
        if raw is None:
            return None
        token = node_tokens.get(hash_token(raw))
        if token is None or token.node_id != node_id or token.status not in BUFFERED:
            return None
        if not _JSON.fullmatch(headers.get(b"content-type", b"")):
            return None  # DRF's parser decides what else it takes (415), and what another charset means (400)
        if not _served(headers.get(b"host", b"")):
            return None  # Django answers a host it does not serve with 400
        try:
            data = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, RecursionError):  # RecursionError: nested a thousand deep (the view answers 400)
            return None
        validated = plain_report(data)
        if validated is None:
            listed = data.get("instances", []) if isinstance(data, dict) else None
            if not isinstance(listed, list) or len(listed) > MAX_INSTANCES:
                return None  # not a report, or a long one: checked off the loop, by the view
            serializer = HeartbeatSerializer(data=data)
            if not serializer.is_valid():
                return None  # the view says why, field by field
            validated = serializer.validated_data
        now = timezone.now()
        self.flusher.add(Pending(token=token, report=HealthReport(**validated), at=now))
        metrics.inc("slotkeeper_heartbeats_total")
        # DRF's rendering of the view's answer, compact, with its "Z" for UTC; the status is one of two words.
        stamp = now.isoformat().replace("+00:00", "Z")
        return f'{{"status":"{token.status}","server_time":"{stamp}"}}'.encode()


@functools.lru_cache(maxsize=64)
def _served(host_header: bytes) -> bool:
    """Whether Django would serve this Host (its own check, remembered: a fleet sends one or two values)."""
    host, _ = split_domain_port(host_header.decode("latin-1"))
    return bool(host) and validate_host(host, settings.ALLOWED_HOSTS)


def _bearer(scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            raw = bearer_from(value.decode("latin-1"))
            return raw if raw is not None and raw.startswith("skn_") else None
    return None


def _look_up(raw: str) -> None:
    try:
        authenticate_token(raw)
    finally:
        close_old_connections()  # back to the pool: this thread is the executor's, not a request's


def _replay(body: bytes, more: bool, receive):
    """The request body as Django will read it: what this route read already, then the rest from the client."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed
