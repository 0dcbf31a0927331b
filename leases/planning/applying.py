"""A pass's change journal written to the database in batches: reservations and their per-node allocations, each
touched lease's row (its state, run figures and message in one UPDATE) with one history row per lease and pass and
its event-feed entries, and the instances of the leases it touched (leases/instance_rows.py). A burst costs a
handful of statements, not a handful per change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leases.instance_rows import present_instances, sync_many
from leases.lifecycle import LeaseState
from leases.models import LIVE_RESERVATION_STATUSES, Allocation, Lease, LeaseEvent, Reservation
from leases.planning.records import from_epoch
from leases.scheduler import Change, LeaseRecord, ReservationRecord, Scheduler
from slotkeeper import outbox
from slotkeeper.bulk import Row, insert_many, update_many


def apply(sched: Scheduler, changes: list[Change], messages: Mapping[int, str] | None = None) -> set[int]:
    """Writes a change journal: lease states with their history, reservations and their per-node allocations,
    and `messages` (lease id -> the decided request's message).

    Batched: a burst (a bulk approval, a tick that starts a hundred reservations) costs a handful of statements,
    not a handful per change. The last snapshot of each reservation in the journal is the one written.
    """
    touched = {c.lease_id for c in changes}
    if not changes and not messages:
        return touched
    latest: dict[int, ReservationRecord] = {}
    for change in changes:
        if change.reservation is not None:
            latest[change.reservation.rid] = change.reservation
    if latest:
        _write_reservations(sched, latest)
    _write_leases(sched, changes, touched, messages or {})
    if changes:
        _sync_instances(sched, touched, changes)
    return touched


def _sync_instances(sched: Scheduler, touched: set[int], changes: list[Change]) -> None:
    when = from_epoch(max(c.at for c in changes))
    present = present_instances(touched)
    wanted = []
    for lease_id in sorted(touched):
        rec = sched.leases.get(lease_id)
        if rec is None:
            continue
        vm = rec.current_vm()
        nodes = dict(vm.nodes) if vm is not None and vm.status == "active" else None
        wanted.append((lease_id, rec.state, nodes, present.get(lease_id, [])))
    sync_many(wanted, when)


def _write_leases(
    sched: Scheduler, changes: list[Change], touched: set[int], messages: Mapping[int, str]
) -> None:
    """The lease rows of a pass: each touched lease's state (its steps into the history), what the scheduler
    keeps of its run, and its message, in one UPDATE of each row. (Written field by field, a request's row was
    updated three times a pass: each update a new row version with its index entries.) Every writer of these
    fields holds the plan lock, so rewriting an unchanged state or run figure loses nothing.

    A lease tells one story: the steps a pass took it through are one history row (a re-plan is "moved from 08:36
    on batch-01 to 10:09 on batch-03: lease 12 ended early", not ready -> pending -> scheduled -> ready), each
    saying why; and a lease whose state changed without a decided message gets one that matches its state, so a
    queued lease's page never says it runs. A request's own steps from `new` are kept one by one."""
    steps: dict[int, list[Change]] = {}
    for c in changes:
        if c.what == "lease_state":
            steps.setdefault(c.lease_id, []).append(c)
    current = dict(Lease.objects.filter(pk__in=touched | messages.keys()).values_list("id", "state"))
    said = dict(messages)
    history = []
    feed: list[Row] = []
    for lease_id, taken in steps.items():
        before = current[lease_id]
        rows = _history_rows(sched, lease_id, before, taken, changes)
        history.extend(rows)
        current[lease_id] = str(taken[-1].state)
        if lease_id in said:
            # The decision's message (placed and where, rejected and why...).
            rows[-1].message = said[lease_id]
        elif lease_id in sched.leases:
            why = next((c.reason for c in reversed(taken) if c.reason), "")
            story = sched.describe(lease_id)
            said[lease_id] = f"{story}: {why}" if why and before != LeaseState.NEW else story
        feed.extend(_feed_events(sched, lease_id, before, taken, rows[-1].message or said.get(lease_id, "")))
    insert_many(history, model=LeaseEvent)
    outbox.append_many(feed)
    # One statement per set of fields: with or without a message, with or without the scheduler's figures.
    groups: dict[tuple[str, ...], list[Row]] = {}
    for pk, state in current.items():
        fields: dict[str, Any] = {"state": state}
        rec = sched.leases.get(pk) if pk in touched else None
        if rec is not None:
            fields.update(_synced(rec))
        if pk in said:
            fields["message"] = said[pk][:2000]
        groups.setdefault(tuple(fields), []).append(Row(pk=pk, **fields))
    for names, rows in groups.items():
        update_many(rows, names, model=Lease)


_S = LeaseState
_PLANNED = {_S.SCHEDULED, _S.READY, _S.SUSPENDED_SCHEDULED}
_SUSPENDED = {_S.SUSPENDING, _S.SUSPENDED_PENDING, _S.SUSPENDED_QUEUED, _S.SUSPENDED_SCHEDULED}
_ENDS = {_S.DONE: "lease.ended", _S.CANCELLED: "lease.cancelled", _S.REJECTED: "lease.rejected",
         _S.FAILED: "lease.failed"}  # fmt: skip


def _feed_events(
    sched: Scheduler, lease_id: int, before: str, taken: list[Change], message: str
) -> list[Row]:
    """The event feed's words for one lease's steps in one pass (slotkeeper/outbox.py), written with them."""
    at = from_epoch(taken[-1].at)
    after = LeaseState(str(taken[-1].state))
    was = LeaseState(before)
    types: list[str] = []
    if was == _S.NEW:
        types.append("lease.submitted")
        if after in (_S.QUEUED, _S.SUSPENDED_QUEUED):
            types.append("lease.queued")
        elif after in _PLANNED or after == _S.ACTIVE:
            types.append("lease.placed")
    if after in _ENDS:
        types.append(_ENDS[after])
    elif after == _S.ACTIVE and was != _S.NEW:
        resumed = (
            was in _SUSPENDED
            or was in (_S.RESUMING, _S.RESUMED_READY)
            or any(c.state in (_S.RESUMING, _S.RESUMED_READY) for c in taken)
        )
        types.append("lease.resumed" if resumed else "lease.started")
    elif after == _S.ACTIVE:
        types.append("lease.started")
    elif after in _SUSPENDED and was in (_S.ACTIVE, _S.SUSPENDING) and was != after:
        types.append("lease.suspended")
    elif after in (_S.QUEUED, _S.SUSPENDED_QUEUED) and was != _S.NEW:
        types.append("lease.queued")
    elif after in _PLANNED and was in (_S.QUEUED, _S.SUSPENDED_QUEUED, _S.PENDING, _S.SUSPENDED_PENDING):
        types.append("lease.placed")
    elif after in _PLANNED and was != _S.NEW:
        types.append("lease.replanned")
    if not types:
        return []
    data: dict[str, Any] = {"from": before, "to": str(after), "message": message[:2000]}
    reason = next((c.reason for c in reversed(taken) if c.reason), "")
    if reason:
        data["reason"] = reason[:2000]
    rec = sched.leases.get(lease_id)
    vm = rec.current_vm() if rec is not None else None
    if vm is not None:
        data.update(
            start=from_epoch(vm.start).isoformat(),
            end=from_epoch(vm.end).isoformat(),
            nodes=sorted({sched.node_label(n) for n in vm.nodes.values()}),
        )
    return [outbox.event(t, at, lease=lease_id, data=data) for t in types]


def _history_rows(
    sched: Scheduler, lease_id: int, before: str, taken: list[Change], changes: list[Change]
) -> list[Row]:
    """The history rows of one lease's steps in one pass: a request's steps from `new` one by one, anything else
    folded into one row from where it was to where it ended, with why (and where it moved, for a re-plan)."""
    if before == LeaseState.NEW:
        rows, state = [], before
        for c in taken:
            rows.append(Row(lease_id=lease_id, at=from_epoch(c.at), from_state=state, to_state=str(c.state),
                            message=c.reason[:2000]))  # fmt: skip
            state = str(c.state)
        return rows
    reasons = list(dict.fromkeys(c.reason for c in taken if c.reason))
    moved = _moved(sched, lease_id, changes)
    message = "; ".join([*([moved] if moved else []), *reasons])
    last = taken[-1]
    return [
        Row(lease_id=lease_id, at=from_epoch(last.at), from_state=before, to_state=str(last.state),
            message=message[:2000])
    ]  # fmt: skip


def _moved(sched: Scheduler, lease_id: int, changes: list[Change]) -> str:
    """ "moved from 08:36 on batch-01 to 10:09 on batch-03" when a pass replaced the lease's VM reservation by one
    at another time or on other nodes; "" otherwise."""
    dropped = [c.reservation for c in changes if c.lease_id == lease_id and c.what == "reservation_cancelled"
               and c.reservation is not None and c.reservation.kind == "vm"]  # fmt: skip
    added = [c.reservation for c in changes if c.lease_id == lease_id and c.what == "reservation_added"
             and c.reservation is not None and c.reservation.kind == "vm"]  # fmt: skip
    if not dropped or not added:
        return ""
    old, new = dropped[0], added[-1]

    def where(r: ReservationRecord) -> str:
        nodes = ", ".join(sorted({sched.node_label(n) for n in r.nodes.values()}))
        return f"{sched.label(r.start)} on {nodes}" if nodes else sched.label(r.start)

    if (old.start, sorted(old.nodes.values())) == (new.start, sorted(new.nodes.values())):
        return ""
    return f"moved from {where(old)} to {where(new)}"


def _synced(rec: LeaseRecord) -> dict[str, Any]:
    return {
        "run_time_s": rec.run_time,
        "lost_run_time_s": rec.lost_run_time,
        "first_start": from_epoch(rec.first_start) if rec.first_start is not None else None,
        "ended_at": from_epoch(rec.end) if rec.end is not None else None,
        "in_future": rec.in_future,
        "images": {str(k): v for k, v in rec.images.items()},
    }


def _reservation_fields(r: ReservationRecord) -> dict:
    return {
        "lease_id": r.lease_id,
        "kind": r.kind,
        "start": from_epoch(r.start),
        "end": from_epoch(r.end),
        "status": r.status,
        "nodes": {str(k): v for k, v in r.nodes.items()},
        "sources": {str(k): v for k, v in r.sources.items()},
    }


def _write_reservations(sched: Scheduler, latest: dict[int, ReservationRecord]) -> None:
    existing = {row.rid: row for row in Reservation.objects.filter(rid__in=latest)}
    # Rows, not model instances, for what is only inserted (bulk.Row): a burst's pass creates thousands.
    created = insert_many(
        [Row(rid=rid, **_reservation_fields(r)) for rid, r in latest.items() if rid not in existing],
        model=Reservation,
    )
    changed = []
    for rid, row in existing.items():
        for name, value in _reservation_fields(latest[rid]).items():
            setattr(row, name, value)
        changed.append(row)
    if changed:
        update_many(changed, ["kind", "start", "end", "status", "nodes", "sources"])
    allocations: dict[int, list[Allocation]] = {}
    for a in Allocation.objects.filter(reservation__in=changed):
        allocations.setdefault(a.reservation_id, []).append(a)
    fresh, stale, moved_rows = [], [], []
    for row in created:
        fresh.extend(_allocations(sched, latest[row.rid], row))
    for row in changed:
        rows = allocations.get(row.pk, [])
        live = row.status in LIVE_RESERVATION_STATUSES
        if live and {a.node_id for a in rows} != set(latest[row.rid].nodes.values()):
            # A vnode moved (a reschedule): the per-node rows follow it.
            moved_rows.append(row.pk)
            fresh.extend(_allocations(sched, latest[row.rid], row))
            continue
        for a in rows:
            a.start, a.end, a.live = row.start, row.end, live
            stale.append(a)
    if moved_rows:
        Allocation.objects.filter(reservation_id__in=moved_rows).delete()
    if stale:
        update_many(stale, ["start", "end", "live"])
    if fresh:
        insert_many(fresh, model=Allocation)


def _allocations(sched: Scheduler, r: ReservationRecord, row: Reservation | Row) -> list[Row]:
    """A reservation's per-node rows, as bulk.Rows of Allocation."""
    live = r.status in LIVE_RESERVATION_STATUSES
    return [
        Row(
            reservation_id=row.pk,
            node_id=node_id,
            start=row.start,
            end=row.end,
            live=live,
            cpu=res.cpu,
            mem_mib=res.mem,
            disk_gib=res.disk,
        )
        for node_id, res in sched.alloc_of(sched.leases[r.lease_id], r).items()
    ]
