"""Changing a placed lease's end (issue 48): extend it in place where the room is free, or shorten it, which frees
the room at once for the queue.

An extension keeps the lease on its nodes: each node must hold the lease's share of it from the old end to the new
one (and its shutdown after). It never moves an advance reservation or an immediate lease, and never suspends a
running lease; a best-effort lease that only holds a future plan there (backfilling's, not started) is planned again
after it, as a reschedule's held room does (`make_way`). What cannot move is `blocking`, and `latest_end` is the
latest end that fits as things stand. A dry run answers the same and changes nothing.

PURE: no Django.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from leases.lifecycle import LeaseState
from leases.scheduling.deciding import Deciding
from leases.scheduling.records import BEST_EFFORT, SHUTDOWN, LeaseRecord, ReservationRecord

# The states in which a lease has a plan whose end can move: placed in the future, or running.
CHANGEABLE = frozenset(
    {
        LeaseState.SCHEDULED,
        LeaseState.PREPARING,
        LeaseState.READY,
        LeaseState.ACTIVE,
        LeaseState.RESUMED_READY,
        LeaseState.SUSPENDED_SCHEDULED,
    }
)
# At least this long is left of a lease that is shortened (a shortening to "now" is a cancellation).
MIN_LEFT_S = 1.0


@dataclass(frozen=True)
class EndChange:
    """The answer to a change of a lease's end: `ok`, or why not; what it changes."""

    ok: bool
    lease_id: int
    old_end: float
    new_end: float
    message: str
    # Best-effort leases whose future plans make way (planned again after it).
    replanned: tuple[int, ...] = ()
    # When it does not fit: the leases in the way, and the latest end that fits (None: not even the old one).
    blocking: tuple[int, ...] = ()
    latest_end: float | None = None
    # node -> why it cannot hold the extension ("" where it can).
    verdicts: dict[int, str] = field(default_factory=dict)
    # Why not, as a code: not_changeable (its state), too_early (the end asked is before its start or now), or
    # blocked (no room); "" when it is done.
    code: str = ""


class Changing(Deciding):
    def change_end(self, lease_id: int, new_end: float, now: float, *, dry_run: bool = False) -> EndChange:
        """Move the end of lease `lease_id`'s current plan to `new_end`: later where its nodes hold it, or
        earlier (not before now or its start). With `dry_run`, only answers (the caller brings the scheduler to
        `now` first, as for `decide`)."""
        self._now = max(self._now, now)
        if not dry_run:
            self._run_events(now)
        rec = self.leases.get(lease_id)
        vm = rec.current_vm() if rec is not None else None
        if rec is None or vm is None or rec.state not in CHANGEABLE:
            state = rec.state.value if rec is not None else "not planned"
            return EndChange(
                False, lease_id, math.nan, new_end,
                f"lease {lease_id} is {state}: only a placed or running lease's end can be changed",
                code="not_changeable",
            )  # fmt: skip
        old_end = vm.end
        floor = max(now, vm.start) + MIN_LEFT_S
        if new_end < floor:
            return EndChange(
                False, lease_id, old_end, new_end,
                f"the new end {self.label(new_end)} is before the lease's start or now (the earliest is "
                f"{self.label(floor)}); cancel the lease to end it now",
                code="too_early",
            )  # fmt: skip
        if new_end == old_end:
            return EndChange(
                True, lease_id, old_end, new_end, f"lease {lease_id} already ends at {self.label(old_end)}"
            )
        if new_end < old_end:
            if not dry_run:
                self._move_end(rec, vm, new_end, now)
            return EndChange(
                True, lease_id, old_end, new_end,
                f"ends at {self.label(new_end)} instead of {self.label(old_end)}; its room from then is free",
            )  # fmt: skip
        return self._extend(rec, vm, new_end, now, dry_run)

    def _extend(
        self, rec: LeaseRecord, vm: ReservationRecord, new_end: float, now: float, dry_run: bool
    ) -> EndChange:
        lease_id, old_end = rec.request.id, vm.end
        tail = self._shutdown_of(rec)
        after = tail.end - tail.start if tail is not None else 0.0
        alloc = self.alloc_of(rec, vm)
        # The table without this lease's own shutdown (it moves with the end) and without the future plans of
        # best-effort leases, which make way; what is left in the window cannot move.
        movable = self._future_best_effort(exclude=lease_id)
        scratch = self._without(movable, now) if movable else self.table.copy()
        if tail is not None:
            scratch.remove(tail.rid)
        verdicts: dict[int, str] = {}
        blocking: set[int] = set()
        latest = math.inf
        for node, need in alloc.items():
            fits_until = scratch.fits_until(node, need, old_end)
            latest = min(latest, fits_until - after)
            if scratch.fits(node, need, old_end, new_end + after):
                verdicts[node] = ""
                continue
            in_way = sorted({r.lease_id for r in scratch.blockers(node, need, old_end, new_end + after)})
            blocking.update(in_way)
            ids = ", ".join(str(i) for i in in_way[:5])
            verdicts[node] = (
                f"booked from {self.label(fits_until)} by lease{'s' if len(in_way) > 1 else ''} {ids}"
                if in_way
                else "no longer has room for its share (its capacity shrank)"
            )
        if any(verdicts.values()):
            best = latest if latest > old_end else None
            said = (
                f"latest end that fits: {self.label(best)}"
                if best is not None
                else "it cannot be extended at all"
            )
            return EndChange(
                False, lease_id, old_end, new_end,
                f"not extended to {self.label(new_end)}: "
                + (
                    f"its nodes are booked after {self.label(old_end)} by lease(s) "
                    f"{', '.join(str(i) for i in sorted(blocking)[:10])}; {said}"
                    if blocking
                    else f"a node of it has no room after {self.label(old_end)}; {said}"
                ),
                blocking=tuple(sorted(blocking)), latest_end=best, verdicts=verdicts, code="blocked",
            )  # fmt: skip
        in_way = [
            lid for lid in movable if any(self._holds_on(lid, n, old_end, new_end + after) for n in alloc)
        ]
        if not dry_run:
            self.make_way(in_way, now, f"lease {lease_id} was extended over the room it had planned on")
            self._move_end(rec, vm, new_end, now)
        moved = (
            f"; best-effort lease(s) {', '.join(map(str, in_way))} planned again after it" if in_way else ""
        )
        return EndChange(
            True, lease_id, old_end, new_end,
            f"ends at {self.label(new_end)} instead of {self.label(old_end)}{moved}",
            replanned=tuple(in_way), verdicts=verdicts,
        )  # fmt: skip

    def _move_end(self, rec: LeaseRecord, vm: ReservationRecord, new_end: float, now: float) -> None:
        """The VM's end and its shutdown after it move to `new_end`; the lease's duration follows; the queue runs
        (a shortening's room is free at once)."""
        delta = new_end - vm.end
        tail = self._shutdown_of(rec)
        if tail is not None and delta > 0:
            self._shift_record(tail, tail.start + delta, tail.end + delta, now)
            self._retime(vm, new_end, now)
        else:
            self._retime(vm, new_end, now)
            if tail is not None:
                self._shift_record(tail, tail.start + delta, tail.end + delta, now)
        rec.request = replace(rec.request, duration=rec.request.duration + delta)
        lease_id = rec.request.id
        with self._because(f"lease {lease_id} now ends at {self.label(new_end)}"):
            if delta < 0:
                self._reevaluate(now)  # its room is free from the new end: future plans move into it
            self._process_queue(now)
        self._run_events(now)

    def _shift_record(self, r: ReservationRecord, start: float, end: float, now: float) -> None:
        row = replace(self.table.get(r.rid), start=start, end=end)
        self.table.replace(row)
        self._touch(row.alloc)
        r.start, r.end = start, end
        self._push_events(r)
        self._journal(now, r, "reservation_changed")

    def _shutdown_of(self, rec: LeaseRecord) -> ReservationRecord | None:
        return next((r for r in rec.chain() if r.kind == SHUTDOWN), None)

    def _future_best_effort(self, exclude: int) -> list[int]:
        """Best-effort leases holding only a future plan (backfilling's, none of it started): they make way."""
        return [
            lid
            for lid in sorted(self._future)
            if lid != exclude
            and self.leases[lid].request.type == BEST_EFFORT
            and not any(r.start <= self._now for r in self.leases[lid].chain())
        ]
