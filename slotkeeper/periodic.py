"""The periodic work, in one place for both runs: the embedded loop calls it, and Celery beat schedules the same
functions as tasks. Each step is its own set of transactions, so one failing does not hold the others back."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.utils import timezone

log = logging.getLogger(__name__)

_steps: list[tuple[str, Callable]] = []


def register(name: str, step: Callable) -> None:
    if all(existing != name for existing, _ in _steps):
        _steps.append((name, step))


def run_periodic() -> None:
    for name, step in list(_steps):
        try:
            step(timezone.now())
        except Exception:
            log.exception("periodic step failed", extra={"step": name})
