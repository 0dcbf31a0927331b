"""Refuse a request whose path or query string holds a NUL character, before any view sees it.

PostgreSQL cannot store or even compare a string with NUL in it: `?q=a%00b` or `/api/groups/a%00b/` reached a lookup
and the driver raised, which was a 500. No name, id or filter of ours can contain one, so this is always a 400.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import JsonResponse


class RefuseNulMiddleware:
    """Async under Daphne like every middleware of the stack (see slotkeeper.logging.RequestIdMiddleware)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
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
