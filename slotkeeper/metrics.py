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


# psycopg-pool's figures for this process's database pool (settings.DB_POOL): levels as gauges, its running totals
# as counters. `get_stats` leaves a total out until it first moves, so every name is always reported (0).
POOL_LEVELS = {
    "pool_min": "slotkeeper_db_pool_min",
    "pool_max": "slotkeeper_db_pool_max",
    "pool_size": "slotkeeper_db_pool_size",  # connections open, lent out or not
    "pool_available": "slotkeeper_db_pool_available",  # open and idle in the pool
    "requests_waiting": "slotkeeper_db_pool_waiting",  # requests queued for a connection right now
}
POOL_TOTALS = {
    "requests_num": "slotkeeper_db_pool_requests_total",
    "requests_queued": "slotkeeper_db_pool_requests_queued_total",  # had to wait
    "requests_wait_ms": "slotkeeper_db_pool_requests_wait_ms_total",
    "requests_errors": "slotkeeper_db_pool_timeouts_total",  # waited past DB_POOL_TIMEOUT_S
    "connections_num": "slotkeeper_db_pool_connections_opened_total",
    "connections_errors": "slotkeeper_db_pool_connection_errors_total",
    "connections_lost": "slotkeeper_db_pool_connections_lost_total",
}


def pool_gauges() -> list[tuple[str, dict[str, str], float]]:
    """The default database's pool, when there is one (PostgreSQL with DB_POOL on); nothing otherwise."""
    from django.conf import settings
    from django.db import connections

    if not getattr(settings, "DB_POOL", False):
        return []
    pool = connections["default"].pool  # created on the first connection; this call creates it if need be
    if pool is None:
        return []
    stats = pool.get_stats()
    return [(name, {}, stats.get(key, 0)) for key, name in (POOL_LEVELS | POOL_TOTALS).items()]
