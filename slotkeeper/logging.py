"""Structured logs: one JSON object a line, with the request id of the HTTP request or Celery task that wrote it."""

from __future__ import annotations

import contextvars
import json
import logging
import uuid
from datetime import UTC, datetime

from slotkeeper.middleware import DualModeMiddleware

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        rid = request_id_var.get()
        if rid == "-":
            # Django logs a 4xx or 5xx answer ("Bad Request: /api/leases/") after the middleware returned, when the
            # request's id is no longer current: the request it logs carries it.
            rid = getattr(getattr(record, "request", None), "request_id", "-")
        record.request_id = rid
        return True


class JsonFormatter(logging.Formatter):
    # Attributes every LogRecord has; anything else was passed with `extra=` and belongs in the JSON object.
    _standard = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
        "message",
        "asctime",
        "request_id",
    }

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        for key, value in vars(record).items():
            if key not in self._standard and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class RequestIdMiddleware(DualModeMiddleware):
    """Takes X-Request-ID from the caller (or makes one), logs with it, and returns it on the response. Async under
    Daphne (see DualModeMiddleware): with every middleware async, the only thread of a request is its view's."""

    def sync_call(self, request):
        rid, token = self._begin(request)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = rid
        return response

    async def __acall__(self, request):
        rid, token = self._begin(request)
        try:
            response = await self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = rid
        return response

    def _begin(self, request) -> tuple[str, contextvars.Token[str]]:
        rid = request.headers.get("X-Request-ID", "")[:64] or new_request_id()
        request.request_id = (
            rid  # for the lines Django writes about the request after the middleware returned
        )
        return rid, request_id_var.set(rid)


class ExpectedAnswersFilter(logging.Filter):
    """Django logs every 4xx answer as a warning ("Conflict: /api/leases/"); those are outcomes a client was told
    (a 409 for a lease with no room, a fenced agent polling), not something an operator must look at. Each is
    logged at info instead, and once a minute per (status, method, path) at most: a fenced agent polling every
    5 s, or a burst of rejected requests, filled the terminal with the same line (issue 45)."""

    EVERY_S = 60.0

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._last: dict[tuple, float] = {}

    # A body past the server's limit or too many fields is refused before any view, and Django logs it as an error
    # of its security loggers with a traceback: the client's mistake (anyone, signed in or not, could fill the
    # error log with them), answered 413 or 400 with a message (slotkeeper.api.bad_request).
    REFUSED_REQUESTS = frozenset(
        f"django.security.{name}" for name in ("RequestDataTooBig", "TooManyFieldsSent", "TooManyFilesSent")
    )

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in self.REFUSED_REQUESTS:
            record.exc_info, record.exc_text = None, None
            status = 413 if record.name.endswith("TooBig") else 400
        elif record.name != "django.request" or record.levelno != logging.WARNING:
            return True
        else:
            status = getattr(record, "status_code", None)
        if not isinstance(status, int) or not 400 <= status < 500:
            return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        request = getattr(record, "request", None)
        key = (status, getattr(request, "method", ""), getattr(request, "path", record.getMessage()))
        now = record.created
        if now - self._last.get(key, -self.EVERY_S) < self.EVERY_S:
            return False
        if len(self._last) > 10_000:
            self._last.clear()
        self._last[key] = now
        return True
