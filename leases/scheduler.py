"""The lease scheduler: Haizea's semantics (SEMANTICS.md, with §10's decisions) over a slot table.

This module owns the decisions: whether and where an advance reservation (exact window), an immediate lease
(now, whole duration) or a best-effort lease (FCFS queue with backfilling) runs; which best-effort leases an
AR preempts and whether each is suspended or cancelled and requeued; when suspensions, resumptions, migrations
and shutdowns happen; and what each lease's state is as its reservations start and end. It keeps a journal of
every change so that the live service can write a plan back, and it explains every refusal node by node.

PURE: no Django. Time is always passed in (seconds; epoch seconds live, seconds since the trace start in
replay). Nothing is scheduled before the `now` it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from leases.lifecycle import LeaseState, lease_transition
from leases.scheduling.changing import Changing, EndChange
from leases.scheduling.forecast import Estimate, Snapshot, forecast, snapshot
from leases.scheduling.records import (
    ACTIVE,
    ADVANCE_RESERVATION,
    BEST_EFFORT,
    CANCELLED,
    DONE,
    HOLD,
    IMMEDIATE,
    MIGRATE,
    RESUME,
    SCHEDULED,
    SHUTDOWN,
    SUSPEND,
    VM,
    Change,
    Decision,
    LeaseRecord,
    LeaseRequest,
    ReservationRecord,
    SchedulerConfig,
    Spec,
)
from leases.slottable import Overcommit, Res

# The scheduler's whole vocabulary is imported from here; the layers' own modules are its implementation.
__all__ = [
    "ACTIVE",
    "ADVANCE_RESERVATION",
    "BEST_EFFORT",
    "CANCELLED",
    "DONE",
    "IMMEDIATE",
    "MIGRATE",
    "RESUME",
    "SCHEDULED",
    "SHUTDOWN",
    "SUSPEND",
    "VM",
    "Change",
    "Decision",
    "EndChange",
    "Estimate",
    "LeaseRecord",
    "LeaseRequest",
    "ReservationRecord",
    "Scheduler",
    "SchedulerConfig",
    "Snapshot",
    "forecast",
    "snapshot",
]

_S = LeaseState
# Exclusions that do not pass by themselves (an operator ends them): reservations planned there are moved at once.
LASTING_EXCLUSIONS = frozenset({"draining", "dead"})


class Scheduler(Changing):
    """The public face: submit, cancel, advance, restore, decide. The layers below it, each a class of its own
    module: PlanBook (state and changes) <- Mapper <- Backfilling <- Preemption <- EventLoop <- Explaining <-
    Deciding <- Changing <- Scheduler."""

    def submit(
        self, req: LeaseRequest, now: float, excluded: Mapping[int, str] | None = None, *, defer: bool = False
    ) -> Decision:
        """Take a new request at `now`. ARs and IMs are decided at once; a best-effort lease is queued. The queue
        is then processed, unless `defer`: replay and the plan applier's group commit hand in every request of an
        instant first, the ARs and IMs decided as they come, then run the queue once (`run_queue`), as Haizea's
        scheduling pass does (SEMANTICS.md §3.2)."""
        if req.id in self.leases:
            raise ValueError(f"lease {req.id} already exists")
        self.use_exclusions(excluded)
        self._now = max(self._now, now)
        self._run_events(now)
        rec = LeaseRecord(request=req)
        self.leases[req.id] = rec
        self._set_state(rec, _S.PENDING, now)
        code, refusal = self._admission_refusal(req, now)
        if refusal:
            self._set_state(rec, _S.REJECTED, now)
            return Decision(False, req.id, rec.state, refusal, code)
        if req.type == BEST_EFFORT:
            return self._submit_best_effort(rec, now, defer)
        return self._submit_fixed(rec, now, defer)

    def run_queue(self, now: float) -> None:
        """Process the queue once after a batch of `submit(..., defer=True)` calls (the plan applier's group
        commit hands in every waiting request of a pass first, at one `now`)."""
        self._now = max(self._now, now)
        self._process_queue(now)
        self._run_events(now)

    def cancel(self, lease_id: int, now: float) -> Decision:
        """Cancel a lease: the VMs stop now and the rest of its plan is dropped. IllegalTransition if finished."""
        rec = self.leases[lease_id]
        self._now = max(self._now, now)
        self._run_events(now)
        lease_transition(rec.state, _S.CANCELLED, ident=str(lease_id))  # refuse before changing anything
        self._drop_from_queue(lease_id)
        self._future.discard(lease_id)
        rec.in_future = False
        self._stop_chain(rec, now)
        self._set_state(rec, _S.CANCELLED, now)
        rec.end = now
        with self._because(f"lease {lease_id} was cancelled at {self.label(now)}, freeing its room"):
            self._reevaluate(now)
            self._process_queue(now)
        self._run_events(now)
        return Decision(True, lease_id, rec.state, f"lease {lease_id} cancelled at {self.label(now)}")

    def advance(
        self, now: float, excluded: Mapping[int, str] | None = None, *, run_queue: bool = True
    ) -> None:
        """Apply every reservation start/end and early end at or before `now`, in time order, then the queue."""
        self.use_exclusions(excluded)
        if now > self._now:
            # Answers about instants still ahead stay valid (a change drops the touched nodes' entries);
            # nothing is ever asked about an instant before now again.
            # A node nothing touches keeps its memo; past starts are never asked again, so bound its size.
            for node in [n for n, memo in self._fit_memo.items() if len(memo) > 512]:
                del self._fit_memo[node]
            self._room.forget_before(now)
        self._now = max(self._now, now)
        self.replaced = self._recheck_due(now) if self._excluded else []
        if self._excluded:
            self.replaced += self._recheck_future(now)
        self._run_events(now)
        if run_queue:
            self._process_queue(now)
            self._run_events(now)

    def _recheck_due(self, now: float) -> list[tuple[int, str]]:
        """A reservation that comes due is checked again: a best-effort lease whose next reservation would start
        on a node that has become unusable (draining, offline, dead, stale health) is requeued before it starts,
        and the queue re-places it. Returns (lease id, reason) for each, so the caller can record why."""
        replaced = []
        for rec in list(self.leases.values()):
            if rec.request.type != BEST_EFFORT or rec.state in (
                _S.ACTIVE,
                _S.SUSPENDING,
                _S.MIGRATING,
                _S.RESUMING,
            ):
                continue
            due = [r for r in rec.chain() if r.status == SCHEDULED and r.start <= now]
            bad = sorted({n for r in due for n in r.nodes.values() if n in self._excluded})
            if not bad:
                continue
            reason = "; ".join(f"node {n} {self._excluded[n]}" for n in bad)
            try:
                named = "; ".join(f"{self.node_label(n)} is {self._excluded[n]}" for n in bad)
                with self._because(f"re-planned before its reservation came due: {named}"):
                    self._requeue(rec, now)
            except Exception as exc:
                # Left to raise, one such lease failed every tick (and every approval, which advances first)
                # from then on: it is isolated, as the event loop and the queue isolate theirs.
                self._contain(rec, now, exc)
                continue
            replaced.append((rec.request.id, reason))
        return replaced

    def _recheck_future(self, now: float) -> list[tuple[int, str]]:
        """Reservations not started yet on a node that will not come back by itself (draining, dead) are planned
        again at once, not when they come due: a best-effort lease goes back to the queue (which places it
        elsewhere), an advance reservation keeps its window on other nodes where the fleet holds it there. One that
        no other node can hold stays, and is listed once in `stranded` (lease id -> why) for the caller to say so.
        Leases with work under way keep their plan (their later reservations follow their running VM)."""
        gone = {n: why for n, why in self._excluded.items() if why.partition(":")[0] in LASTING_EXCLUSIONS}
        if not gone:
            return []
        lids = sorted(
            {
                row.lease_id
                for n in gone
                for row in self.table.reservations(start=now, node=n)
                if row.start > now
            }
        )
        out = []
        for lid in lids:
            rec = self.leases.get(lid)
            if rec is None or rec.state not in (_S.SCHEDULED, _S.READY, _S.SUSPENDED_SCHEDULED):
                continue
            future = [r for r in rec.chain() if r.status == SCHEDULED and r.start > now]
            bad = sorted({n for r in future for n in r.nodes.values() if n in gone})
            if not bad or len(future) != len(rec.chain()):
                continue
            named = "; ".join(f"{self.node_label(n)} is {gone[n].partition(': ')[0]}" for n in bad)
            why = f"re-planned before its reservation came due: {named}"
            try:
                if rec.request.type == BEST_EFFORT:
                    with self._because(why):
                        self._requeue(rec, now)
                    out.append((lid, "; ".join(f"node {n} {gone[n]}" for n in bad)))
                elif self._move_future(rec, future, now, why):
                    out.append((lid, "; ".join(f"node {n} {gone[n]}" for n in bad)))
                elif lid not in self._stranded_said:
                    self._stranded_said.add(lid)
                    self.stranded[lid] = (
                        f"booked on {named}, and no other node holds its window: it stays there unless the node "
                        f"comes back or an operator acts"
                    )
            except Exception as exc:
                self._contain(rec, now, exc)
        return out

    def _move_future(self, rec: LeaseRecord, future: list[ReservationRecord], now: float, why: str) -> bool:
        """An advance reservation's reservations (none started) onto other nodes for the same window, all or
        nothing; False, with nothing changed, when no set of usable nodes holds it."""
        rows = [self.table.remove(r.rid) for r in future]
        self._touch({n for row in rows for n in row.alloc})
        start, end = min(r.start for r in future), max(r.end for r in future)
        found = self._map(self.table, rec.request, start, end, True, None)
        if found is None:
            for row in rows:
                self.table.add(row)
            self._touch({n for row in rows for n in row.alloc})
            return False
        for r in future:
            r.status = CANCELLED
            self._journal(now, r, "reservation_cancelled")
        for r in future:
            self._place(rec, Spec(r.kind, r.start, r.end, dict(found[0])), now)
        # A step in its history that says it moved and why (the applier writes "moved from ... to ...: why").
        self._changes.append(Change(now, rec.request.id, "lease_state", state=rec.state, reason=why))
        return True

    def take_stranded(self) -> dict[int, str]:
        stranded, self.stranded = self.stranded, {}
        return stranded

    def restore(self, lease: LeaseRecord) -> None:
        """Load an existing lease (the live service, from its database); its live reservations enter the table.

        All or nothing. Work that has started enters whatever the node's capacity now is (it runs; refusing to
        know about it would not stop it). A lease whose reservations have not started and no longer fit (the
        node's capacity shrank since they were planned) is kept aside as displaced and planned again by
        `settle(now)`. Anything else that cannot enter the table (a node that is gone) marks the lease broken,
        and `settle(now)` isolates it once the caller knows the time."""
        lid = lease.request.id
        self.leases[lid] = lease
        chain = [*lease.chain(), *lease.holds()]
        started = any(r.status == ACTIVE and r.kind != HOLD for r in chain)
        added: list[ReservationRecord] = []
        try:
            for r in chain:
                unknown = sorted({*r.nodes.values(), *r.sources.values()} - set(self.table.nodes))
                if unknown:
                    raise KeyError(
                        f"reservation {r.rid} names node(s) {unknown} that the slot table does not hold"
                    )
                self.table.add(self._table_row(lease, r), force=started)
                added.append(r)
        except Exception as exc:
            if self.strict and not isinstance(exc, Overcommit):
                raise
            for r in added:
                self.table.remove(r.rid)
            self._touch({n for r in added for n in (*r.nodes.values(), *r.sources.values())})
            for r in chain:
                self._next_rid = max(self._next_rid, r.rid + 1)
            if isinstance(exc, Overcommit):
                self._displaced.append((lid, exc.node))
            else:
                self._broken.append((lid, f"{type(exc).__name__}: {exc}"))
            return
        for r in added:
            self._next_rid = max(self._next_rid, r.rid + 1)
            self._records[r.rid] = r
            self._push_events(r)
            if r.kind == VM and r.status == ACTIVE:
                # A running VM's early end (its real run time, in simulation) is an event of its own, pushed when it
                # started: a scheduler loaded again without it ran the VM to its planned end.
                self._push_early_end(lease, r)
            # A migration holds its sources as well as its destinations: both nodes' cached figures change.
            self._touch({*r.nodes.values(), *r.sources.values()})
        if lease.state in (_S.QUEUED, _S.SUSPENDED_QUEUED):
            self._enqueue(lease)
        if lease.in_future:
            self._future.add(lid)

    def observe(
        self,
        extra: Mapping[int, Res],
        columns: npt.NDArray[np.int64] | None = None,
        headroom: Mapping[int, float] | None = None,
    ) -> None:
        """The now-gate (docs/capacity.md): per node, what it is observed to use beyond what the plan holds there
        now (host memory above its remembered baseline, disk filled outside the plan). Work starting now must fit
        that as well; later reservations are planned against allocatable alone. `columns`: the same figures as
        cpu, memory and disk columns in the slot table's node order, when the caller has them (explain uses
        them instead of building them again)."""
        # Nonzero figures only, tested field by field: comparing 1,000 Res with Res() (a dataclass __eq__ each)
        # was a tenth of a preview's CPU.
        seen = {n: r for n, r in extra.items() if r.cpu or r.mem or r.disk or r.net_in or r.net_out}
        if (
            seen != self._now_extra
        ):  # kept as it was when nothing changed, so what is derived from it is kept too
            self._now_extra = seen
        self._extra_memo = (self._now_extra, self.table.arrays(), columns) if columns is not None else None
        if headroom is not None and headroom != self._headroom:
            self._headroom = (
                headroom  # kept as it was when nothing changed (the ranking's column by identity)
            )

    def settle(self, now: float) -> None:
        """After restoring: plan again every displaced lease (see `restore`), then isolate every broken one."""
        self._replan_displaced(now)
        self.isolate_broken(now)

    def take_displaced(self) -> list[tuple[int, int, str]]:
        """(lease id, node id, what became of it) for each lease `settle` planned again since the last call."""
        displaced, self.displaced = self.displaced, []
        return displaced

    def _replan_displaced(self, now: float) -> None:
        """A best-effort lease goes back to the queue at its place (the queue re-places it); an advance reservation
        or immediate lease keeps its window on other nodes if the fleet holds it there, and fails otherwise."""
        pending, self._displaced = self._displaced, []
        for lid, node in pending:
            rec = self.leases[lid]
            old = rec.chain()
            for r in [*old, *rec.holds()]:  # none of them entered the table (`restore` is all or nothing)
                r.status = CANCELLED
                self._journal(now, r, "reservation_cancelled")
            if rec.request.type == BEST_EFFORT:
                self._future.discard(lid)
                rec.in_future = False
                suspended = rec.state in (_S.SUSPENDED_SCHEDULED, _S.SUSPENDED_QUEUED)
                if rec.state not in (_S.QUEUED, _S.SUSPENDED_QUEUED):
                    why = (
                        f"queued again: its reservation no longer fits {self.node_label(node)}, which shrank"
                    )
                    self._set_state(rec, _S.SUSPENDED_QUEUED if suspended else _S.QUEUED, now, why)
                self._enqueue(rec)
                self.displaced.append((lid, node, "queued again"))
                continue
            start, end = min(r.start for r in old), max(r.end for r in old)
            found = self._map(self.table, rec.request, max(start, now), end, True, None) if old else None
            if found is None:
                self._isolate(
                    rec, now, f"its reservation no longer fits node {node}, and no other node holds it"
                )
                self.displaced.append((lid, node, "failed"))
                continue
            for r in old:
                self._place(rec, Spec(r.kind, max(r.start, now), r.end, dict(found[0])), now)
            self.displaced.append((lid, node, "moved"))

    def isolate_broken(self, now: float) -> None:
        """Fail every lease `restore` found broken (see there), at `now`."""
        broken, self._broken = self._broken, []
        for lid, reason in broken:
            self._isolate(self.leases[lid], now, reason)

    def _submit_best_effort(self, rec: LeaseRecord, now: float, defer: bool) -> Decision:
        self._set_state(rec, _S.QUEUED, now)
        self._enqueue(rec)
        if not defer:
            self._process_queue(now)
            self._run_events(now)
        return Decision(True, rec.request.id, rec.state, self._placement_message(rec))

    def _submit_fixed(self, rec: LeaseRecord, now: float, defer: bool) -> Decision:
        req = rec.request
        if req.type == ADVANCE_RESERVATION:
            start, vm_end = self._ar_window(req, now)
            end = vm_end + self.timing.shutdown_time(req)
        else:
            start, end = now, now + req.duration + self.timing.shutdown_time(req)
        plan = self.plan_fixed(rec, now)  # the step `decide` takes too: a preview and a submission agree
        if plan is None:
            self._set_state(rec, _S.REJECTED, now)
            outcome = self.unplaced(req)
            return Decision(False, req.id, rec.state, self._rejection(req, start, end, outcome), outcome)
        why = f"preempted by lease {req.id}, an advance reservation from {self.label(start)}"
        with self._because(why):
            for victim in plan.preempt:
                self._preempt(self.leases[victim], start, now)
        self._commit(rec, plan, now)
        if not defer:
            self._process_queue(now)
            self._run_events(now)
        return Decision(True, req.id, rec.state, self._placement_message(rec))

    def describe(self, lease_id: int) -> str:
        """Where the lease stands, in the words of its decision message ("runs … on n2", "queued at position 3")."""
        return self._placement_message(self.leases[lease_id])

    def _placement_message(self, rec: LeaseRecord) -> str:
        vm = rec.current_vm()
        if rec.state in (_S.QUEUED, _S.SUSPENDED_QUEUED):
            return f"lease {rec.request.id} queued at position {self.queue_position(rec.request.id)}"
        if rec.state == _S.DONE and rec.end is not None:
            return f"lease {rec.request.id} ended at {self.label(rec.end)}"
        if vm is None:
            return f"lease {rec.request.id} is {rec.state}"
        nodes = ", ".join(sorted(self.node_label(n) for n in set(vm.nodes.values())))
        return f"lease {rec.request.id} runs {self.label(vm.start)}–{self.label(vm.end)} on {nodes}"
