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
from leases.slottable import Reservation, SlotTable


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
        """Add the youngest candidates until the AR fits, then drop every one it still fits without.

        On one scratch table, changed a lease at a time (its reservations taken out, or put back to try the AR
        without it), never copied per try: the search was a copy and k removals per candidate, O(k^2), and with
        every node stale a full fleet's thousands of candidates held the plan lock for minutes. A candidate with
        nothing on a node the AR may use cannot change the mapper's answer (it ranks and packs only those nodes,
        each by its own line), so no mapping is tried for it: it is never the one that makes the AR fit, and it
        is always dropped again. The victims are the ones the copy-per-try search chose."""
        scratch = self.table.copy()
        usable = self._usable_for(req)
        chosen: list[int] = []
        freed: dict[int, list[Reservation]] = {}
        for lid in self._candidates(req, start, end):
            chosen.append(lid)
            freed[lid] = self._take_out(scratch, lid, start)
            if (
                self._touches(freed[lid], usable)
                and self._map(scratch, req, start, end, True, None) is not None
            ):
                break
        else:
            return []
        for lid in reversed(list(chosen)):
            if not self._touches(freed[lid], usable):
                chosen.remove(lid)
                continue
            for r in freed[lid]:
                scratch.add(r)
            if self._map(scratch, req, start, end, True, None) is not None:
                chosen.remove(lid)
            else:
                for r in freed[lid]:
                    scratch.remove(r.rid)
        return chosen

    def _usable_for(self, req: LeaseRequest) -> frozenset[int] | None:
        """The nodes the mapper may place `req` on, or None for every node of the table."""
        if not self._excluded and not req.barred:
            return None
        ruled_out = self._ruled_out(req)
        return frozenset(n for n in self.table.nodes if n not in ruled_out)

    @staticmethod
    def _touches(freed: list[Reservation], usable: frozenset[int] | None) -> bool:
        return any(usable is None or not usable.isdisjoint(r.alloc) for r in freed)

    def _take_out(self, scratch: SlotTable, lease_id: int, after: float) -> list[Reservation]:
        return [scratch.remove(r.rid) for r in self.leases[lease_id].chain() if r.end > after]

    def _without(self, lease_ids: Iterable[int], after: float) -> SlotTable:
        scratch = self.table.copy()
        for lid in lease_ids:
            self._take_out(scratch, lid, after)
        return scratch

    def _preempt(self, rec: LeaseRecord, at: float, now: float) -> None:
        """Suspend the lease so that it is off its nodes by `at`, or cancel and requeue it (§4.4)."""
        vm = rec.current_vm()
        if vm is None or vm.start >= at or not self._can_suspend(rec, vm, at, now):
            self._requeue(rec, now)
            return
        rec.why = self._cause  # said when the suspension starts: by whom, and why
        self._drop_holds(rec, now)  # suspended, its VM no longer takes a moved vnode back
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
