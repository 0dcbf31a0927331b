"""`GET /api/events/`: the event feed integrations follow instead of polling (the outbox, slotkeeper/outbox.py).

A page of events after a `seq` (`?after=`, `?limit=`, filtered by `?lease=`, `?type=` prefix and `?node=`), with the
`seq` to resume from; or, with `Accept: text/event-stream`, a stream of them (Server-Sent Events: `id:` is the seq,
`Last-Event-ID` resumes, a comment every HEARTBEAT_S keeps proxies from closing an idle stream). A client asking
for events older than retention kept is answered 410: it must resync (read the resources, then follow from the
feed's head, which every answer gives).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import Http404, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from slotkeeper import outbox, shutdown
from slotkeeper.auth import IsViewer
from slotkeeper.fields import IdQueryField
from slotkeeper.models import Event
from slotkeeper.renderers import FastJSONRenderer

DEFAULT_LIMIT = 500
MAX_LIMIT = 5000
HEARTBEAT_S = 15.0
POLL_S = 1.0
TYPE_PREFIX_MAX = 40


class EventSerializer(serializers.Serializer):
    seq = serializers.IntegerField(help_text="Strictly increasing, never reused: resume after it.")
    type = serializers.CharField(help_text="lease.*, instance.<state>, node.<status>")
    at = serializers.DateTimeField()
    lease = serializers.IntegerField(allow_null=True)
    instance = serializers.CharField(allow_null=True)
    node = serializers.IntegerField(allow_null=True)
    data = serializers.DictField()


class EventPageSerializer(serializers.Serializer):
    results = EventSerializer(many=True)
    last_seq = serializers.IntegerField(help_text="Ask `?after=` this next: nothing up to it was left out.")


class DigitsField(serializers.IntegerField):
    """A whole number in a query string, ASCII digits only (DRF's IntegerField also reads "+1", "1.0", " 1")."""

    default_error_messages = {"digits": "Must be a whole number of 0 or more, in digits."}

    def to_internal_value(self, data):
        if not (isinstance(data, str) and data.isascii() and data.isdigit() and len(data) <= 19):
            # "A valid integer is required." answered `after=-1`, which is an integer: say what is.
            self.fail("digits")
        return super().to_internal_value(data)


class FeedQuerySerializer(serializers.Serializer):
    after = DigitsField(required=False, default=0, min_value=0, max_value=2**63 - 1)
    limit = DigitsField(required=False, default=DEFAULT_LIMIT, min_value=1, max_value=MAX_LIMIT)
    lease = IdQueryField(required=False)
    node = IdQueryField(required=False)
    type = serializers.RegexField(
        r"^[a-z_.]{1,40}$",
        required=False,
        help_text="A prefix of the type, e.g. `lease.` or `instance.lost`.",
    )


class EventStreamRenderer(BaseRenderer):
    """Lets a request that accepts only text/event-stream through content negotiation; the view answers it with
    a stream of its own."""

    media_type = "text/event-stream"
    format = "event-stream"  # the stream itself is chosen by the Accept header; anything else is JSON
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data).encode()


def _as_json(e: Event) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "type": e.type,
        "at": e.at.isoformat().replace("+00:00", "Z"),
        "lease": e.lease_id,
        "instance": e.instance or None,
        "node": e.node_id,
        "data": e.data,
    }


def read(after: int, limit: int, filters: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Events after `after` (at most `limit`), and the seq to resume from: the last one given, or, when fewer than
    `limit` matched, the feed's head as it was before the read (nothing up to it can appear later)."""
    head = outbox.sequence()
    rows = Event.objects.filter(seq__gt=after, seq__lte=head)
    if filters.get("lease"):
        rows = rows.filter(lease_id=filters["lease"])
    if filters.get("node"):
        rows = rows.filter(node_id=filters["node"])
    if filters.get("type"):
        rows = rows.filter(type__startswith=filters["type"])
    page = [_as_json(e) for e in rows.order_by("seq")[:limit]]
    last = page[-1]["seq"] if len(page) == limit else max(head, after)
    return page, last


class Gone(Exception):
    pass


def check_retained(after: int) -> None:
    pruned = outbox.pruned_through()
    if after < pruned:
        raise Gone(pruned)


class EventFeedView(APIView):
    permission_classes = [IsViewer]
    renderer_classes = [FastJSONRenderer, EventStreamRenderer]

    def finalize_response(self, request, response, *args, **kwargs):
        # Anything but the stream itself (a page, a 400, a 410) is JSON, whatever the client said it accepts.
        if isinstance(response, Response):
            request.accepted_renderer = FastJSONRenderer()
            request.accepted_media_type = FastJSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    def perform_content_negotiation(self, request, force=False):
        # A `?format=` this view does not know names no resource: the answer is JSON, not DRF's 404.
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:
            renderer = self.get_renderers()[0]
            return renderer, renderer.media_type

    @extend_schema(
        parameters=[
            FeedQuerySerializer,
            OpenApiParameter(
                "Last-Event-ID",
                {"type": "string", "pattern": "^[0-9]{1,18}$"},
                OpenApiParameter.HEADER,
                description="Resume after this seq (as `after`, which it overrides): what an event stream's client "
                "sends when it reconnects.",
            ),
        ],
        responses={
            (200, "application/json"): EventPageSerializer,
            (200, "text/event-stream"): OpenApiResponse(
                response=OpenApiTypes.STR,
                description="Server-Sent Events: `id: <seq>`, `event: <type>`, `data: <the event as JSON>`; a "
                "comment line every 15 s while nothing happens.",
            ),
            410: OpenApiResponse(
                description="`after` is older than the events kept (retention): read the resources again, then "
                "follow from `last_seq`"
            ),
        },
    )
    def get(self, request):
        query = FeedQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = dict(query.validated_data)
        stream = "text/event-stream" in request.headers.get("Accept", "")
        last_id = request.headers.get("Last-Event-ID")
        if last_id is not None:  # honoured as `after` in both forms (a client may resume a page as a stream)
            if not last_id.isascii() or not last_id.isdigit() or len(last_id) > 19:
                raise serializers.ValidationError({"Last-Event-ID": ["A seq: digits only."]})
            params["after"] = int(last_id)
        try:
            check_retained(params["after"])
        except Gone as exc:
            return Response(
                {
                    "detail": f"events up to {exc.args[0]} are no longer kept; read the resources again, then "
                    f"follow from last_seq",
                    "last_seq": outbox.sequence(),
                },
                status=410,
            )
        filters = {k: params.get(k) for k in ("lease", "node", "type")}
        if not stream:
            page, last = read(params["after"], params["limit"], filters)
            return Response({"results": page, "last_seq": last})
        response = StreamingHttpResponse(
            _stream(params["after"], params["limit"], filters), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # proxies that buffer (nginx) pass each event on at once
        return response


def _read_closing(after: int, limit: int, filters: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """`read` on a worker thread, whose database connection is given back after (a stream reads once a second)."""
    try:
        return read(after, limit, filters)
    finally:
        connection.close()


async def _stream(after: int, limit: int, filters: dict[str, Any]) -> AsyncIterator[bytes]:
    """The events after `after` as Server-Sent Events, then each new one as it is numbered, until the client goes
    away (the server cancels this generator)."""
    read_async = sync_to_async(_read_closing, thread_sensitive=False)
    yield b"retry: 2000\n\n"
    quiet_since = time.monotonic()
    while True:
        page, last = await read_async(after, limit, filters)
        for e in page:
            yield f"id: {e['seq']}\nevent: {e['type']}\ndata: {json.dumps(e, separators=(',', ':'))}\n\n".encode()
        if page:
            quiet_since = time.monotonic()
        after = last
        if len(page) == limit:
            continue
        if shutdown.begun():
            return  # the server is draining (SIGTERM): the client reconnects elsewhere with Last-Event-ID
        if time.monotonic() - quiet_since >= HEARTBEAT_S:
            yield f": still here, at {after}\n\n".encode()
            quiet_since = time.monotonic()
        await asyncio.sleep(POLL_S)
