"""Operability endpoints: liveness, readiness and Prometheus metrics. Unauthenticated by design (probes and
scrapers), and they reveal only counts, never names or reasons."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from slotkeeper import metrics as counters
from slotkeeper.middleware import DualModeMiddleware
from slotkeeper.planlock import PlanBusy, is_busy_error


class ProbeMiddleware(DualModeMiddleware):
    """Answers /healthz, /readyz and /metrics before the Host check: a kubelet probes, and Prometheus scrapes, by
    pod IP, which is (rightly) not in ALLOWED_HOSTS; a 400 there would keep every web pod out of rotation, and
    every scrape would fail.

    Sync or async as the stack is (slotkeeper.middleware.DualModeMiddleware); under Daphne, sync, inside the one
    hand-off the handler makes per request (slotkeeper/handler.py), so a probe costs what it did when this
    middleware ran async and handed the probe itself to a thread."""

    def sync_call(self, request):
        probe = _PROBES.get(request.path)
        return probe(request) if probe else self.get_response(request)

    async def __acall__(self, request):
        probe = _PROBES.get(request.path)
        if probe:
            return await sync_to_async(probe)(request)
        return await self.get_response(request)


class BusyMiddleware(DualModeMiddleware):
    """A console page whose action could not have the plan lock in time answers 503 with Retry-After (the API does
    the same in its exception handler) instead of a 500: the request changed nothing and may be sent again.

    Django adapts the sync `process_exception` to the async stack; it runs only on the exception path."""

    def process_exception(self, request, exception):
        if isinstance(exception, PlanBusy) or is_busy_error(exception):
            response = HttpResponse(
                "The scheduler is busy; try again in a moment.", status=503, content_type="text/plain"
            )
            response["Retry-After"] = str(PlanBusy.retry_after_s)
            return response
        return None


# Readiness reports from the apps (name -> a function returning "ok" or a short text), registered at start-up.
_checks: dict[str, object] = {}


def register_check(name: str, check) -> None:
    """A check /readyz reports without gating on it (the apps' own health, such as the scheduler's last tick)."""
    _checks[name] = check


@require_GET
def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


@require_GET
def readyz(request):
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        executor = MigrationExecutor(connection)
        unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes())
        checks["database"] = "ok"
        checks["migrations"] = "ok" if not unapplied else f"{len(unapplied)} unapplied"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    if settings.REDIS_URL:
        try:
            import redis

            redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1).ping()
            checks["redis"] = "ok"
        except Exception as exc:
            checks["redis"] = f"error: {type(exc).__name__}"
    reported = set()
    for name, check in _checks.items():
        try:
            checks[name] = check()  # type: ignore[operator]
        except Exception as exc:
            checks[name] = f"error: {type(exc).__name__}"
        reported.add(name)
    # Redis is reported but does not make the process unready: without it scheduling goes on (the database is the
    # record) and consoles fall back to polling, so taking every web pod out of rotation would be the bigger outage.
    # The same holds for a failing tick: this web process is fine, and the alert and /metrics say what is not.
    ready = all(v == "ok" for k, v in checks.items() if k != "redis" and k not in reported)
    return JsonResponse({"ready": ready, "checks": checks}, status=200 if ready else 503)


@require_GET
def metrics(request):
    # Every process's series in PROMETHEUS_MULTIPROC_DIR and the fleet's gauges, in Prometheus' text format with
    # HELP and TYPE (slotkeeper/metrics.py, docs/metrics.md).
    body, content_type = counters.exposition()
    return HttpResponse(body, content_type=content_type)


_PROBES = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}
