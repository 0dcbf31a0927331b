"""The garbage collector's settings for a long-running Slotkeeper process: each Daphne, each Celery worker process,
the embedded console.

With CPython's defaults (a young collection every 700 allocations, an old one every hundred of those when the
survivors have grown by a quarter), a web process holding the scheduler's plan at 1,000 nodes spent 30-40 ms of
the collector per lease decision and paused for a full collection of up to 220 ms every few decisions: a planning
pass leaves thousands of survivors, so the full collections came often and walked the whole heap, whichever
request or heartbeat was running (docs/benchmarks/reports.md, the fifth session's run).

So, once start-up is done:
- what start-up built (modules, classes, settings, URL patterns: alive as long as the process) is frozen out of
  the collector's view (`gc.freeze`, as CPython's documentation suggests for long-lived servers);
- the young generation is collected every SLOTKEEPER_GC_THRESHOLD allocations (default 10,000) instead of 700:
  fewer collections, each still small. Memory held by cyclic garbage between collections stays bounded by that
  count; 0 keeps CPython's defaults.

Nothing is disabled: reference counting frees most objects at once, and every generation is still collected.

What the collector costs is on /metrics, per generation (`watch`): `slotkeeper_gc_collections_total`,
`slotkeeper_gc_seconds_total` (the time collections took, during which the process runs nothing else) and
`slotkeeper_gc_collected_objects_total` (cyclic garbage found). In a burst of lease requests at 1,000 nodes it was
about a tenth of a Daphne's CPU (docs/benchmarks/burst-http.md, the twenty-sixth session).
"""

from __future__ import annotations

import gc
import logging
import time

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


# Per generation: collections, seconds, objects collected. Written by the collector's callback, which runs with
# the GIL held and never nests (one collection at a time), and read whole by a scrape.
_spent = [[0, 0.0, 0] for _ in range(3)]
_started = [0.0]


def _on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    row = _spent[info["generation"]]
    row[0] += 1
    row[1] += time.perf_counter() - _started[0]
    row[2] += info["collected"]


def watch() -> None:
    """Counts this process's collections and their time for /metrics (`gauges`). Idempotent."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def gauges() -> list[tuple[str, dict[str, str], float]]:
    rows = []
    for generation, (count, seconds, collected) in enumerate(_spent):
        labels = {"generation": str(generation)}
        rows.append(("slotkeeper_gc_collections_total", labels, count))
        rows.append(("slotkeeper_gc_seconds_total", labels, seconds))
        rows.append(("slotkeeper_gc_collected_objects_total", labels, collected))
    return rows
