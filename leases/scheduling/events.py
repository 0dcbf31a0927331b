"""Event processing (SEMANTICS §3.1): reservation starts and ends and early ends, in time order, and the lease state
each one moves the lease to.

PURE: no Django.
"""

from __future__ import annotations

import heapq

from leases.lifecycle import LeaseState
from leases.scheduling.preemption import Preemption
from leases.scheduling.records import (
    ACTIVE,
    MIGRATE,
    RESUME,
    SCHEDULED,
    SHUTDOWN,
    SUSPEND,
    VM,
    LeaseRecord,
    ReservationRecord,
)

_S = LeaseState


class EventLoop(Preemption):
    def next_event_time(self) -> float | None:
        while self._events and not self._event_valid(self._events[0]):
            heapq.heappop(self._events)
        return self._events[0][0] if self._events else None

    def _push_early_end(self, rec: LeaseRecord, vm: ReservationRecord) -> None:
        at = self._early_end(rec, vm)
        if at is not None:
            self._tick += 1
            heapq.heappush(self._events, (at, 0, self._tick, vm.rid))

    def _early_end(self, rec: LeaseRecord, vm: ReservationRecord) -> float | None:
        """When the VM stops because the lease's real run time is used up (simulation), if before its plan ends."""
        real = rec.request.real_duration
        if real is None or vm.status != ACTIVE:
            return None
        # Never before the VM's own start: a lease whose real run time was used up by an earlier VM (it was
        # suspended, or a reload missed its early end) ends as this one starts. Before, such an end came before the
        # start, and the reservation written with it broke the database's check in every tick from then on.
        at = max(vm.start, vm.start + (real - rec.run_time))
        suspends = any(r.kind == SUSPEND for r in rec.chain())
        return at if at < vm.end or (at == vm.end and suspends) else None

    def _event_valid(self, event: tuple[float, int, int, int]) -> bool:
        t, phase, _, rid = event
        r = self._records.get(rid)
        if r is None:
            return False
        if phase == 0:
            return r.kind == VM and self._early_end(self.leases[r.lease_id], r) == t
        if phase == 1:
            return r.status == ACTIVE and r.end == t
        return r.status == SCHEDULED and r.start == t

    def _run_events(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            event = heapq.heappop(self._events)
            if not self._event_valid(event):
                continue
            t, phase, _, rid = event
            r = self._records[rid]
            rec = self.leases[r.lease_id]
            try:
                if phase == 0:
                    self._end_early(rec, r, t)
                elif phase == 1:
                    self._on_end(rec, r, t)
                else:
                    self._on_start(rec, r, t)
            except Exception as exc:
                self._contain(rec, t, exc)

    def _on_start(self, rec: LeaseRecord, r: ReservationRecord, t: float) -> None:
        r.status = ACTIVE
        self._journal(t, r, "reservation_changed")
        if r.kind == VM:
            self._set_state(rec, _S.ACTIVE, t)
            if rec.first_start is None:
                rec.first_start = t
            self._future.discard(rec.request.id)
            rec.in_future = False
            self._push_early_end(rec, r)
        elif r.kind == MIGRATE:
            self._set_state(rec, _S.MIGRATING, t)
        elif r.kind == RESUME and rec.state == _S.SUSPENDED_SCHEDULED:
            self._set_state(rec, _S.RESUMING, t)
        elif r.kind == SUSPEND and rec.state == _S.ACTIVE:
            why, rec.why = rec.why, ""
            self._set_state(rec, _S.SUSPENDING, t, why)

    def _on_end(self, rec: LeaseRecord, r: ReservationRecord, t: float) -> None:
        self._retire(r, t, t)
        left = [x for x in rec.chain() if x.kind == r.kind]
        if r.kind == VM:
            rec.run_time += r.end - r.start
            self._drop_holds(rec, t)  # the VM a held vnode would have joined is over
            if not rec.chain():
                self._finish(rec, t)
        elif r.kind == SHUTDOWN:
            self._finish(rec, t)
        elif r.kind == MIGRATE:
            rec.images.update(r.nodes)
            self._set_state(rec, _S.SUSPENDED_SCHEDULED, t)
        elif r.kind == RESUME and not left:
            self._set_state(rec, _S.RESUMED_READY, t)
        elif r.kind == SUSPEND and not left:
            rec.images = self._suspended_images(rec, r)
            self._set_state(rec, _S.SUSPENDED_PENDING, t)
            self._set_state(rec, _S.SUSPENDED_QUEUED, t)
            self._enqueue(rec)

    def _suspended_images(self, rec: LeaseRecord, r: ReservationRecord) -> dict[int, int]:
        """Where the memory images of a lease just suspended are: on the nodes of its last VM. A lease loaded from
        the database without that VM still has its suspensions, whose vnodes -> nodes are the same mapping."""
        vm = next((x for x in reversed(rec.reservations) if x.kind == VM), None)
        if vm is not None:
            return dict(vm.nodes)
        images: dict[int, int] = {}
        for x in rec.reservations:
            if x.kind == SUSPEND and x.end == r.end:
                images.update(x.nodes)
        return images

    def _finish(self, rec: LeaseRecord, t: float) -> None:
        self._drop_holds(rec, t)
        self._set_state(rec, _S.DONE, t)
        rec.end = t

    def _end_early(self, rec: LeaseRecord, vm: ReservationRecord, t: float) -> None:
        """The lease's real run time is used up: stop the VM, drop the rest of its plan, re-evaluate (§3.7)."""
        for r in rec.chain():
            if r.rid != vm.rid:
                self._cancel_record(r, t)
        rec.run_time += t - vm.start
        self._retire(vm, t, t)
        self._finish(rec, t)
        with self._because(f"lease {rec.request.id} ended early at {self.label(t)}, freeing its room"):
            self._reevaluate(max(t, self._now))
