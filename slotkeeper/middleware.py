"""Refuse a request whose path or query string holds a NUL character, before any view sees it.

PostgreSQL cannot store or even compare a string with NUL in it: `?q=a%00b` or `/api/groups/a%00b/` reached a lookup
and the driver raised, which was a 500. No name, id or filter of ours can contain one, so this is always a 400.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import JsonResponse


class DualModeMiddleware:
    """A middleware that runs in either mode, as every one of ours must: sync under the test client and under
    Daphne (whose handler enters the whole stack once, synchronously: slotkeeper/handler.py), async under Django's
    own ASGI handler (`get_asgi_application()`, which some tests call).

    In an async stack, one sync-only middleware makes Django hop thread -> loop -> thread for every request
    (async_to_sync around the rest of the stack), and a request thread caught in that hop when Daphne's loop
    stopped waited for the stopped loop forever: a SIGTERM'd Daphne then only ended by slotkeeper.shutdown's
    deadline. Subclasses override `sync_call` and `__acall__` (both pass the request on by default)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return self.sync_call(request)

    def sync_call(self, request):
        return self.get_response(request)

    async def __acall__(self, request):
        return await self.get_response(request)


class RefuseNulMiddleware(DualModeMiddleware):
    def sync_call(self, request):
        return _refusal(request) or self.get_response(request)

    async def __acall__(self, request):
        return _refusal(request) or await self.get_response(request)


def _refusal(request) -> JsonResponse | None:
    if "\x00" in request.path or any(
        "\x00" in key or "\x00" in value for key, value in _query_items(request)
    ):
        return JsonResponse({"detail": "The path or query string contains a NUL character."}, status=400)
    return None


def _query_items(request):
    for key, values in request.GET.lists():
        for value in values:
            yield key, value


class ReleaseRenderedMiddleware(DualModeMiddleware):
    """Lets a rendered API response's data go when its request ends, not when the cyclic collector next runs.

    Django REST framework leaves every response in a reference cycle (its `renderer_context` holds the view, which
    holds the response as `view.response`; the view and its request hold each other), so a response's `data`
    outlived the request until the collector found the cycle. A placement preview's data is a dict per node: at
    1,000 nodes about 3,000 containers a request, which piled up in the collector's middle generation and made
    each of its passes 15-25 ms, a pause that landed in whichever request ran then (docs/benchmarks/preview.md,
    run 5). Once the body is rendered neither is read again, so both are dropped here and reference counting
    frees the data as the request ends. (A serializer's `.data` is in a cycle of its own, with the serializer;
    the answers that carry a report build theirs with `leases.api.serializers.plain` instead.)"""

    def sync_call(self, request):
        return _released(self.get_response(request))

    async def __acall__(self, request):
        return _released(await self.get_response(request))


def _released(response):
    # Django renders a deferred-rendering response before the middleware sees it; one not rendered yet keeps what
    # rendering needs.
    if getattr(response, "renderer_context", None) is not None and getattr(response, "is_rendered", False):
        response.renderer_context = None
        response.data = None
    return response
