"""The best-effort queue and backfilling (SEMANTICS §3.2, §3.5, §3.6, §3.7): first come first served, each lease
placed as soon as possible (now, or at the end of someone's plan while future reservations are allowed), resumed
leases migrated where that is allowed, and future reservations pulled earlier when capacity frees up.

PURE: no Django.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from leases.lifecycle import LeaseState
from leases.scheduling.mapper import ONE_CPU, Mapper
from leases.scheduling.records import (
    ACTIVE,
    CANCELLED,
    IMMEDIATE,
    REEVALUATED_STATES,
    RESUME,
    SHUTDOWN,
    SUSPEND,
    SUSPENDED_STATES,
    VM,
    LeaseRecord,
    LeaseRequest,
    Plan,
    ReservationRecord,
    Spec,
)
from leases.slottable import Res

_S = LeaseState


class Backfilling(Mapper):
    def _can_schedule_in_future(self) -> bool:
        return len(self._future) < self.config.max_in_future

    def _process_queue(self, now: float) -> None:
        if self._queue and not self._usable_nodes():
            return  # every node is excluded (all stale, say): no lease can start, now or at any later instant
        waiting: list[tuple[float, int, int]] = []
        stopped = False
        room: dict[Res, list[int]] = {}  # copies of a unit that fit now (bound, count; -1 = not counted yet)
        # The instants capacity comes back (_future_points), read once and again only after a commit: at every
        # queued lease it listed every reservation after `now` (15 ms each with 3,000 leases running).
        ends: list[list[float]] = []

        def future_points() -> list[float]:
            if not ends:
                ends.append(self._future_points(now))
            return ends[0]

        for entry in self._queue:
            if stopped:
                waiting.append(entry)
                continue
            future = self._can_schedule_in_future()
            # With no future reservation left to hand out and every CPU taken, nothing in the queue can start:
            # stopping here keeps a long queue from being re-mapped at every event (Haizea does the same).
            if not future and self._cpu_full(now):
                waiting.append(entry)
                stopped = True
                continue
            rec = self.leases[entry[2]]
            # Without a future reservation to hand out, a lease can only start now, and _could_start's test
            # for now is the same for every lease of one smallest vnode until something is committed: asked
            # once per pass, not once per queued lease (most of the queue fails it at most events).
            if not future and not self._room_now(rec.request, now, room):
                waiting.append(entry)
                stopped = self.config.backfilling == "off"
                continue
            try:
                plan = self._plan_asap(rec, now, allow_future=future, future_points=future_points)
                if plan is None:
                    waiting.append(entry)
                    stopped = self.config.backfilling == "off"
                    continue
                room.clear()
                ends.clear()
                self._commit(rec, plan, now)
                self._queue_keys.pop(entry[2], None)
            except Exception as exc:
                room.clear()
                ends.clear()
                self._contain(rec, now, exc)
        self._queue = waiting

    def _room_now(self, req: LeaseRequest, now: float, room: dict[Res, list[int]]) -> bool:
        """_could_start(req, now, None), from the counts of this pass: the fleet-wide bound, then the room
        counts only if some lease passes the bound. A lease pinned to its nodes (`only`) has at most as much
        room as the whole fleet, so a lease this refuses could not start now either."""
        unit = self._smallest_of(req)
        got = room.get(unit)
        if got is None:
            got = room[unit] = [self.table.total_copies_at(unit, now), -1]
        need = len(req.vnodes)
        if got[0] < need:
            return False
        if got[1] < 0:
            got[1] = self._room.total(now, unit, self._usable_nodes(), self._counter(unit, now))
        return got[1] >= need

    def _cpu_full(self, now: float) -> bool:
        # The free CPU summed over the usable nodes is 0 exactly when every node's CPU is taken.
        if not self._excluded:
            return self.table.total_free_cpu_at(now) <= 0
        return self._room.total(now, ONE_CPU, self._usable_nodes(), self._counter(ONE_CPU, now)) == 0

    def _plan_asap(
        self,
        rec: LeaseRecord,
        now: float,
        allow_future: bool,
        future_points: Callable[[], list[float]] | None = None,
    ) -> Plan | None:
        req = rec.request
        resuming = rec.state in SUSPENDED_STATES
        remaining = req.duration - rec.run_time
        resume_est = (
            self.timing.estimate(req, self.config.resume_rate, self.config.override_resume_time)
            if resuming
            else 0
        )
        duration = remaining + resume_est + self.timing.shutdown_time(req)
        # A non-preemptible lease is never suspended, so it is not started where it would have to be (Q1).
        strict = (
            req.type == IMMEDIATE
            or not req.preemptible
            or self.config.suspension == "none"
            or (self.config.suspension == "serial-only" and len(req.vnodes) > 1)
        )
        only = set(rec.images.values()) if resuming and self.config.migration == "no" else None
        threshold = self.timing.threshold_for(rec)
        plan = self._first_fit(rec, [now], now, duration, threshold, strict, only)
        if plan is None and allow_future:
            points = future_points() if future_points is not None else self._future_points(now)
            plan = self._first_fit(rec, points, now, duration, threshold, strict, only)
            if plan is not None:
                plan.in_future = True
        return plan

    def _could_start(self, req: LeaseRequest, at: float, only: set[int] | None) -> bool:
        """A cheap necessary condition for starting at an instant: enough copies of the smallest vnode fit then.

        Without it a long queue re-runs the full mapper over every node at every event (the 30-day Blue
        Horizon replay spent most of its time there)."""
        smallest = self._smallest_of(req)
        # The fleet's total free capacity bounds how many copies fit on its nodes: most instants fail here.
        if self.table.total_copies_at(smallest, at) < len(req.vnodes):
            return False
        count = self._counter(smallest, at)
        if only is None:
            room = self._room.total(at, smallest, self._usable_nodes(), count)
        elif self._room.knows(at, smallest):
            room = self._room.subtotal(at, smallest, self._usable_nodes(), only, count)
        else:
            # A lease pinned to a few nodes (resuming without migration): counting just those is cheaper than
            # counting the whole fleet for an instant nobody else has asked about.
            usable = [n for n in only if n in self._capacity and n not in self._excluded]
            room = sum(self.table.copies_many(usable, smallest, at).values())
        return room >= len(req.vnodes)

    def _future_points(self, now: float) -> list[float]:
        """The ends of every lease's current plan after `now`, sorted (§2.5, §10 Q16): the only instants at
        which capacity comes back."""
        ends = {self._records[rid].end for rid in self._final_rids(now) if self._records[rid].end > now}
        return sorted(ends)

    def _final_rids(self, now: float) -> list[int]:
        finals: list[int] = []
        for r in self.table.reservations(start=now):
            chain = self.leases[r.lease_id].chain()
            if chain and chain[-1].rid == r.rid:
                finals.append(r.rid)
        return finals

    def _first_fit(
        self,
        rec: LeaseRecord,
        candidates: Iterable[float],
        now: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> Plan | None:
        for start in candidates:
            if not self._could_start(rec.request, start, only):
                continue
            plan = self._plan_at(rec, start, now, duration, threshold, strict, only)
            if plan is not None:
                return plan
        return None

    def _plan_at(
        self,
        rec: LeaseRecord,
        start: float,
        now: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> Plan | None:
        found = self._find(rec, start, duration, threshold, strict, only)
        if found is None:
            return None
        mapping, end = found
        migrations: list[Spec] = []
        if rec.state in SUSPENDED_STATES and self._moves(rec, mapping):
            moved = self._plan_migration(rec, mapping, start, end, now, duration, threshold, strict, only)
            if moved is None:
                return None
            migrations, start, mapping, end = moved
        specs = self._run_specs(rec, mapping, start, end)
        return None if specs is None else Plan(migrations + specs)

    def _find(
        self,
        rec: LeaseRecord,
        start: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> tuple[dict[int, int], float] | None:
        """A mapping for [start, start + duration), or a shorter window of at least `threshold`."""
        if rec.state in SUSPENDED_STATES and self.config.migration == "no":
            # Without migration a suspended lease resumes exactly where its memory images are.
            found = self._check_fixed(self.table, rec.request, rec.images, start, start + duration, strict)
        else:
            found = self._map(self.table, rec.request, start, start + duration, strict, only)
        if found is None:
            return None
        if found[1] < start + duration and found[1] - start < threshold:
            if self.config.whole_window_retry and not strict and rec.state not in SUSPENDED_STATES:
                # The greedy mapper took a node it could hold only briefly; another may hold it whole.
                return self._map(self.table, rec.request, start, start + duration, True, only)
            return None
        return found

    def _plan_migration(
        self,
        rec: LeaseRecord,
        mapping: dict[int, int],
        start: float,
        end: float,
        now: float,
        duration: float,
        threshold: float,
        strict: bool,
        only: set[int] | None,
    ) -> tuple[list[Spec], float, dict[int, int], float] | None:
        """Migrations run from now; the resumption waits for them only if they are not done by `start`, and
        only the vnodes that change node cost time (Q9)."""
        specs = self.timing.migration_specs(rec, mapping, now)
        ready = specs[-1].end if specs else now
        if ready > start:
            found = self._find(rec, ready, duration, threshold, strict, only)
            if found is None:
                return None
            later = self.timing.migration_specs(rec, found[0], now)
            if (later[-1].end if later else now) > ready:
                return None
            specs, start, (mapping, end) = later, ready, found
        if not all(self._migration_fits(s) for s in specs):
            return None
        return specs, start, mapping, end

    def _moves(self, rec: LeaseRecord, mapping: dict[int, int]) -> bool:
        return any(rec.images.get(v, n) != n for v, n in mapping.items())

    def _run_specs(
        self, rec: LeaseRecord, mapping: dict[int, int], start: float, end: float
    ) -> list[Spec] | None:
        """Resumption (if suspended), the VM, then a shutdown or, if the window is short, a suspension."""
        req = rec.request
        specs: list[Spec] = []
        vm_start = start
        if rec.state in SUSPENDED_STATES:
            specs = self.timing.op_specs(RESUME, mapping, req, start, forward=True)
            vm_start = max(s.end for s in specs)
        remaining = req.duration - rec.run_time
        shutdown = self.timing.shutdown_time(req)
        if end - vm_start >= remaining + shutdown:
            specs.append(Spec(VM, vm_start, vm_start + remaining, dict(mapping)))
            if shutdown > 0:
                specs.append(
                    Spec(SHUTDOWN, vm_start + remaining, vm_start + remaining + shutdown, dict(mapping))
                )
            return specs
        if end - vm_start >= remaining:
            return (
                None  # it could run to the end but not shut down: a suspension would cut its shutdown (1.1)
            )
        suspensions = self.timing.op_specs(SUSPEND, mapping, req, end, forward=False)
        suspend_start = min(s.start for s in suspensions)
        if suspend_start <= vm_start:
            return None
        specs.append(Spec(VM, vm_start, suspend_start, dict(mapping)))
        return specs + suspensions

    def _requeue(self, rec: LeaseRecord, now: float) -> None:
        """Cancel the lease's plan and put it back in the queue at its submit-time position.

        A running VM is stopped now and the lease will start again from scratch with its full duration; the
        work it loses is recorded (Q8), so that the run-time invariant still holds at its end."""
        running = rec.state == _S.ACTIVE
        vm = rec.current_vm()
        self._stop_chain(rec, now, count=False)
        if running and vm is not None:
            rec.lost_run_time += rec.run_time + (now - vm.start)
            rec.run_time = 0.0
            rec.images = {}
        self._future.discard(rec.request.id)
        rec.in_future = False
        target = _S.SUSPENDED_QUEUED if rec.state in SUSPENDED_STATES else _S.QUEUED
        self._set_state(rec, target, now)
        self._enqueue(rec)

    def newer_in_future(self, after: float) -> list[int]:
        """The best-effort leases submitted after `after` that hold a future reservation (backfilling's) not
        started yet: what a lease that held capacity before its node died may take back (`make_way`)."""
        out = []
        for lid in sorted(self._future, key=lambda i: (self.leases[i].request.submit, i)):
            rec = self.leases[lid]
            if rec.request.submit <= after or rec.state not in REEVALUATED_STATES:
                continue
            if not any(r.status == ACTIVE for r in rec.chain()):
                out.append(lid)
        return out

    def make_way(self, lease_ids: Iterable[int], now: float, reason: str = "") -> None:
        """Takes back these leases' future reservations (see `newer_in_future`): each goes back to the queue at
        its place, and the next queue run plans it again after what older work took meanwhile."""
        for lid in lease_ids:
            rec = self.leases[lid]
            for r in rec.chain():
                self._cancel_record(r, now)
            self._future.discard(lid)
            rec.in_future = False
            suspended = rec.state == _S.SUSPENDED_SCHEDULED
            self._set_state(rec, _S.SUSPENDED_PENDING if suspended else _S.PENDING, now, reason)
            self._set_state(rec, _S.SUSPENDED_QUEUED if suspended else _S.QUEUED, now, reason)
            self._enqueue(rec)

    def _reevaluate(self, now: float) -> None:
        """Pull future best-effort reservations earlier into capacity that freed up; they can only improve. A lease
        whose plan comes out the same keeps its reservations as they are: nothing is journaled for it (re-planning
        every future lease at every change wrote three history steps and a cancelled reservation each time)."""
        for lid in sorted(self._future, key=lambda i: (self.leases[i].request.submit, i)):
            rec = self.leases[lid]
            if rec.state not in REEVALUATED_STATES:
                continue
            old = rec.chain()
            rows = [self.table.remove(r.rid) for r in old]
            self._touch({n for row in rows for n in row.alloc})
            self._future.discard(lid)
            rec.in_future = False
            suspended = rec.state == _S.SUSPENDED_SCHEDULED
            try:
                plan = self._plan_asap(rec, now, allow_future=self._can_schedule_in_future())
                if plan is not None and _same_plan(plan, old):
                    for row in rows:
                        self.table.add(row)
                    self._touch({n for row in rows for n in row.alloc})
                    if plan.in_future:
                        self._future.add(lid)
                        rec.in_future = True
                    continue
                for r in old:
                    r.status = CANCELLED
                    self._journal(now, r, "reservation_cancelled")
                self._set_state(rec, _S.SUSPENDED_PENDING if suspended else _S.PENDING, now)
                if plan is not None:
                    self._commit(rec, plan, now)
                else:
                    self._set_state(rec, _S.SUSPENDED_QUEUED if suspended else _S.QUEUED, now)
                    self._enqueue(rec)
            except Exception as exc:
                self._contain(rec, now, exc)


def _same_plan(plan: Plan, old: list[ReservationRecord]) -> bool:
    """Whether a plan is the reservations it would replace, kind for kind, window for window, node for node."""
    if len(plan.specs) != len(old):
        return False
    return all(
        (s.kind, s.start, s.end, dict(s.nodes), dict(s.sources))
        == (r.kind, r.start, r.end, r.nodes, r.sources)
        for s, r in zip(plan.specs, old, strict=True)
    )
