"""Advance reservations and preemption (SEMANTICS §3.4, §4.4, §10 Q1, Q6): an exact window, and the fewest youngest
preemptible best-effort leases suspended or requeued to make it fit.

PURE: no Django.
"""

from __future__ import annotations

from collections.abc import Iterable

from leases.scheduling.backfill import Backfilling
from leases.scheduling.records import (
    BEST_EFFORT,
    PREEMPTABLE_STATES,
    SHUTDOWN,
    SUSPEND,
    VM,
    LeaseRecord,
    LeaseRequest,
    Plan,
    ReservationRecord,
    Spec,
)
from leases.slottable import SlotTable


class Preemption(Backfilling):
    def _ar_window(self, req: LeaseRequest, now: float) -> tuple[float, float]:
        """An AR's VM window: exactly [start, start + duration) as asked, except that a start which passed between
        the request's arrival and its planning pass becomes now (nothing is scheduled before now; Haizea's AR
        "starting now"). The end stays the one asked for, so a late AR never holds nodes past its window."""
        assert req.start is not None
        return max(req.start, now), req.start + req.duration

    def _plan_exact(self, rec: LeaseRecord, now: float) -> Plan | None:
        req = rec.request
        start, vm_end = self._ar_window(req, now)
        end = vm_end + self.timing.shutdown_time(req)
        found = self._map(self.table, req, start, end, True, None)
        victims: list[int] = []
        if found is None and self.config.preempts:
            victims = self._minimal_victims(req, start, end, now)
            if victims:
                found = self._map(self._without(victims, start), req, start, end, True, None)
        if found is None:
            return None
        mapping = found[0]
        specs = [Spec(VM, start, vm_end, dict(mapping))]
        if end > vm_end:
            specs.append(Spec(SHUTDOWN, vm_end, end, dict(mapping)))
        return Plan(specs, preempt=victims)

    def _candidates(self, req: LeaseRequest, start: float, end: float) -> list[int]:
        """Preemptible best-effort leases in the way, youngest first (Q6)."""
        ids = {r.lease_id for r in self.table.reservations(start=start, end=end)}
        ok = [
            self.leases[i]
            for i in ids
            if i != req.id
            and self.leases[i].request.type == BEST_EFFORT
            and self.leases[i].request.preemptible
            and self.leases[i].state in PREEMPTABLE_STATES
        ]
        ok.sort(key=lambda r: (-r.request.submit, -r.request.id))
        return [r.request.id for r in ok]

    def _minimal_victims(self, req: LeaseRequest, start: float, end: float, now: float) -> list[int]:
        """Add the youngest candidates until the AR fits, then drop every one it still fits without."""
        chosen: list[int] = []
        for lid in self._candidates(req, start, end):
            chosen.append(lid)
            if self._map(self._without(chosen, start), req, start, end, True, None) is not None:
                break
        else:
            return []
        for lid in reversed(list(chosen)):
            rest = [c for c in chosen if c != lid]
            if self._map(self._without(rest, start), req, start, end, True, None) is not None:
                chosen = rest
        return chosen

    def _without(self, lease_ids: Iterable[int], after: float) -> SlotTable:
        scratch = self.table.copy()
        for lid in lease_ids:
            for r in self.leases[lid].chain():
                if r.end > after:
                    scratch.remove(r.rid)
        return scratch

    def _preempt(self, rec: LeaseRecord, at: float, now: float) -> None:
        """Suspend the lease so that it is off its nodes by `at`, or cancel and requeue it (§4.4)."""
        vm = rec.current_vm()
        if vm is None or vm.start >= at or not self._can_suspend(rec, vm, at, now):
            self._requeue(rec, now)
            return
        for r in rec.chain():
            if r.kind in (SHUTDOWN, SUSPEND):
                self._cancel_record(r, now)
        suspensions = self.timing.op_specs(SUSPEND, vm.nodes, rec.request, at, forward=False)
        self._retime(vm, min(s.start for s in suspensions), now)
        for spec in suspensions:
            self._place(rec, spec, now)

    def _can_suspend(self, rec: LeaseRecord, vm: ReservationRecord, at: float, now: float) -> bool:
        req = rec.request
        if self.config.suspension == "none" or (
            self.config.suspension == "serial-only" and len(req.vnodes) > 1
        ):
            return False
        if at - vm.start < self.timing.threshold_for(rec):
            return False
        suspensions = self.timing.op_specs(SUSPEND, vm.nodes, req, at, forward=False)
        return min(s.start for s in suspensions) > max(vm.start, now)
