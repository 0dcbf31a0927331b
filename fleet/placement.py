"""Reads the fleet into plain values, asks the placer (fleet/capacity.py), and keeps its verdicts.

This module owns the boundary: ORM rows in, `NodeState` snapshots out, and `PlacementReport` rows back in. Every
decision rule lives in capacity.py, so the live service, the preview API and the benchmarks decide alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime

from django.conf import settings
from django.db import connections, router
from django.db.models import FloatField, Func, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from fleet import capacity, known_rows, reports
from fleet.models import Node, PlacementReport

# Commitments per node id: (running claims, pending claims). Fleet does not know what runs on its nodes; the
# caller that does (the instances package) reads them and passes them in as plain values.
Claims = Mapping[int, tuple[Sequence[capacity.Claim], Sequence[capacity.Claim]]]

NODE_FIELDS = (
    "id",
    "name",
    "status",
    "capabilities",
    "cpu_cores",
    "mem_total_mib",
    "disk_total_gib",
    "last_heartbeat_at",
    "obs_mem_total_mib",
    "obs_mem_used_mib",
    "obs_disk_free_gib",
    "obs_cpu_pct",
    "idle_baseline_mib",
)


def snapshot(
    now: datetime, nodes: Sequence[Node] | None = None, *, claims: Claims | None = None
) -> list[capacity.NodeState]:
    """The whole fleet (or the given rows) as plain values, with the commitments the caller read (`claims`; none
    when only liveness matters)."""
    rows = list(nodes) if nodes is not None else list(Node.objects.only(*NODE_FIELDS).order_by("id"))
    given = claims or {}
    return [to_state(n, now, *given.get(n.pk, ((), ()))) for n in rows]


def states_from_rows(now: datetime) -> list[capacity.NodeState]:
    """The fleet as NodeStates straight from tuples, without claims and without model objects: what the plan
    applier needs on every pass. The last heartbeat comes as epoch seconds and the capabilities as their JSON
    text, parsed once per distinct list: at 1,000 nodes, converting a datetime and a JSON list per row cost more
    than the query (docs/BENCHMARKS.md, "Placement preview", run 3). The statement is compiled once per database
    and its rows fetched from the cursor as they come: Django's row iterator was another 0.6 ms per pass."""
    now_s = now.timestamp()
    capabilities: dict[str | None, frozenset[str]] = {}
    read = capacity.NodeState.read
    out = []
    for (
        node_id,
        name,
        status,
        caps,
        cpu,
        mem,
        disk,
        seen,
        total,
        used,
        disk_free,
        cpu_pct,
        baseline,
    ) in _fleet_rows():
        got = capabilities.get(caps)
        if got is None:
            got = capabilities[caps] = frozenset(json.loads(caps) or ()) if caps else frozenset()
        age = max(now_s - float(seen), 0.0) if seen is not None else None
        out.append(
            read(node_id, name, status, got, cpu, mem, disk, age, total, used, disk_free, cpu_pct, baseline)
        )
    return out


def _fleet_query():
    return (
        Node.objects.order_by("id")
        .annotate(seen_s=EpochSeconds("last_heartbeat_at"), caps=Cast("capabilities", TextField()))
        .values_list(
            "id", "name", "status", "caps", "cpu_cores", "mem_total_mib", "disk_total_gib", "seen_s",
            "obs_mem_total_mib", "obs_mem_used_mib", "obs_disk_free_gib", "obs_cpu_pct", "idle_baseline_mib",
        )
    )  # fmt: skip


def _versioned(query):
    """`query` with each row's version (PostgreSQL's xmin, as text) as its last column. The table's name is the
    model's own, no input."""
    xmin = RawSQL(f'"{Node._meta.db_table}"."xmin"::text', ())  # noqa: S611
    return query.annotate(row_xmin=xmin).values_list(*query._fields, "row_xmin")


# The fleet read's statements per database alias: the same ones every pass.
_fleet_sql: dict[tuple[str, str], tuple[str, tuple]] = {}


def _statement(alias: str, name: str, build) -> tuple[str, tuple]:
    got = _fleet_sql.get((alias, name))
    if got is None:
        got = _fleet_sql[(alias, name)] = build().query.sql_with_params()
    return got


def _fleet_rows() -> list[tuple]:
    """The rows of `_fleet_query` as the database gives them. Its one converter (EpochSeconds' float) is applied
    by the caller; every other column needs none. On PostgreSQL, outside a transaction, only the rows changed
    since this process last read them are fetched (fleet/known_rows.py)."""
    alias = router.db_for_read(Node)
    connection = connections[alias]
    # Only in autocommit (a preview's read): a pass reads inside its transaction, where the plain statement is
    # the right one (fleet/known_rows.py says why) and a list of versions first would only cost it a statement.
    if connection.vendor == "postgresql" and connection.get_autocommit() and not connection.in_atomic_block:
        return _changed_rows(connection)
    sql = _statement(alias, "all", _fleet_query)
    with connection.cursor() as cursor:
        cursor.execute(*sql)
        return cursor.fetchall()


def _changed_rows(connection) -> list[tuple]:
    """The fleet's rows through fleet/known_rows.py: only those changed since this process last read them."""
    table = connection.ops.quote_name(Node._meta.db_table)
    versions = (
        f"SELECT id, xmin::text, pg_current_xact_id_if_assigned() IS NOT NULL FROM {table} ORDER BY id",  # noqa: S608
        (),
    )
    every = _statement(connection.alias, "every", lambda: _versioned(_fleet_query()))
    return known_rows.read(
        connection,
        versions,
        every,
        lambda ids: _versioned(_fleet_query().filter(pk__in=ids)).query.sql_with_params(),
    )


class EpochSeconds(Func):
    """A timestamp as seconds since 1970 (a float), computed by the database: no datetime object per row."""

    output_field = FloatField()

    def as_sqlite(self, compiler, connection, **extra):
        # Django stores an aware datetime in SQLite as UTC text, which julianday() reads.
        return self.as_sql(
            compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        )

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(
            compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::double precision"
        )


def to_state(node: Node, now: datetime, running=(), pending=()) -> capacity.NodeState:
    age = (now - node.last_heartbeat_at).total_seconds() if node.last_heartbeat_at else None
    return capacity.NodeState(
        id=node.pk,
        name=node.name,
        status=node.status,
        capabilities=frozenset(node.capabilities or ()),
        cpu_cores=node.cpu_cores,
        mem_total_mib=node.mem_total_mib,
        disk_total_gib=node.disk_total_gib,
        health_age_s=max(age, 0.0) if age is not None else None,
        observed_mem_total_mib=node.obs_mem_total_mib,
        observed_mem_used_mib=node.obs_mem_used_mib,
        disk_free_gib=node.obs_disk_free_gib,
        cpu_pct=node.obs_cpu_pct,
        idle_baseline_mib=node.idle_baseline_mib,
        running=tuple(running),
        pending=tuple(pending),
    )


def place(
    now: datetime,
    need: capacity.Need,
    *,
    checks: Sequence[capacity.Check] = (),
    penalties: Mapping[str, int] | None = None,
    states: Sequence[capacity.NodeState],
) -> capacity.Placement:
    fleet = states
    return capacity.place(
        fleet,
        need,
        health_max_age_s=settings.SLOTKEEPER["HEALTH_MAX_AGE_S"],
        checks=checks,
        penalties=penalties,
    )


def report_row(
    now: datetime,
    subject: str,
    need: capacity.Need,
    placement: capacity.Placement,
    *,
    requested_by: str = "",
    ids_by_name: Mapping[str, int] | None = None,
) -> PlacementReport:
    """An unsaved report, for callers that store many at once."""
    return PlacementReport(
        created_at=now,
        subject=subject,
        request=need_as_json(need),
        outcome=str(placement.outcome),
        message=placement.message,
        chosen=list(placement.nodes),
        preferred_note=placement.preferred_note or "",
        verdicts=compact_verdicts(need, placement, ids_by_name or {}),
        requested_by=requested_by,
    )


def compact_verdicts(need: capacity.Need, placement: capacity.Placement, ids: Mapping[str, int]) -> dict:
    """A placer decision in the stored reports' shape. The placer's own sentence is kept for every node it
    refused: it names figures (observed, committed, effective use) only the placer has."""
    chosen = set(placement.nodes)
    rows = []
    for rank, v in enumerate(placement.verdicts, start=1):
        disk = v.reason_code == capacity.ReasonCode.NO_DISK
        numbers = v.numbers
        free = numbers.get("disk_free_gib", 0) if disk else numbers.get("free_mib", 0)
        limit = numbers.get("limit_disk_gib" if disk else "limit_mem_mib", -1)
        rows.append(
            reports.Verdict(
                node=ids.get(v.node, 0),
                holds=(v.slots or 0) if v.fit else 0,
                code=None if v.reason_code is None else str(v.reason_code),
                dim="disk" if disk else "mem",
                need=need.disk_gib if disk else need.mem_mib,
                free=int(free or 0),
                allocatable=int(limit),
                rank=rank if v.fit or v.slots is not None else None,
                chosen=v.node in chosen,
                note=v.reason or "",
            )
        )
    headroom = [v.headroom for v in placement.verdicts]
    return reports.encode(rows, start=None, end=None, summary=placement.message, headroom=headroom)


def record(
    now: datetime,
    subject: str,
    need: capacity.Need,
    placement: capacity.Placement,
    *,
    requested_by: str = "",
    ids_by_name: Mapping[str, int] | None = None,
) -> PlacementReport:
    row = report_row(now, subject, need, placement, requested_by=requested_by, ids_by_name=ids_by_name)
    row.save()
    return row


def need_as_json(need: capacity.Need) -> dict:
    data = asdict(need)
    data["capabilities"] = sorted(need.capabilities)
    return data
