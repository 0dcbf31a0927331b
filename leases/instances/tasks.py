"""Celery tasks of leases (distributed run): the tick, the same function the embedded loop calls."""

from celery import shared_task
from django.utils import timezone

from leases import actions


@shared_task(ignore_result=True)
def tick() -> None:
    actions.tick(timezone.now())
