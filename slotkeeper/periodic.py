"""The periodic work, in one place for both runs: the embedded loop calls it, and Celery beat schedules the same
functions as tasks. Each step is its own set of transactions, so one failing does not hold the others back."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.utils import timezone

from slotkeeper import shutdown

log = logging.getLogger(__name__)

_steps: list[tuple[str, Callable]] = []


def register(name: str, step: Callable) -> None:
    if all(existing != name for existing, _ in _steps):
        _steps.append((name, step))


def run_periodic() -> None:
    for name, step in list(_steps):
        if shutdown.begun():
            # The process is stopping: the step in hand has finished; the next round, here or in another
            # process, does the rest (every step is idempotent and takes `now`).
            log.info("periodic round cut short: shutting down", extra={"skipped": name})
            return
        try:
            step(timezone.now())
        except Exception:
            log.exception("periodic step failed", extra={"step": name})
