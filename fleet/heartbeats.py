"""Buffered heartbeats: what a node reported, held in this process until the next flush, and the flush's
set-based write of the latest health of many nodes at once.

Why: one transaction per heartbeat costs a WAL flush and a Django round of statements each
(docs/benchmarks/heartbeats.md, run 1: 1,349/s from raw psycopg one at a time, 9,793/s a hundred to a transaction). A
steady node's heartbeat changes nothing but its health columns, so the HTTP fast path (slotkeeper/heartbeat_route.py)
answers it at once and leaves it here; every HEARTBEAT_FLUSH_S the flusher writes the batch with one UPDATE and one
INSERT (leases/instances/actions/heartbeats.py composes the flush with the instance reports, which fleet does not
know). What must not wait is not buffered: a node whose status changes (offline -> online) or that is unknown to
this process goes the full way at once, and whatever the flush finds changed under it (token rotated, node fenced,
drained, marked offline) is returned as stale for the caller to take the full way then.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction

from fleet import actions, nodestate
from fleet.actions import HealthReport
from fleet.models import HealthSample, Node
from slotkeeper import events, metrics
from slotkeeper.auth import NodeToken, node_tokens

# A node whose instance report changes between flushes keeps each distinct report (an exit then a restart must
# both be seen); beyond this many, only the latest replaces the last, so one noisy agent cannot grow the buffer.
MAX_QUEUED_PER_NODE = 8


@dataclass(frozen=True)
class Pending:
    """One accepted heartbeat waiting for the flush: who sent it (the token as this process knew it), what it
    said, and when it arrived (the time stored, not the flush's)."""

    token: NodeToken
    report: HealthReport
    at: datetime


class HeartbeatBuffer:
    """Node id -> its heartbeats since the last flush: the latest one, or one per distinct instance report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[Pending]] = {}

    def add(self, entry: Pending) -> None:
        with self._lock:
            queued = self._pending.setdefault(entry.token.node_id, [])
            if queued and (
                queued[-1].report.instances == entry.report.instances or len(queued) >= MAX_QUEUED_PER_NODE
            ):
                queued[-1] = entry
            else:
                queued.append(entry)

    def take(self) -> dict[int, list[Pending]]:
        with self._lock:
            taken, self._pending = self._pending, {}
        return taken

    def restore(self, taken: dict[int, list[Pending]]) -> None:
        """Puts back a batch whose flush failed, under what arrived since (newer reports come after it)."""
        with self._lock:
            for node_id, entries in taken.items():
                newer = self._pending.get(node_id, [])
                self._pending[node_id] = (entries + newer)[-MAX_QUEUED_PER_NODE:]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(entries) for entries in self._pending.values())


def flush_health(entries: list[Pending], busy: Collection[int] = ()) -> tuple[int, list[Pending]]:
    """Writes the latest health of nodes (at most one entry a node) whose report changes nothing but the node
    row, as `do_heartbeat_known` would one by one, in one transaction: the node rows guarded by the remembered token and status and not fenced,
    the idle footprint remembered (seed 001) unless the node is `busy` (work placed on it), a history sample
    where one is due. Returns how many were written,
    and the entries the guard refused (stale) for the caller to take the full way; an entry older than what
    another process already wrote for its node is dropped."""
    if not entries:
        return 0, []
    if connection.vendor == "postgresql":
        return _flush_postgresql(entries, set(busy))
    # SQLite runs one process (embedded), so nothing else writes these rows meanwhile: the per-node action, in
    # one transaction, is the same write.
    stale = []
    with transaction.atomic():
        for entry in entries:
            try:
                committed = entry.token.node_id in busy
                actions.do_heartbeat_known(entry.token, entry.report, now=entry.at, committed=committed)
            except actions.Stale:
                stale.append(entry)
    node_tokens.refresh(e.token for e in entries if e not in stale)
    return len(entries) - len(stale), stale


# The statement below names the table; a renamed model must not make it write elsewhere.
assert Node._meta.db_table == "fleet_node"

# One statement for the whole batch. The node rows are locked in id order first (the order every writer of
# several node rows takes), so two processes flushing overlapping batches wait for each other instead of
# deadlocking. `last_heartbeat_at < v.at` keeps an older report, flushed late by another process, from
# overwriting a newer one. The CASEs are nodestate.remembered_baseline and the history's "at most every
# HEALTH_SAMPLE_EVERY_S", said in SQL so the row's own values decide.
_UPDATE = """
WITH locked AS MATERIALIZED (
    SELECT id FROM fleet_node WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE
)
UPDATE fleet_node AS n SET
    last_heartbeat_at = v.at,
    obs_mem_total_mib = v.mem_total,
    obs_mem_used_mib = v.mem_used,
    obs_disk_free_gib = v.disk,
    obs_cpu_pct = v.cpu,
    obs_load1 = v.load1,
    reported_instances = v.instances::jsonb,
    idle_baseline_mib = CASE
        WHEN v.idle AND (n.idle_baseline_mib IS NULL
            OR n.idle_baseline_mib <= v.mem_used - %(step)s
            OR n.idle_baseline_mib >= v.mem_used + %(step)s)
        THEN v.mem_used ELSE n.idle_baseline_mib END,
    last_sample_at = CASE
        WHEN n.last_sample_at IS NULL OR n.last_sample_at <= v.at - make_interval(secs => %(every)s)
        THEN v.at ELSE n.last_sample_at END
FROM unnest(
    %(ids)s::bigint[], %(digests)s::text[], %(statuses)s::text[], %(ats)s::timestamptz[], %(totals)s::int[],
    %(useds)s::int[], %(disks)s::float8[], %(cpus)s::float8[], %(loads)s::float8[], %(instances)s::text[],
    %(idles)s::bool[]
) AS v(id, digest, status, at, mem_total, mem_used, disk, cpu, load1, instances, idle), locked
WHERE n.id = v.id AND locked.id = v.id
    AND n.token_digest = v.digest AND n.status = v.status AND n.fenced_at IS NULL
    AND (n.last_heartbeat_at IS NULL OR n.last_heartbeat_at < v.at)
RETURNING n.id, n.last_sample_at = v.at
"""


def _flush_postgresql(entries: list[Pending], busy: set[int]) -> tuple[int, list[Pending]]:
    by_id = {e.token.node_id: e for e in entries}
    params = {
        "ids": list(by_id),
        "digests": [e.token.digest for e in by_id.values()],
        "statuses": [e.token.status for e in by_id.values()],
        "ats": [e.at for e in by_id.values()],
        "totals": [e.report.mem_total_mib for e in by_id.values()],
        "useds": [e.report.mem_used_mib for e in by_id.values()],
        "disks": [e.report.disk_free_gib for e in by_id.values()],
        "cpus": [e.report.cpu_pct for e in by_id.values()],
        "loads": [e.report.load1 for e in by_id.values()],
        "instances": [json.dumps(list(e.report.instances)) for e in by_id.values()],
        "idles": [node_id not in busy for node_id in by_id],
        "step": nodestate.BASELINE_STEP_MIB,
        "every": float(settings.SLOTKEEPER["HEALTH_SAMPLE_EVERY_S"]),
    }
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_UPDATE, params)
            written = cursor.fetchall()
        samples = [by_id[node_id] for node_id, sampled in written if sampled]
        HealthSample.objects.bulk_create(HealthSample.of(e.token.node_id, e.at, e.report) for e in samples)
        for node_id, _ in written:
            events.send_on_commit("node-changed", node=node_id)
    # The row has just confirmed these tokens (digest, status, not fenced): remembered for another TTL.
    node_tokens.refresh(by_id[node_id].token for node_id, _ in written)
    missed = set(by_id) - {node_id for node_id, _ in written}
    if not missed:
        return len(written), []
    # Rare: tell "changed under it" from "a newer heartbeat is stored already" (two processes, one node).
    rows = Node.objects.filter(pk__in=missed).values_list(
        "id", "token_digest", "status", "fenced_at", "last_heartbeat_at"
    )
    superseded = {
        node_id
        for node_id, digest, status, fenced_at, last in rows
        if digest == by_id[node_id].token.digest
        and status == by_id[node_id].token.status
        and fenced_at is None
        and last is not None
        and last >= by_id[node_id].at
    }
    return len(written), [by_id[node_id] for node_id in sorted(missed - superseded)]


def ages(received: Mapping[int, Sequence[datetime]]) -> list[float]:
    """How old each node's last stored heartbeat was when each of `received` (node id -> arrival times, oldest
    first) arrived: the first against the node row, read before the write that replaces it (one statement for a
    whole flush), each next one against the one before. The database's time, not this process's memory, so a node
    whose heartbeats reach several Daphnes in turn is measured all the same. A node's very first heartbeat has no
    age."""
    rows = Node.objects.filter(pk__in=list(received)).order_by().values_list("id", "last_heartbeat_at")
    stored = dict(rows)
    return ages_since(stored, received)


def ages_since(
    stored: Mapping[int, datetime | None], received: Mapping[int, Sequence[datetime]]
) -> list[float]:
    out = []
    for node_id, arrivals in received.items():
        before = stored.get(node_id)
        for at in arrivals:
            if before is not None and at >= before:
                out.append((at - before).total_seconds())
            before = at if before is None or at > before else before
    return out


def count_ages(seconds: Sequence[float]) -> None:
    """Into slotkeeper_heartbeat_age_seconds, once the heartbeats they measure are written."""
    for age in seconds:
        metrics.observe("slotkeeper_heartbeat_age_seconds", age)
