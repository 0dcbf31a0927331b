"""Process-local counters for /metrics. Gauges that the database knows (nodes by status, queue length) are read at
scrape time instead, so every Daphne process reports the same fleet-wide numbers."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

_lock = threading.Lock()
_gauge_sources: list[Callable[[], list[tuple[str, dict[str, str], float]]]] = []
_counters: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()


def inc(name: str, amount: float = 1, **labels: str) -> None:
    key = (name, tuple(sorted(labels.items())))
    with _lock:
        _counters[key] += amount


def snapshot() -> list[tuple[str, dict[str, str], float]]:
    with _lock:
        return [(name, dict(labels), value) for (name, labels), value in sorted(_counters.items())]


def register_gauges(source: Callable[[], list[tuple[str, dict[str, str], float]]]) -> None:
    if source not in _gauge_sources:
        _gauge_sources.append(source)


def gauges() -> list[tuple[str, dict[str, str], float]]:
    out: list[tuple[str, dict[str, str], float]] = []
    for source in _gauge_sources:
        out.extend(source())
    return out


_levels: Counter[str] = Counter()


def add_gauge(name: str, delta: float) -> None:
    """A process-local level (websocket clients of this Daphne); reported with the process's counters."""
    with _lock:
        _levels[name] += delta


def _levels_source() -> list[tuple[str, dict[str, str], float]]:
    with _lock:
        return [(name, {}, value) for name, value in sorted(_levels.items())]


register_gauges(_levels_source)
