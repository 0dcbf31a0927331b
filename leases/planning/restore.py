"""How a pass gets its scheduler: the one this process cached when its last pass committed, kept as it is when the
database's version and the fleet's shape are the ones it planned, caught up when it is a few versions behind
(re-reading only the leases the versions it missed touched, `PlanVersion`), else restored from the database
(`load`: every lease that is not over, with every reservation it ever had).

The cache is this module's alone: a pass takes the scheduler out of it (`_take_cached`) and puts it back only when
it commits (leases/planning/passes.py), and a read asks it under `_cache_lock` (leases/planning/reading.py). A
reload costs one read of every live lease, so a burst of submissions to one process does not pay it each time."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from fleet import capacity
from leases import reads
from leases.lifecycle import TERMINAL_LEASE_STATES, LeaseState
from leases.models import Lease, PlanVersion, Reservation, SchedulerState
from leases.planning.records import live_label, node_capacity, record_of, scheduler_config
from leases.scheduler import LeaseRecord, Scheduler
from slotkeeper import metrics, planlock

log = logging.getLogger(__name__)


@dataclass
class _Cached:
    version: int
    fingerprint: tuple
    scheduler: Scheduler


class _Cache:
    value: _Cached | None = None


_cache = _Cache()
# Held by a read (`reading.consulting`) for as long as it asks the cached scheduler, and by a pass while it takes
# that scheduler out of the cache: a pass never changes the object a read is still asking, and a read never asks
# one a pass has taken. Never held while waiting for the database's locks (a read only SELECTs under it), so it
# cannot deadlock with the plan lock; each wait for it is bounded all the same.
_cache_lock = threading.Lock()

# How far a cached scheduler may be behind and still catch up; further, or with the versions it missed pruned,
# it reloads. Catching up re-reads the touched leases one version after another's union: past a few hundred
# versions that union approaches every live lease anyway.
MAX_CATCH_UP = 200


@dataclass
class CacheStats:
    """How this process's last pass got its scheduler (tests and /metrics read it)."""

    how: str = ""  # "kept", "caught_up", "reloaded"
    behind: int = 0  # versions the cache was behind
    reread: int = 0  # leases re-read by catching up


cache_stats = CacheStats()


def _take_cached() -> _Cached | None:
    """The cached scheduler, taken out of the cache for a pass (until the pass commits, nothing in memory can be
    trusted). Waits for a read that is asking it; past the plan lock's timeout the pass loads its own instead."""
    if not _cache_lock.acquire(timeout=planlock.timeout_s()):
        log.warning("a read held the cached scheduler past the plan lock's timeout; the pass loads its own")
        return None
    try:
        cached, _cache.value = _cache.value, None
        return cached
    finally:
        _cache_lock.release()


def _current_scheduler(
    cached: _Cached | None, state: SchedulerState, nodes: list[capacity.NodeState], fingerprint: tuple
) -> Scheduler:
    """The cached scheduler if it is current, caught up if it is a little behind, else a fresh load."""
    behind = state.version - cached.version if cached is not None else -1
    if cached is not None and cached.fingerprint == fingerprint and 0 <= behind <= MAX_CATCH_UP:
        if behind == 0:
            _note_cache("kept", 0, 0)
            return cached.scheduler
        missed = list(
            PlanVersion.objects.filter(version__gt=cached.version, version__lte=state.version).values_list(
                "leases", flat=True
            )
        )
        if len(missed) == behind:  # none pruned
            sched = cached.scheduler
            reread = catch_up(sched, {lease_id for ids in missed for lease_id in ids}, nodes)
            sched.continue_rids_after(state.next_rid)
            _note_cache("caught_up", behind, reread)
            return sched
    _note_cache("reloaded", behind, 0)
    return load(nodes, state.next_rid)


def _note_cache(how: str, behind: int, reread: int) -> None:
    cache_stats.how, cache_stats.behind, cache_stats.reread = how, behind, reread
    metrics.inc("slotkeeper_scheduler_cache_total", how=how)
    if reread:
        metrics.inc("slotkeeper_scheduler_caught_up_leases_total", reread)


def load(nodes: list[capacity.NodeState], next_rid: int) -> Scheduler:
    """A fresh Scheduler holding every lease that is not over, with every reservation it ever had.

    Not only the live reservations: a lease in the middle of a suspension needs its finished VM reservation to
    know where its memory images are, and loading only live rows lost it (and then every tick failed)."""
    names = {n.id: n.name for n in nodes}
    sched = Scheduler(
        {n.id: node_capacity(n) for n in nodes},
        scheduler_config(),
        label=live_label,
        node_label=lambda node: names.get(node, f"node {node}"),
    )
    for rec in _records(Lease.objects.all(), nodes):
        sched.restore(rec)
    sched.continue_rids_after(next_rid)
    return sched


# A lease in state `new` is an intent: stored, waiting for a planning pass (group commit). No scheduler holds it.
NOT_PLANNED = [*(s.value for s in TERMINAL_LEASE_STATES), LeaseState.NEW.value]


def _records(leases, nodes: list[capacity.NodeState]) -> list[LeaseRecord]:
    """The scheduler's records of the planned, unfinished leases among `leases`, in the order to restore them."""
    live = list(leases.exclude(state__in=NOT_PLANNED).order_by("submitted_at", "id"))
    by_lease: dict[int, list[Reservation]] = {}
    for r in Reservation.objects.filter(lease__in=[lease.pk for lease in live]).order_by("start", "rid"):
        by_lease.setdefault(r.lease_id, []).append(r)
    groups = reads.groups_by_lease([lease.pk for lease in live])
    records = [
        record_of(lease, by_lease.get(lease.pk, []), groups.get(lease.pk, ()), nodes) for lease in live
    ]
    # Leases with work under way first: what runs is in the table before any plan for later, so that when a node's
    # capacity has shrunk it is the unstarted plans that no longer fit, and are planned again, never running work.
    records.sort(key=lambda rec: not any(r.status == "active" for r in rec.reservations))
    return records


def catch_up(sched: Scheduler, lease_ids: set[int], nodes: list[capacity.NodeState]) -> int:
    """Brings a cached scheduler up to the database by re-reading only the leases that the versions it missed
    touched (PlanVersion rows), and every lease sharing a group with one of them (a group's spread rules read where
    its members run). Returns how many leases it re-read.

    Every touched lease is forgotten first and then restored as the database holds it, so the table passes only
    through states that are subsets of a committed, non-overcommitted plan."""
    ids = set(lease_ids)
    if ids:
        links = Lease.groups.through.objects
        group_ids = set(links.filter(lease_id__in=ids).values_list("group_id", flat=True))
        if group_ids:
            ids |= set(links.filter(group_id__in=group_ids).values_list("lease_id", flat=True))
    for lease_id in ids:
        sched.forget(lease_id)
    records = _records(Lease.objects.filter(pk__in=ids), nodes) if ids else []
    for rec in records:
        sched.restore(rec)
    return len(records)


def _forget(sched: Scheduler) -> None:
    if _cache.value is not None and _cache.value.scheduler is sched:
        _cache.value = None


def drop_cache() -> None:
    _cache.value = None
