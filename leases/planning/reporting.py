"""What a pass says about what it decided. Placement reports: every node's verdict on a lease over the window it
got or asked for, stored compactly (fleet/reports.py), for every request decided and every lease the pass placed
that its caller did not report on; the preview and the moves build theirs with `report_row`. And the leases the
pass isolated, left stranded on a draining or dead node, or displaced when a node shrank: a message on the lease,
an audit row, an alert where an operator must act."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from fleet import capacity, reports
from fleet.models import PlacementReport
from leases import vnodes
from leases.alerts import raise_alert
from leases.lifecycle import LeaseState
from leases.models import Lease
from leases.planning.plan import Planning
from leases.scheduler import Change, LeaseRequest, Scheduler
from leases.slottable import Res
from slotkeeper import audit, metrics
from slotkeeper.bulk import Row, insert_many, update_many

log = logging.getLogger(__name__)


def placement_report(
    plan: Planning,
    lease_id: int,
    *,
    message: str,
    requested_by: str = "",
    subject: str = "",
    shared: dict | None = None,
    code: str = "",
) -> Row:
    """An unsaved report of the scheduler's decision about a lease, every node's verdict in it (docs/capacity.md):
    over the VM reservation it got, or over the window it asked for (an AR's, or from now) when it got none. A
    bulk.Row of PlacementReport (`insert_many(rows, model=PlacementReport)`): a pass writes one for every lease
    it decides, only to be inserted (bench/bench_bulk.py: 1.5-1.7 µs a report less, built and inserted).

    `shared`: verdicts kept by `Scheduler.shared_key` while the plan does not change (see `report_fields`)."""
    sched = plan.scheduler
    rec = sched.leases[lease_id]
    req = rec.request
    vm = rec.current_vm()
    chosen: dict[int, Res] = {}
    if vm is not None:
        start, end = vm.start, vm.end
        chosen = sched.alloc_of(rec, vm)
        outcome = "placed"
    else:
        start = req.start if req.start is not None else plan.t
        end = start + req.duration
        outcome = "queued" if rec.state in (LeaseState.QUEUED, LeaseState.SUSPENDED_QUEUED) else "rejected"
    return Row(
        **report_fields(
            plan, req, start, end, outcome=outcome, message=message, chosen=chosen,
            requested_by=requested_by, subject=subject or f"lease:{lease_id}", shared=shared, code=code,
        )
    )  # fmt: skip


def report_row(plan: Planning, req: LeaseRequest, start: float, end: float, **fields: Any) -> PlacementReport:
    """`report_fields` as an unsaved PlacementReport (the preview and the moves save and read theirs)."""
    return PlacementReport(**report_fields(plan, req, start, end, **fields))


def report_fields(
    plan: Planning,
    req: LeaseRequest,
    start: float,
    end: float,
    *,
    outcome: str,
    message: str,
    subject: str,
    requested_by: str = "",
    chosen: Mapping[int, Res] | None = None,
    proposed: Sequence[int] = (),
    shared: dict | None = None,
    code: str = "",
) -> dict[str, Any]:
    """The fields of a report of `req` over [start, end): what it holds (`chosen`, added back) or would take
    (`proposed`), and every node's verdict, stored compactly (fleet/reports.py).

    `shared`, a dict the caller keeps while the plan, its exclusions and its `now` stay as they are: the stored
    verdicts of a request that holds and proposes nothing, kept under `Scheduler.shared_key` and handed to every
    later request with the same key (the same object: stored, never changed). A pass's reports of the requests
    it queued or rejected are written after its last decision, and a burst's queue shares a few shapes and
    windows by the hundred."""
    names = plan.names
    picked = list(chosen or {}) or list(proposed)
    key = None
    if shared is not None and not picked:
        key = plan.scheduler.shared_key(req, start, end)
    verdicts = shared.get(key) if shared is not None and key is not None else None
    if verdicts is None:
        verdicts = _verdicts(plan, req, start, end, chosen, proposed)
        if shared is not None and key is not None:
            shared[key] = verdicts
    return {
        "created_at": plan.now,
        "subject": subject,
        "request": {
            "type": req.type,
            "vnodes": [vnodes.as_json(v) for v in req.vnodes],
            "duration_s": req.duration,
        },
        "outcome": outcome,
        "code": code,
        "message": message,
        "chosen": [names.get(n, str(n)) for n in picked],
        "verdicts": verdicts,
        "requested_by": requested_by,
    }


def _verdicts(
    plan: Planning,
    req: LeaseRequest,
    start: float,
    end: float,
    chosen: Mapping[int, Res] | None,
    proposed: Sequence[int],
) -> dict[str, Any]:
    """Every node's verdict on `req` over [start, end), with the summary, in the stored form."""
    sched = plan.scheduler
    explained = sched.explain(
        req, start, end, chosen=chosen, proposed=proposed, excluded=plan.excluded, now=plan.t
    )
    names = plan.names
    size = explained.vm
    summary = reports.summary(
        {"cpu": size.cpu, "mem": size.mem, "disk": size.disk},
        explained.count,
        {names.get(n, str(n)): h for n, h in explained.holders},
        total=explained.total,
        now=start <= plan.t,
        window=f"{sched.label(start)}–{sched.label(end)}",
        largest=_largest(sched, names),
    )
    return reports.encode(explained.columns, start=start, end=end, summary=summary)


def _largest(sched: Scheduler, names: Mapping[int, str]) -> tuple[str, int] | None:
    """The node with the most allocatable memory (the lowest id among equals), from the slot table's columns."""
    arrays = sched.table.arrays()
    if not len(arrays.nodes):
        return None
    i = int(arrays.caps[:, 1].argmax())
    node = int(arrays.nodes[i])
    return names.get(node, f"node {node}"), int(arrays.caps[i, 1])


def _report_placed(plan: Planning, changes: list[Change]) -> None:
    """A report for every lease the pass placed that its caller did not report on (the queue placing a lease
    later, a due reservation placed again), so every placement explains itself."""
    placed = {
        c.lease_id
        for c in changes
        if c.what == "lease_state" and c.state in (LeaseState.READY, LeaseState.SUSPENDED_SCHEDULED)
    }
    rows = []
    messages = []
    replaced = dict(plan.scheduler.replaced)
    why = {c.lease_id: c.reason for c in changes if c.what == "lease_state" and c.reason}
    for lease_id in sorted(placed - plan.reported):
        rec = plan.scheduler.leases.get(lease_id)
        if rec is None or rec.current_vm() is None:
            continue
        message = f"placed by the queue: {plan.scheduler.describe(lease_id)}"
        if lease_id in why:  # the pass that placed it moved it off its plan first, or freed its room: say why
            message += f" ({why[lease_id]})"
        if lease_id in replaced:
            message = f"re-placed when its reservation came due ({replaced[lease_id]}): {plan.scheduler.describe(lease_id)}"
        rows.append(placement_report(plan, lease_id, message=message, requested_by="scheduler"))
        messages.append(Row(pk=lease_id, message=message))
    if rows:
        insert_many(rows, model=PlacementReport)
        # The decision message said "queued at position N"; it now says where the lease runs.
        update_many(messages, ["message"], model=Lease)


def _record_displaced(
    displaced: list[tuple[int, int, str]], nodes: list[capacity.NodeState], now: datetime
) -> None:
    """Says on each lease why its plan changed when a node's allocatable capacity shrank under it."""
    names = {n.id: n.name for n in nodes}
    for lease_id, node_id, outcome in displaced:
        node = names.get(node_id, f"node {node_id}")
        reason = f"its reservation no longer fit {node}, whose allocatable capacity shrank"
        if outcome == "failed":
            continue  # isolated: _record_isolated says so, with an alert
        lease = Lease.objects.filter(pk=lease_id).first()
        if lease is None:
            continue
        lease.message = f"{reason}; {'queued again' if outcome == 'queued again' else 'moved to other nodes'}"
        lease.save(update_fields=["message"])
        audit.record(at=now, actor=None, action="lease.replace", target=lease, reason=reason)
        log.warning("lease displaced", extra={"lease": lease_id, "node": node, "outcome": outcome})


def _record_stranded(stranded: Mapping[int, str], now: datetime) -> None:
    """Says on each advance reservation left booked on a draining or dead node why it could not be moved: on the
    lease (its message, which its page and the node's list of reservations show), in the audit feed, and as an
    alert, since an operator must decide (bring the node back, or cancel or move the reservation)."""
    for lease_id, why in stranded.items():
        lease = Lease.objects.filter(pk=lease_id).first()
        said = f"lease {lease_id} is {why}"[:2000]
        if lease is None or lease.message == said:
            continue  # said already (a scheduler loaded again finds it again)
        lease.message = said
        lease.save(update_fields=["message"])
        audit.record(at=now, actor=None, action="lease.stranded", target=lease, reason=why[:500])
        raise_alert("reservation_stranded", f"lease {lease_id} {lease.name}: {why}"[:2000], now, lease=lease)


def _record_isolated(isolated: list[tuple[int, str]], now: datetime) -> None:
    """Says why each isolated lease failed: on the lease, in the audit feed, as an alert, in the log."""
    if not isolated:
        return
    for lease_id, reason in isolated:
        lease = Lease.objects.filter(pk=lease_id).first()
        if lease is None:
            continue
        lease.message = f"isolated by the scheduler, which could not plan it: {reason}"[:2000]
        lease.save(update_fields=["message"])
        audit.record(at=now, actor=None, action="lease.isolate", target=lease, reason=reason[:500])
        raise_alert(
            "lease_isolated", f"lease {lease_id} {lease.name} was isolated: {reason}"[:2000], now, lease=lease
        )
        metrics.inc("slotkeeper_leases_isolated_total")
        log.error("lease isolated", extra={"lease": lease_id, "reason": reason})
