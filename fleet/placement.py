"""Reads the fleet into plain values, asks the placer (fleet/capacity.py), and keeps its verdicts.

This module owns the boundary: ORM rows in, `NodeState` snapshots out, and `PlacementReport` rows back in. Every
decision rule lives in capacity.py, so the live service, the preview API and the benchmarks decide alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.db.models import FloatField, Func, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from fleet import capacity, known_rows, reports
from fleet.models import Node, PlacementReport
from slotkeeper.statements import compiled

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
    """The fleet as NodeStates straight from tuples, without claims and without model objects (see `read_fleet`)."""
    return read_fleet(now).states


@dataclass(frozen=True, slots=True)
class _Facts:
    """What one fleet row says that does not move with the clock, worked out once per distinct row: between two
    reads a heartbeating fleet changes a few dozen of its 1,000 rows, and each of these was a step per node per
    read (docs/benchmarks/preview.md, "The fleet read remembers its rows")."""

    fields: dict[str, Any]  # the NodeState's fields but its age
    seen: float | None  # the last heartbeat, epoch seconds
    shape: tuple  # (id, name, allocatable): the node's part of the fleet's fingerprint
    held: str | None  # its status's exclusion ("code: sentence"), if any
    unreadable: str | None  # its capacity's exclusion when its health is fresh, if any


class FleetRead:
    """The fleet as one read found it: its NodeStates, and what the planner asks of them (the fingerprint of the
    capacity the slot table plans with, the nodes the placer must exclude), each from the rows' remembered facts."""

    __slots__ = ("_facts", "states")

    def __init__(self, states: list[capacity.NodeState], facts: list[_Facts]) -> None:
        self.states = states
        self._facts = facts

    def fingerprint(self) -> tuple:
        """Per node (id, name, allocatable capacity): a change to any makes a scheduler built on the old fleet
        stale. Equal to `fingerprint(states)`."""
        return tuple([f.shape for f in self._facts])

    def excluded(self, health_max_age_s: float) -> dict[int, str]:
        """The nodes capacity.liveness rules out, "code: sentence" each. Equal to `excluded(states, ...)`."""
        out: dict[int, str] = {}
        for state, facts in zip(self.states, self._facts, strict=True):
            if facts.held is not None:
                out[state.id] = facts.held
                continue
            age = state.health_age_s
            if age is None or age > health_max_age_s:
                out[state.id] = _said(capacity.health_unfit(state, health_max_age_s))
            elif facts.unreadable is not None:
                out[state.id] = facts.unreadable
        return out


def fingerprint(states: Sequence[capacity.NodeState]) -> tuple:
    """The fleet's fingerprint from NodeStates alone (FleetRead.fingerprint reads it from remembered rows)."""
    return tuple((n.id, n.name, capacity.node_limits(n)) for n in states)


def excluded(states: Sequence[capacity.NodeState], health_max_age_s: float) -> dict[int, str]:
    """The nodes capacity.liveness rules out, from NodeStates alone (FleetRead.excluded from remembered rows)."""
    out: dict[int, str] = {}
    for state in states:
        unfit = capacity.liveness(state, health_max_age_s)
        if unfit is not None:
            out[state.id] = _said(unfit)
    return out


def _said(unfit: capacity.Unfit | None) -> str | None:
    return None if unfit is None else f"{unfit.code}: {unfit.reason}"


# The rows the last fleet read found, and their facts: replaced by each read, so it holds one fleet's worth and
# a row that changed is forgotten at the next read.
_facts_of: dict[tuple, _Facts] = {}
CAPABILITY_SETS_KEPT = 10_000


def read_fleet(now: datetime) -> FleetRead:
    """The fleet as NodeStates straight from tuples, without claims and without model objects: what the plan
    applier needs on every pass. The last heartbeat comes as epoch seconds and the capabilities as their JSON text: at
    1,000 nodes, converting a datetime and a JSON list per row cost more than the query (docs/benchmarks/preview.md,
    run 3). The statement is compiled once per database and its rows fetched from the cursor as they come: Django's
    row iterator was another 0.6 ms per pass. A row the last read found too is not parsed again: its facts are
    remembered, and only its age is worked out from `now`."""
    global _facts_of
    now_s = now.timestamp()
    known = _facts_of
    kept: dict[tuple, _Facts] = {}
    new = object.__new__
    cls = capacity.NodeState
    states = []
    facts = []
    for row in _fleet_rows():
        got = known.get(row)
        if got is None:
            got = _facts(row)
        kept[row] = got
        seen = got.seen
        node = new(cls)
        d = node.__dict__
        d.update(got.fields)
        d["health_age_s"] = max(now_s - seen, 0.0) if seen is not None else None
        states.append(node)
        facts.append(got)
    _facts_of = kept
    return FleetRead(states, facts)


_capabilities: dict[str | None, frozenset[str]] = {}


def _facts(row: tuple) -> _Facts:
    node_id, name, status, caps, cpu, mem, disk, seen, total, used, disk_free, cpu_pct, baseline = row
    got = _capabilities.get(caps)
    if got is None:
        if len(_capabilities) > CAPABILITY_SETS_KEPT:
            _capabilities.clear()
        got = _capabilities[caps] = frozenset(json.loads(caps) or ()) if caps else frozenset()
    state = capacity.NodeState.read(
        node_id, name, status, got, cpu, mem, disk, None, total, used, disk_free, cpu_pct, baseline
    )
    fields = dict(vars(state))
    del fields["health_age_s"]
    return _Facts(
        fields=fields,
        seen=float(seen) if seen is not None else None,
        shape=(node_id, name, capacity.node_limits(state)),
        held=_said(capacity.status_unfit(state)),
        unreadable=_said(capacity.readability_unfit(state)),
    )


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
    sql = compiled(alias, "fleet.all", _fleet_query)
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
    every = compiled(connection.alias, "fleet.every", lambda: _versioned(_fleet_query()))
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
