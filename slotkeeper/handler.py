"""Django's ASGI handler with the middleware stack entered once per request, synchronously.

Django runs an async-capable stack under ASGI, and its own middleware (security, sessions, common, CSRF,
authentication, messages, clickjacking) are `MiddlewareMixin`s: each `process_request` and `process_response`
is then a `sync_to_async` hop of its own: 17 thread hand-offs for one API read (tests/test_handler.py). This
handler builds the stack as the WSGI and test-client handlers do, sync from end to end, and enters it with one
hop: the same middleware in the same order, 3 hand-offs (two are Django's request signals; docs/BENCHMARKS.md,
"Lease requests over HTTP: one hand-off per request"). Every view of ours is sync; an async one would still work, through
Django's own `async_to_sync` around it.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request):
        # thread_sensitive: the request's one thread (Daphne gives each request a context of its own), where the
        # view's database connection lives and is closed by request_finished.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
