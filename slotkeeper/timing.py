"""Every HTTP request timed, in front of everything else the server runs: the heartbeat route that answers before
Django (slotkeeper/heartbeat_route.py), Django's handler (slotkeeper/handler.py), the static files.

`slotkeeper_http_request_duration_seconds{route, status_class}` is observed when the answer's status line is sent:
for every answer but a stream that is its whole work (Django sends a response's body right behind its status),
and a stream (the event feed's SSE) counts its set-up, not the hours it stays open. A client that leaves before
its answer is counted with status class `closed` when the server gives up on it.

The route is a name, never the path (a path has an id in it: one series per lease): the URL pattern's view name
(`api:node-heartbeat`, `lease-detail`), which Django's handler and the heartbeat route leave in the ASGI scope
under ROUTE; `static` for the static files; `unmatched` for a path no pattern takes. The set is as bounded as the
URLconf.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.urls import Resolver404, resolve

from slotkeeper import metrics

log = logging.getLogger(__name__)

ROUTE = "slotkeeper.route"
STATUS_CLASSES = {n: f"{n}xx" for n in range(1, 6)}


class RequestTimer:
    """ASGI middleware, outermost for HTTP. Websockets pass through untimed."""

    def __init__(self, app) -> None:
        self.app = app
        self.static = (
            settings.STATIC_URL if settings.STATIC_URL.startswith("/") else "/" + settings.STATIC_URL
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        observed = False

        async def timed_send(message):
            nonlocal observed
            if not observed and message["type"] == "http.response.start":
                observed = True
                self.observe(scope, STATUS_CLASSES.get(message["status"] // 100, "5xx"), started)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        except Exception:
            if not observed:  # the server answers 500 itself
                self.observe(scope, "5xx", started)
            raise
        except BaseException:  # cancelled: the client went away
            if not observed:
                self.observe(scope, "closed", started)
            raise
        if not observed:  # the handler gave up on a client that left
            self.observe(scope, "closed", started)

    def observe(self, scope, status_class: str, started: float) -> None:
        took = time.perf_counter() - started
        route = scope.get(ROUTE)
        if route is None:
            route = "static" if scope["path"].startswith(self.static) else "unmatched"
        try:
            metrics.http.observe(route, status_class, took)
            metrics.sample_soon()
        except Exception:  # a metrics file that cannot grow (a full disk) must not fail the answer
            log.exception("request not timed", extra={"route": route})


def route_of(request) -> str:
    """The URL pattern's view name for a request Django handled: the one it resolved, or, for an answer given
    before resolving (a probe, a refused host), the one its path resolves to."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return "unmatched"
        except Exception:  # a path Django refused to read (a NUL in it): nothing to name it by
            return "unmatched"
    return match.view_name
