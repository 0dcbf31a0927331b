"""Celery tasks (distributed run): the same composed steps the embedded loop calls, scheduled by beat
(settings.CELERY_BEAT_SCHEDULE). Here, not in fleet or the lease core, because each step composes both."""

from celery import shared_task
from django.utils import timezone

from leases.instances.actions import periodic


@shared_task(ignore_result=True)
def tick() -> None:
    periodic.tick(timezone.now())


@shared_task(ignore_result=True)
def sweep_nodes() -> None:
    periodic.sweep(timezone.now())


@shared_task(ignore_result=True)
def retain_reports() -> None:
    periodic.retain(timezone.now())
