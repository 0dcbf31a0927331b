"""ASGI entry point: HTTP through Django, websockets through Channels (authenticated, origin-checked)."""

import os
import types

import django
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotkeeper.settings")
django.setup(set_prefix=False)  # what get_asgi_application() does before building its handler

from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402

from slotkeeper.handler import OneHopASGIHandler, RequestThreads  # noqa: E402
from slotkeeper.serving import answer_lines_too_long, keep_post_bodies_raw  # noqa: E402

# Daphne hands POST bodies to Django as they came, unparsed by Twisted on the event loop (slotkeeper/serving.py).
if "raw_body" not in settings.OVERRIDES_OFF:
    keep_post_bodies_raw()
answer_lines_too_long()

# Daphne serves the console's few static files itself (with DEBUG off too), so a deployment needs no separate
# file server; a CDN or nginx in front may still cache /static/. SLOTKEEPER_OVERRIDES_OFF=handler: Django's own
# handler, to measure ours against it (docs/overrides.md); handler_threads: a new thread for every request, as
# Django's; handler_one_hop: Django's three hand-offs a request (its `handle`) around our one-hop stack.
handler = ASGIHandler() if "handler" in settings.OVERRIDES_OFF else OneHopASGIHandler()
if isinstance(handler, OneHopASGIHandler):
    if "handler_threads" in settings.OVERRIDES_OFF:
        handler.threads = RequestThreads(keep=0)
    if "handler_one_hop" in settings.OVERRIDES_OFF:
        handler.handle = types.MethodType(ASGIHandler.handle, handler)  # type: ignore[method-assign]
django_asgi_app = ASGIStaticFilesHandler(handler)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import get_resolver, path  # noqa: E402

from slotkeeper.collector import tune_from_settings  # noqa: E402
from slotkeeper.consumers import ConsoleConsumer  # noqa: E402
from slotkeeper.embedded import with_embedded_loop  # noqa: E402
from slotkeeper.heartbeat_route import HeartbeatRoute  # noqa: E402
from slotkeeper.timing import RequestTimer  # noqa: E402

application = with_embedded_loop(
    ProtocolTypeRouter(
        {
            # The agents' steady heartbeats are answered in front of Django (see slotkeeper/heartbeat_route.py);
            # every request, whoever answers it, is timed (slotkeeper/timing.py).
            "http": RequestTimer(HeartbeatRoute(django_asgi_app)),
            "websocket": AllowedHostsOriginValidator(
                AuthMiddlewareStack(URLRouter([path("ws/console/", ConsoleConsumer.as_asgi())]))
            ),
        }
    )
)

# Django imports the URLconf, and with it every view, serializer and API setting it names, at the first request it
# resolves: here instead, so the first request after a start is not 80-110 ms slower than the next (under a burst,
# several hundred), a readiness probe is answered only once the process can serve, and the collector's freeze below
# covers what it built.
get_resolver().url_patterns  # noqa: B018

# Start-up is done: tune the collector for a long-running server (slotkeeper/collector.py).
tune_from_settings()
