"""The API's error shape: 400 with field messages, 404, 409 for conflicts, 412 for stale versions; never a 500 for
something a client can send."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from slotkeeper.domain import DomainError, KeyReused, NotFound, StaleVersion
from slotkeeper.planlock import PlanBusy, is_busy_error

log = logging.getLogger(__name__)


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"

    def __init__(self, detail=None, *, extra: dict | None = None):
        super().__init__(detail)
        self.extra = extra or {}


class Busy(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The scheduler is busy; try again shortly."
    default_code = "busy"


class PreconditionFailed(exceptions.APIException):
    status_code = status.HTTP_412_PRECONDITION_FAILED
    default_detail = "The object changed since you last read it."
    default_code = "stale"


class KeyReusedError(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "This idempotency key was used for another request."
    default_code = "idempotency_key_reused"


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is larger than the server reads."
    default_code = "too_large"


def exception_handler(exc, context):
    retry_after = None
    if isinstance(exc, PlanBusy) or is_busy_error(exc):
        # A bounded wait that ran out: the request changed nothing and may be sent again.
        retry_after = PlanBusy.retry_after_s
        exc = Busy(str(exc) if isinstance(exc, PlanBusy) else None)
    elif isinstance(exc, NotFound):
        exc = exceptions.NotFound(str(exc))
    elif isinstance(exc, StaleVersion):
        exc = PreconditionFailed(str(exc))
    elif isinstance(exc, KeyReused):
        exc = KeyReusedError(str(exc))
    elif isinstance(exc, DomainError):
        exc = Conflict(str(exc), extra=getattr(exc, "extra", None))
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    elif isinstance(exc, RequestDataTooBig):
        # Django's own body limit (DATA_UPLOAD_MAX_MEMORY_SIZE), hit when DRF reads the body: without this it was
        # Django's HTML 400 page, not the API's JSON error.
        exc = RequestTooLarge()
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = drf_exception_handler(exc, context)
    if response is not None and retry_after is not None:
        response["Retry-After"] = str(retry_after)
    if response is not None and isinstance(response.data, list):
        # A ValidationError raised with a bare message is a JSON array; the schema (and every client) expects the
        # object shape, with whole-request messages under DRF's own key.
        response.data = {"non_field_errors": response.data}
    if response is not None and isinstance(exc, Conflict) and exc.extra:
        response.data = {"detail": response.data["detail"], **exc.extra}
    return response


def conflict_response(message: str, **extra) -> Response:
    return Response({"detail": message, **extra}, status=status.HTTP_409_CONFLICT)


def prefers_minimal(request) -> bool:
    """Whether the request asks for `Prefer: return=minimal` (RFC 7240 §4.2): preferences are comma-separated,
    each `token[=value]` with optional `;parameters`; tokens are case-insensitive and a value may be quoted.
    Unknown preferences are ignored, as the RFC asks."""
    for preference in request.headers.get("Prefer", "").split(","):
        token, _, value = preference.split(";", 1)[0].partition("=")
        if token.strip().lower() == "return" and value.strip().strip('"').lower() == "minimal":
            return True
    return False


def minimal_applied(response: Response) -> Response:
    """Marks an answer shaped by `Prefer: return=minimal` (RFC 7240 §3), and one that may be, for caches."""
    response["Preference-Applied"] = "return=minimal"
    return response


def not_found(request, exception):
    """Django's 404 for a URL no route matches (`/api/nodes/0.5/`): JSON under /api/, as every other answer of the
    API is, and the HTML page elsewhere. A client parsing the answer got an HTML page it could not read."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found: no such endpoint."}, status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request, exception):
    """Django's 400 for a request it refused before any view (the CSRF check or a view reading the form): a body
    past DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 and too many fields a 400, each saying so (JSON under /api/, as the
    API's own answers), where every console page answered an empty "Bad Request (400)"."""
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        status_code, message = (
            413,
            f"The request body is larger than the server reads ({limit:,} bytes at most).",
        )
    elif isinstance(exception, TooManyFieldsSent):
        fields = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        status_code, message = 400, f"The request has too many fields ({fields:,} at most)."
    elif isinstance(exception, TooManyFilesSent):
        files = settings.DATA_UPLOAD_MAX_NUMBER_FILES
        status_code, message = 400, f"The request has too many files ({files:,} at most)."
    else:
        return defaults.bad_request(request, exception)
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=status_code)
    return HttpResponse(message, status=status_code, content_type="text/plain; charset=utf-8")
