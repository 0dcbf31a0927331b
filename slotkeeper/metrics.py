"""/metrics through prometheus-client in multiprocess mode: every series with its HELP and TYPE (docs/metrics.md).

Three kinds of series, each combined over processes in the way that stays true when several Daphnes and Celery
workers share one PROMETHEUS_MULTIPROC_DIR:

- events, counted or timed where they happen (`inc`, `observe`): counters and histograms that each process writes
  to its own files in the directory; a scrape sums them over every process that wrote there, the dead included,
  so a total never goes back when a process ends;
- a process's own levels (its websocket clients, its database pool) and its own running totals that no event
  reports (the garbage collector's, the pool's): gauges with a multiprocess mode that says how processes combine
  (`livesum`: a dead process's level goes with it), and counters fed by `sample`;
- the fleet's state, which the database knows (nodes by status, leases by state, the queue, the last tick):
  read at scrape time by whichever process answers (`register_gauges`), once, so two Daphnes never report it
  twice.

The directory is PROMETHEUS_MULTIPROC_DIR when it is set (shared by the processes of one host or pod, emptied
before they start). Unset, a process makes a temporary one of its own at import, shared with the processes it
forks (Celery's pool) and removed when it exits: `make run` and the tests need no configuration, and a Daphne
started without it reports exactly its own series, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

ENV = "PROMETHEUS_MULTIPROC_DIR"
# Set beside ENV when this module made the directory: a process started (not forked) by one that holds such a
# directory makes its own rather than adding its series to its parent's.
MADE_HERE = "SLOTKEEPER_METRICS_DIR_MADE"


ORPHAN_PREFIX = "slotkeeper-metrics-"


def _remove_orphans() -> None:
    """The temporary directories of processes that ended without removing theirs: killed, or stopped by the
    shutdown's deadline (os._exit runs no atexit hook). Each is named by its maker's pid."""
    import psutil

    for path in glob.glob(os.path.join(tempfile.gettempdir(), ORPHAN_PREFIX + "*-*")):
        pid = os.path.basename(path)[len(ORPHAN_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _prepare_directory() -> str:
    configured = os.environ.get(ENV, "")
    if configured and configured != os.environ.get(MADE_HERE):
        os.makedirs(configured, exist_ok=True)
        return configured
    maker = os.getpid()
    _remove_orphans()
    path = tempfile.mkdtemp(prefix=f"{ORPHAN_PREFIX}{maker}-")
    os.environ[ENV] = os.environ[MADE_HERE] = path

    def remove() -> None:
        if os.getpid() == maker:  # a forked child runs its parent's atexit hooks too
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path


DIRECTORY = _prepare_directory()

# prometheus-client picks its value class when it is first imported, from the environment set just above.
from prometheus_client import (  # noqa: E402
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
    values,
)
from prometheus_client.core import GaugeMetricFamily  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead  # noqa: E402

if not values.ValueClass._multiprocess:
    # Something imported prometheus-client before this module set the directory: every series this module makes
    # must still go to the files, or a scrape would not see it.
    values.ValueClass = values.MultiProcessValue()

# -- what every series is --------------------------------------------------------------------------------------

# Counted where it happens, by `inc(name, amount, **labels)`: name -> (HELP, label names).
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "slotkeeper_heartbeats_total": (
        "Heartbeats accepted (the fast route in front of Django and the view).",
        (),
    ),
    "slotkeeper_fenced_heartbeats_total": (
        "Heartbeats refused because their node is fenced (declared dead).",
        (),
    ),
    "slotkeeper_heartbeat_flushes_total": (
        "Flushes of a process's heartbeat buffer that had something to write.",
        (),
    ),
    "slotkeeper_heartbeats_buffered_total": ("Buffered heartbeats taken by a flush.", ()),
    "slotkeeper_heartbeats_flushed_total": (
        "Buffered heartbeats written, by how: set (one statement for many nodes) or node (the per-node action).",
        ("how",),
    ),
    "slotkeeper_placements_total": (
        "Placement decisions, by kind (lease, preview, reschedule) and outcome.",
        ("kind", "outcome"),
    ),
    "slotkeeper_lease_submissions_total": (
        "Lease requests decided, by lease type and whether they were accepted.",
        ("type", "accepted"),
    ),
    "slotkeeper_ticks_total": ("Scheduler ticks completed.", ()),
    "slotkeeper_tick_failures_total": ("Scheduler ticks that failed.", ()),
    "slotkeeper_plan_passes_total": ("Planning passes run under the plan lock.", ()),
    "slotkeeper_plan_pass_seconds_total": ("Wall time of planning passes, summed (seconds).", ()),
    "slotkeeper_plan_batched_requests_total": ("Lease requests planned by a pass (group commit).", ()),
    "slotkeeper_plan_pass_cpu_seconds_total": (
        "CPU time of planning passes by part (read, catch_up, prepare, requests, caller, write).",
        ("part",),
    ),
    "slotkeeper_plan_pass_restarts_total": (
        "Planning passes restarted from the database after a failed submit.",
        (),
    ),
    "slotkeeper_scheduler_reads_total": (
        "Read-only questions to the scheduler, by how: read (the cached plan) or pass (a pass was needed).",
        ("how",),
    ),
    "slotkeeper_scheduler_cache_total": (
        "Passes by how the cached scheduler was brought up to date.",
        ("how",),
    ),
    "slotkeeper_scheduler_caught_up_leases_total": (
        "Leases re-read to bring a cached scheduler up to date.",
        (),
    ),
    "slotkeeper_leases_isolated_total": ("Leases the scheduler isolated because it could not plan them.", ()),
    "slotkeeper_forecast_runs_total": ("Queue forecasts, by outcome (written or dropped).", ("outcome",)),
    "slotkeeper_forecast_cpu_seconds_total": ("CPU time spent on queue forecasts (seconds).", ()),
    "slotkeeper_placement_reports_pruned_total": (
        "Placement reports deleted by retention, by kind.",
        ("kind",),
    ),
}

# Timed where it happens, by `observe(name, seconds, **labels)`: name -> (HELP, label names, bucket bounds).
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "slotkeeper_http_request_duration_seconds": (
        "Time from a request's arrival to its answer's status line, by route name and status class "
        "(closed: the client left first).",
        ("route", "status_class"),
        (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    ),
    "slotkeeper_plan_pass_duration_seconds": (
        "Wall time of one planning pass under the plan lock.",
        (),
        (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    ),
    "slotkeeper_heartbeat_age_seconds": (
        "How old a node's last stored heartbeat was when its next one was received.",
        (),
        (1.0, 2.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0),
    ),
    "slotkeeper_lease_wait_seconds": (
        "A lease's wait from its submission to its first start, by lease type.",
        ("type",),
        (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0),
    ),
}

# Levels one process holds, set by `add_gauge`, `set_gauge` or a sampled source: name -> (HELP, multiprocess
# mode). livesum: the level of the processes alive, summed. mostrecent: the value last set by any process. max:
# the largest any process set.
GAUGES: dict[str, tuple[str, str]] = {
    "slotkeeper_websocket_clients": ("Console websockets open.", "livesum"),
    "slotkeeper_plan_batch_size_last": ("Lease requests planned by the last planning pass.", "mostrecent"),
    "slotkeeper_plan_pass_seconds_last": ("Wall time of the last planning pass (seconds).", "mostrecent"),
    "slotkeeper_plan_batch_size_max": ("The largest batch of lease requests one pass has planned.", "max"),
    "slotkeeper_db_pool_min": (
        "Database pool: connections kept open at least (summed over processes).",
        "livesum",
    ),
    "slotkeeper_db_pool_max": (
        "Database pool: connections allowed at most (summed over processes).",
        "livesum",
    ),
    "slotkeeper_db_pool_size": ("Database pool: connections open, lent out or not.", "livesum"),
    "slotkeeper_db_pool_available": ("Database pool: connections open and idle in the pool.", "livesum"),
    "slotkeeper_db_pool_waiting": ("Database pool: requests queued for a connection right now.", "livesum"),
}

# Running totals a process keeps itself, turned into counters by `sample`: name -> (HELP, label names).
SAMPLED_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "slotkeeper_gc_collections_total": ("Garbage collections, by generation.", ("generation",)),
    "slotkeeper_gc_seconds_total": (
        "Time spent in garbage collections, by generation (seconds).",
        ("generation",),
    ),
    "slotkeeper_gc_collected_objects_total": (
        "Unreachable objects the garbage collector freed, by generation.",
        ("generation",),
    ),
    "slotkeeper_db_pool_requests_total": ("Database pool: connections asked for.", ()),
    "slotkeeper_db_pool_requests_queued_total": (
        "Database pool: requests that had to wait for a connection.",
        (),
    ),
    "slotkeeper_db_pool_requests_wait_ms_total": (
        "Database pool: time requests waited for a connection (ms).",
        (),
    ),
    "slotkeeper_db_pool_timeouts_total": ("Database pool: requests that waited past DB_POOL_TIMEOUT_S.", ()),
    "slotkeeper_db_pool_connections_opened_total": ("Database pool: connections opened.", ()),
    "slotkeeper_db_pool_connection_errors_total": ("Database pool: connection attempts that failed.", ()),
    "slotkeeper_db_pool_connections_lost_total": ("Database pool: connections found broken.", ()),
}

# The fleet's state, read from the database at scrape time by `register_gauges` sources: name -> HELP.
SCRAPED: dict[str, str] = {
    "slotkeeper_nodes": "Nodes by status.",
    "slotkeeper_leases": "Leases by state.",
    "slotkeeper_reservations": "Slot-table reservations by status.",
    "slotkeeper_queue_length": "Leases queued (best-effort leases waiting for room, suspended ones included).",
    "slotkeeper_plan_queue_depth": "Lease requests stored and waiting for a planning pass.",
    "slotkeeper_last_tick_age_seconds": "Seconds since the scheduler's last completed tick.",
    "slotkeeper_last_tick_duration_seconds": "Wall time of the scheduler's last tick (seconds).",
    "slotkeeper_tick_failures_in_a_row": "Scheduler ticks that failed since the last one that passed.",
    "slotkeeper_reschedules": "Reschedules of lost or drained instances, by status.",
}


def series() -> set[str]:
    """Every series name /metrics can show (a histogram's as its family name)."""
    return {*COUNTERS, *HISTOGRAMS, *GAUGES, *SAMPLED_COUNTERS, *SCRAPED}


# -- writing ---------------------------------------------------------------------------------------------------

_made: dict[str, Counter | Gauge | Histogram] = {}
_declared: set[str] = set()
_make_lock = threading.Lock()


def _metric(name: str, labels: Iterable[str] = ()) -> Counter | Gauge | Histogram:
    metric = _made.get(name)
    if metric is not None:
        return metric
    with _make_lock:
        if name not in _made:
            # Registered nowhere: a scrape reads the files (`exposition`), never a registry of this process.
            if name in COUNTERS or name in SAMPLED_COUNTERS:
                help_, names = COUNTERS.get(name) or SAMPLED_COUNTERS[name]
                _made[name] = Counter(name, help_, names, registry=None)
            elif name in HISTOGRAMS:
                help_, names, buckets = HISTOGRAMS[name]
                _made[name] = Histogram(name, help_, names, registry=None, buckets=buckets)
            elif name in GAUGES:
                help_, mode = GAUGES[name]
                _made[name] = Gauge(name, help_, registry=None, multiprocess_mode=mode)
            else:
                # A series no table names (a new call site): counted all the same, and tests/test_metrics.py
                # fails until it is described.
                log.warning("metric %s is not described in slotkeeper/metrics.py", name)
                _made[name] = Counter(name, "(not described)", sorted(labels), registry=None)
        return _made[name]


def _child(metric, labels: dict[str, str]):
    return metric.labels(**labels) if labels else metric


def inc(name: str, amount: float = 1, **labels: str) -> None:
    """Counts an event in this process (summed over processes at scrape time). Never raises: a miscounted
    series must not fail the pass or the request that counted it."""
    try:
        _child(_metric(name, labels), labels).inc(amount)
    except Exception:
        log.exception("metric %s not counted", name)


def observe(name: str, value: float, **labels: str) -> None:
    """Adds one observation to a histogram of HISTOGRAMS. Never raises, as `inc`."""
    try:
        _child(_metric(name), labels).observe(value)
    except Exception:
        log.exception("metric %s not observed", name)


def add_gauge(name: str, delta: float) -> None:
    """Moves one of this process's levels (GAUGES, livesum): websocket clients of this Daphne."""
    try:
        _metric(name).inc(delta)  # type: ignore[union-attr]
    except Exception:
        log.exception("gauge %s not moved", name)


def set_gauge(name: str, value: float) -> None:
    try:
        _metric(name).set(value)  # type: ignore[union-attr]
    except Exception:
        log.exception("gauge %s not set", name)


class HttpTimer:
    """The request-duration histogram's children by (route, status class), made once each: a heartbeat's
    observation is then one dictionary look-up and two writes to this process's file."""

    def __init__(self) -> None:
        self._children: dict[tuple[str, str], object] = {}

    def observe(self, route: str, status_class: str, seconds: float) -> None:
        child = self._children.get((route, status_class))
        if child is None:
            metric = _metric("slotkeeper_http_request_duration_seconds")
            child = self._children[(route, status_class)] = metric.labels(
                route=route, status_class=status_class
            )
        child.observe(seconds)  # type: ignore[attr-defined]


http = HttpTimer()


# -- a process's own running figures ---------------------------------------------------------------------------

Rows = list[tuple[str, dict[str, str], float]]
_process_sources: list[Callable[[], Rows]] = []
_reported: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
_sample_lock = threading.Lock()
_last_sample = [0.0]
_rebase = [False]
SAMPLE_EVERY_S = 5.0


def register_process_source(source: Callable[[], Rows]) -> None:
    """A source of this process's own figures: rows of GAUGES (set as they are) and SAMPLED_COUNTERS (running
    totals since the process started; the increase since the last sample is counted)."""
    if source not in _process_sources:
        _process_sources.append(source)


def sample() -> None:
    """Writes this process's own figures to its files: at every scrape of this process, and every
    SAMPLE_EVERY_S from `sample_soon` (a request's end, a task's end), so a scrape of any process sees every
    other's within seconds."""
    with _sample_lock:
        _last_sample[0] = time.monotonic()
        rebase, _rebase[0] = _rebase[0], False
        for source in _process_sources:
            try:
                rows = source()
            except Exception:
                log.exception("metrics source %s failed", getattr(source, "__name__", source))
                continue
            for name, labels, value in rows:
                if name in GAUGES:
                    set_gauge(name, value)
                    continue
                key = (name, tuple(sorted(labels.items())))
                before = _reported.get(key)
                _reported[key] = value
                # A forked child starts from its parent's totals, and a pool made anew from zero: counted from
                # there. An increase of 0 still writes the series, so it is shown from the first scrape.
                grown = 0.0 if rebase or (before is not None and value < before) else value - (before or 0.0)
                inc(name, grown, **labels)


def sample_soon() -> None:
    if time.monotonic() - _last_sample[0] >= SAMPLE_EVERY_S:
        sample()


def _after_fork() -> None:
    _rebase[0] = True
    _last_sample[0] = 0.0


os.register_at_fork(after_in_child=_after_fork)


# -- scraping --------------------------------------------------------------------------------------------------

_gauge_sources: list[Callable[[], Rows]] = []


def register_gauges(source: Callable[[], Rows]) -> None:
    """A source of fleet-wide gauges read at scrape time (the database's): rows of SCRAPED."""
    if source not in _gauge_sources:
        _gauge_sources.append(source)


def gauges() -> Rows:
    out: Rows = []
    for source in _gauge_sources:
        out.extend(source())
    return out


class ScrapedCollector:
    """The fleet-wide gauges, read by the process that answers the scrape."""

    def collect(self):
        families: dict[str, GaugeMetricFamily] = {}
        for name, labels, value in gauges():
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(
                    name, SCRAPED.get(name, "(not described)"), labels=sorted(labels)
                )
            family.add_metric([labels[k] for k in sorted(labels)], value)
        return list(families.values())


def forget_dead() -> None:
    """Drops the live gauges of processes that died without saying so (killed, crashed): a shared directory
    belongs to one host or pod, so a pid that is not running there is gone."""
    import psutil

    for path in glob.glob(os.path.join(DIRECTORY, "gauge_live*_*.db")):
        pid = os.path.basename(path).rsplit("_", 1)[-1].removesuffix(".db")
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            with contextlib.suppress(OSError):
                mark_process_dead(int(pid), DIRECTORY)


def collect_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=DIRECTORY)
    registry.register(ScrapedCollector())
    return registry


# The text format every Prometheus reads, as /metrics said before (prometheus-client 0.26 names its own 1.0.0,
# which a Prometheus before 3.0 does not know; the lines are the same for names like ours).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _declare() -> None:
    """Every series without labels, at 0 in this process's files if nothing counted it yet: a series that
    appears only with its first event leaves a dashboard empty and an alert's rate() undefined until then. The
    pool's are left out: they are there only where a pool is (PostgreSQL)."""
    for name in (*COUNTERS, *HISTOGRAMS, *GAUGES):
        labels = COUNTERS[name][1] if name in COUNTERS else HISTOGRAMS[name][1] if name in HISTOGRAMS else ()
        if not labels and not name.startswith("slotkeeper_db_pool_"):
            _metric(name)
            _declared.add(name)


def exposition() -> tuple[bytes, str]:
    """What /metrics answers: every process's files in the directory, and the fleet's gauges."""
    if not _declared:
        _declare()
    sample()
    forget_dead()
    return generate_latest(collect_registry()), CONTENT_TYPE


class DirectoryCollector:
    """Every process's series in the directory, the dead's live gauges left out."""

    def collect(self):
        forget_dead()
        return MultiProcessCollector(None, path=DIRECTORY).collect()


def serve(port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 (a pod's port, scraped by its IP)
    """The directory's series over HTTP on a thread of this process, for a process that serves no /metrics of
    its own (a Celery worker's main process). The fleet's gauges are left to the web's /metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DirectoryCollector())
    start_http_server(port, addr, registry=registry)
    log.info("metrics served", extra={"port": port})


def snapshot() -> Rows:
    """Every counter's samples as a scrape would sum them (name with `_total`, labels, value)."""
    sample()
    out: Rows = []
    for family in MultiProcessCollector(None, path=DIRECTORY).collect():
        if family.type == "counter":
            out += [(s.name, dict(s.labels), s.value) for s in family.samples if s.name.endswith("_total")]
    return sorted(out, key=lambda row: (row[0], sorted(row[1].items())))


def value(name: str, **labels: str) -> float:
    """One sample's value as a scrape of this directory reads it (0 when absent): for tests and tools."""
    for family in collect_registry().collect():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def process_exits() -> None:
    """This process's live gauges leave the sums (its counters stay: a total does not go back)."""
    with contextlib.suppress(OSError):
        mark_process_dead(os.getpid(), DIRECTORY)


atexit.register(process_exits)


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


def pool_gauges() -> Rows:
    """The default database's pool, once this process has one (PostgreSQL with DB_POOL on); nothing otherwise.
    Never makes the pool: this runs on the event loop too (`sample_soon`), where opening connections would
    stall every request, and in processes that never touch the database."""
    from django.conf import settings
    from django.db import connections

    if not getattr(settings, "DB_POOL", False):
        return []
    wrapper = connections["default"]
    # Django keeps the pools by alias on the wrapper's class and makes one on the first read of `.pool`.
    pool = getattr(type(wrapper), "_connection_pools", {}).get(wrapper.alias)
    if pool is None:
        return []
    stats = pool.get_stats()
    return [(name, {}, stats.get(key, 0)) for key, name in (POOL_LEVELS | POOL_TOTALS).items()]
