"""Celery tasks of the fleet (distributed run). They call the same actions the embedded loop calls."""

from celery import shared_task
from django.utils import timezone

from fleet import actions


@shared_task(ignore_result=True)
def sweep_nodes() -> None:
    actions.sweep(timezone.now())
