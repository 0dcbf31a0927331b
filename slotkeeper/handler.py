"""Django's ASGI handler with the middleware stack entered once per request, synchronously, on a kept thread.

Django runs an async-capable stack under ASGI, and its own middleware (security, sessions, common, CSRF,
authentication, messages, clickjacking) are `MiddlewareMixin`s: each `process_request` and `process_response`
is then a `sync_to_async` hop of its own: 17 thread hand-offs for one API read (tests/test_handler.py). This
handler builds the stack as the WSGI and test-client handlers do, sync from end to end, and enters it with one
hop: the same middleware in the same order, 3 hand-offs (two are Django's request signals;
docs/benchmarks/burst-http.md, "Lease requests over HTTP: one hand-off per request"). Every view of ours is sync; an
async one would still work, through Django's own `async_to_sync` around it.

Those hand-offs go to one thread per request, as Django's handler sends them (the view's database connection
lives there and `request_finished` closes it there). Django's handler starts a new thread for every request and
joins it after; here the request's thread is taken from the ones earlier requests left idle and given back after,
as a WSGI server's worker threads are: starting and joining a thread was 5-8 % of a Daphne's time under a burst
of lease requests (docs/benchmarks/burst-http.md, "A request's thread kept for the next one").
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse
from django.urls import set_script_prefix

from slotkeeper.timing import ROUTE, route_of

# Idle request threads kept per process; past that a finished request's thread ends, as every thread did before.
# Peak concurrency decides how many are made; this only bounds how many wait for the next burst.
KEPT_THREADS = 64


class RequestThread(ThreadPoolExecutor):
    """One thread that runs a request's sync work in order (asgiref's thread-sensitive executor), reusable."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="request")
        self._last: Future | None = None

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = super().submit(fn, *args, **kwargs)
        self._last = future
        return future

    @property
    def idle(self) -> bool:
        # One worker, first in first out: once the last call submitted is done, every earlier one is.
        return self._last is None or self._last.done()


class RequestThreads:
    """Idle request threads, the most recently used first. Used only from the event loop's thread."""

    def __init__(self, keep: int = KEPT_THREADS) -> None:
        self.keep = keep
        self._idle: list[RequestThread] = []

    def take(self) -> RequestThread:
        return self._idle.pop() if self._idle else RequestThread()

    def give_back(self, thread: RequestThread) -> None:
        # A request whose client went away can leave its view running on the thread (asgiref cannot stop it):
        # such a thread is not handed to the next request, which would wait behind it; it ends when it is done.
        if thread.idle and len(self._idle) < self.keep:
            self._idle.append(thread)
        else:
            thread.shutdown(wait=False)

    def __len__(self) -> int:
        return len(self._idle)


# The thread the request being handled runs its sync work on (set by `OneHopASGIHandler.__call__`).
_request_thread: ContextVar[RequestThread | None] = ContextVar("request_thread", default=None)


class OneHopASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads()

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # as Django's handler
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        thread = self.threads.take()
        kept = _request_thread.set(thread)
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            _request_thread.reset(kept)
            self.threads.give_back(thread)

    async def get_response_async(self, request):
        # thread_sensitive: the request's one thread, where the view's database connection lives and is closed by
        # request_finished.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    async def handle(self, scope, receive, send):
        """Django's `ASGIHandler.handle`, with the request's sync work in one hand-off instead of three.

        Django sends `request_started` (one hop), runs the stack (a second) and, once the body is sent, closes the
        response (a third, which sends `request_finished`). Each hop wakes the request's thread and then the event
        loop, and under a burst those wake-ups were the largest single item of a Daphne's time holding the interpreter
        lock (docs/benchmarks/burst-http.md, "one hand-off a request"). Here all three run in one call on the
        request's thread: a response that is not streamed is complete once the stack returns it, so it is closed
        there, before its bytes go out (its body stays readable), and the connection is given back just as early. A
        streamed response is closed after sending, as Django does. A client that goes away cancels the wait as in
        Django, and the handler returns at once; the view runs to its end on its thread, which then closes the
        response and the request's body."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:  # as Django: a request that could not be built (a bad header, a body too large)
            await signals.request_started.asend(sender=self.__class__, scope=scope)
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return

        async def process_request(request, send):
            response = await sync_to_async(self._respond, thread_sensitive=True)(scope, request)
            with contextlib.suppress(asyncio.CancelledError):  # the client went away while the body was sent
                await self.send_response(response, send)
            return response

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if tasks[1].cancelled():
            # The client went away: the view may still be running on the request's thread (asgiref lets it finish)
            # and read the body after this returns. The body is closed on that thread, after whatever the request
            # left there: its one worker runs them in order. Django's handler waited for the view here instead.
            thread = _request_thread.get()
            if thread is not None:
                thread.submit(body_file.close)
                return
        else:
            response = tasks[1].result()
            if response.streaming:
                await sync_to_async(response.close)()
        body_file.close()

    def _respond(self, scope, request):
        """A request's sync work, on its thread: `request_started`, the stack, and (unless the response streams)
        the close that sends `request_finished`."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        response = self.get_response(request)
        scope[ROUTE] = route_of(
            request
        )  # what the request's duration is counted under (slotkeeper/timing.py)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size  # as Django: the server chunks
        if not response.streaming:
            response.close()
        return response
