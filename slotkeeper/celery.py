"""Celery for the distributed run: Redis broker, beat schedule in settings (CELERY_BEAT_SCHEDULE)."""

import os

from celery import Celery
from celery.signals import (
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
)

from slotkeeper.logging import new_request_id, request_id_var

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotkeeper.settings")

app = Celery("slotkeeper")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@before_task_publish.connect
def carry_request_id(headers=None, **_):
    # The request id of the HTTP request that enqueued a task follows it into the worker's logs.
    if headers is not None:
        headers.setdefault("request_id", request_id_var.get())


@task_prerun.connect
def adopt_request_id(task=None, **_):
    rid = getattr(task.request, "request_id", None) or (task.request.headers or {}).get("request_id")
    request_id_var.set(rid or new_request_id())


@worker_init.connect
@worker_process_init.connect
def tune_collector(**_):
    # A worker's start-up is done (in each pool process too): tune the collector (slotkeeper/collector.py).
    from slotkeeper.collector import tune_from_settings

    tune_from_settings()


@task_postrun.connect
def sample_metrics(**_):
    # The pool process's own figures (its collector, its database pool) into the shared metrics directory, every
    # few seconds of work: a worker serves no /metrics, the Daphnes sharing its directory do (docs/metrics.md).
    from slotkeeper import metrics

    metrics.sample_soon()


@worker_process_shutdown.connect
def forget_process_metrics(**_):
    # A pool process ends with os._exit, which runs no atexit hook: its live gauges leave the sums here.
    from slotkeeper import metrics

    metrics.process_exits()


@worker_ready.connect
def serve_metrics(**_):
    # In the worker's main process, once its pool runs: the series of every process in this worker's metrics
    # directory, where no Daphne reads them (SLOTKEEPER_METRICS_PORT; docs/metrics.md).
    from django.conf import settings

    if settings.METRICS_PORT:
        from slotkeeper import metrics

        metrics.serve(settings.METRICS_PORT)
