"""The garbage collector's settings for a long-running Slotkeeper process: each Daphne, each Celery worker process,
the embedded console.

With CPython's defaults (a young collection every 700 allocations, an old one every hundred of those when the
survivors have grown by a quarter), a web process holding the scheduler's plan at 1,000 nodes spent 30-40 ms of
the collector per lease decision and paused for a full collection of up to 220 ms every few decisions: a planning
pass leaves thousands of survivors, so the full collections came often and walked the whole heap, whichever
request or heartbeat was running (docs/BENCHMARKS.md, "Placement reports", the collector run).

So, once start-up is done:
- what start-up built (modules, classes, settings, URL patterns: alive as long as the process) is frozen out of
  the collector's view (`gc.freeze`, as CPython's documentation suggests for long-lived servers);
- the young generation is collected every SLOTKEEPER_GC_THRESHOLD allocations (default 10,000) instead of 700:
  fewer collections, each still small. Memory held by cyclic garbage between collections stays bounded by that
  count; 0 keeps CPython's defaults.

Nothing is disabled: reference counting frees most objects at once, and every generation is still collected.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

GENERATIONS = (10, 10)  # CPython's own ratios between the generations


def tune(threshold: int) -> None:
    """Freeze what start-up built and collect the young generation every `threshold` allocations (0: leave the
    collector as CPython sets it). Idempotent: a second call freezes only what was built since."""
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, *GENERATIONS)
    log.info("collector tuned", extra={"threshold": threshold, "frozen": gc.get_freeze_count()})


def tune_from_settings() -> None:
    from django.conf import settings

    tune(settings.SLOTKEEPER["GC_THRESHOLD"])
