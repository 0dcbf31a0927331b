"""The periodic work, in one place for both runs: the embedded loop calls it, and Celery beat schedules the same
steps as tasks (leases/instances/tasks.py). Each step is its own set of transactions, so one failing does not hold
the others back.

Part of the composition layer: it names the steps itself (the sweep, then the tick, both composed in the
instances package) instead of keeping a registry that apps fill in at start-up and that calls them back.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.utils import timezone

from leases import forecasting
from leases.instances.actions import periodic
from slotkeeper import shutdown

log = logging.getLogger(__name__)

# Where this process's ticks compute a large queue's forecast: on a thread of their own, throttled, so a forecast
# of 6-16 s no longer holds the next round's sweep back past SWEEP_OUTAGE_GAP_S (leases/forecasting.py).
FORECASTS = forecasting.Background()

# (name, step, the least seconds between two runs of it in this process, or None for every round). Retention has
# nothing to do most rounds: looking once a minute is plenty (beat schedules it the same way).
STEPS = (
    ("fleet.sweep", periodic.sweep, None),
    ("leases.tick", lambda now: periodic.tick(now, FORECASTS), None),
    ("reports.retention", periodic.retain, "RETENTION_EVERY_S"),
)

_last_run: dict[str, float] = {}
_clock = time.monotonic


def run_periodic() -> None:
    for name, step, every in STEPS:
        if shutdown.begun():
            # The process is stopping: the step in hand has finished; the next round, here or in another
            # process, does the rest (every step is idempotent and takes `now`).
            log.info("periodic round cut short: shutting down", extra={"skipped": name})
            return
        if every is not None:
            last, at = _last_run.get(name), _clock()
            if last is not None and at - last < settings.SLOTKEEPER[every]:
                continue
            _last_run[name] = at
        try:
            step(timezone.now())
        except Exception:
            log.exception("periodic step failed", extra={"step": name})
