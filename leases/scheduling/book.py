"""The scheduler's state and the only code that changes it: the slot table, the lease records, the queue, the journal
of changes, and the caches that a change to a node invalidates.

PURE: no Django.
"""

from __future__ import annotations

import contextlib
import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from leases.lifecycle import LeaseState, lease_transition
from leases.scheduling.records import (
    ACTIVE,
    CANCELLED,
    DONE,
    HOLD,
    MIGRATE,
    RESUME,
    SCHEDULED,
    SUSPEND,
    SUSPENDED_STATES,
    VM,
    Change,
    LeaseRecord,
    LeaseRequest,
    Plan,
    ReservationRecord,
    SchedulerConfig,
    Spec,
    cpu_mem,
    utc_label,
)
from leases.scheduling.timing import Timing
from leases.slottable import Overcommit, Res, Reservation, RoomCounts, SlotTable

_S = LeaseState


class PlanBook:
    """Leases, their reservations in a SlotTable, the best-effort queue and the journal; every change goes through
    here so that the caches stay true. `label` turns a time into the text used in messages."""

    def __init__(
        self,
        capacities: Mapping[int, Res],
        config: SchedulerConfig,
        *,
        label: Callable[[float], str] = utc_label,
        node_label: Callable[[int], str] = str,
        strict: bool = False,
    ) -> None:
        self.table = SlotTable(capacities)
        # A lease whose records make no sense (a reservation on a node the table does not know, a suspension with
        # no VM behind it) used to raise out of every pass, so one bad row stopped all scheduling for good. Now
        # that lease is isolated: failed, its reservations released, listed in `isolated` for the caller to
        # alert on, and everyone else is scheduled as usual. `strict` re-raises instead (tests of the core).
        self.strict = strict
        self.isolated: list[tuple[int, str]] = []
        self._broken: list[tuple[int, str]] = []
        # Leases whose unstarted reservations no longer fit a node that shrank, and what settle() did with them.
        self._displaced: list[tuple[int, int]] = []
        self.displaced: list[tuple[int, int, str]] = []
        self.config = config
        self.label = label
        self.node_label = node_label  # node id -> the name messages use
        self.leases: dict[int, LeaseRecord] = {}
        self._queue: list[tuple[float, int, int]] = []  # (submit, seq, lease id): FCFS by submit time
        self._seq = 0
        # Each queued lease's entry in `_queue`, for its position without a scan (stale once it left: checked).
        self._queue_keys: dict[int, tuple[float, int, int]] = {}
        self._records: dict[int, ReservationRecord] = {}
        self._next_rid = 1
        self._events: list[tuple[float, int, int, int]] = []  # (time, phase, tiebreak, rid)
        self._tick = 0
        self._future: set[int] = set()
        self._changes: list[Change] = []
        self._cause = ""  # the reason journaled with state changes made now (`_because`)
        self.replaced: list[tuple[int, str]] = []  # set by advance(): leases requeued off unusable nodes
        # Advance reservations booked on a draining or dead node that no other node can hold (lease id -> why),
        # each said once (`_stranded_said`) until the caller takes them.
        self.stranded: dict[int, str] = {}
        self._stranded_said: set[int] = set()
        self._excluded: Mapping[int, str] = {}
        # Per node: what it is observed to use beyond what the plan holds there now; work starting now must fit it.
        self._now_extra: Mapping[int, Res] = {}
        self._now = -math.inf
        # Per node: spans (from, until, leases, next change), the most recently read last: the host-score summary
        # holds for every instant in [from, until), up to the node's next change of usage or lease set, until a
        # change touches the node. Several are kept: advance reservations each ask about a start of their own.
        self._views: dict[int, list[tuple[float, float, int, float]]] = {}
        # Per node: (need, start) -> fits_until. A node's answers hold until a change touches that node, so a
        # queue pass keeps them across the other leases' commits (clearing all of it on every change did not).
        self._fit_memo: dict[int, dict[tuple[Res, float], float]] = {}
        self._room = RoomCounts()
        # The last host order the mapper built on the live table: (request, start, duration, nodes).
        self._last_order: tuple[LeaseRequest, float, float, Iterable[int]] | None = None
        self._fleet = tuple(self.table.capacity(n) for n in self.table.nodes)  # fixed for a scheduler's life
        self._capacity = dict(zip(self.table.nodes, self._fleet, strict=True))
        self._packs_memo: dict[tuple[Res, ...], bool] = {}
        # The usable nodes for the exclusions in force: (the exclusions, how many, the table's nodes, the list).
        self._usable_memo: tuple[Mapping[int, str], int, tuple[int, ...], list[int]] | None = None
        # Per lease id: the smallest vnode, and the suspend/resume estimates, asked for at every queue pass.
        self._smallest: dict[int, Res] = {}
        self._orders: dict[int, list[int]] = {}
        self._barred: dict[int, frozenset[int]] = {}
        self.timing = Timing(config)

    @property
    def queue(self) -> Sequence[int]:
        return [lid for _, _, lid in self._queue]

    @property
    def unwritten(self) -> bool:
        """Whether anything waits for the plan applier to write or settle: journal entries, isolations, leases
        `restore` set aside. A scheduler that is only asked (a preview reading the cached one) has none before
        and must have none after; a scheduler a pass committed has none."""
        return bool(self._changes or self.isolated or self.displaced or self._broken or self._displaced)

    def take_changes(self) -> list[Change]:
        changes, self._changes = self._changes, []
        return changes

    def take_isolated(self) -> list[tuple[int, str]]:
        isolated, self.isolated = self.isolated, []
        return isolated

    @property
    def next_rid(self) -> int:
        """The id the next reservation will get."""
        return self._next_rid

    def continue_rids_after(self, floor: int) -> None:
        """Reservation ids are unique for all time, not just among live rows: never hand out one below `floor`."""
        self._next_rid = max(self._next_rid, floor)

    def journal_change(self, now: float, r: ReservationRecord) -> None:
        """Record that a reservation was changed from outside (a vnode moved by a reschedule)."""
        self._journal(now, r, "reservation_changed")

    def move_vnode(self, lease_id: int, vnode: int, old_node: int, new_node: int, now: float) -> bool:
        """Moves one vnode's share of a lease's current reservations from `old_node` to `new_node` (a reschedule).
        All or nothing: if any reservation would overcommit the new node, nothing moves. The caller advances to
        now first, so reservations already over are retired and not compared.

        Done here rather than on the table from outside: the mapper keeps per-node answers (`_fit_memo`, the host
        score views, the room counts) that hold until a change touches the node, and a move written straight into
        the table left them stale, so the next placement in the same pass was mapped onto a node the move had
        just filled (and refused by the verdicts: a bulk approval stalled after its first full node)."""
        rec = self.leases.get(lease_id)
        if rec is None:
            return False
        moved: list[tuple[ReservationRecord, dict[int, int]]] = []
        for r in rec.chain():
            if r.nodes.get(vnode) != old_node:
                continue
            before = dict(r.nodes)
            r.nodes[vnode] = new_node
            try:
                self.table.replace(self._table_row(rec, r))
            except Overcommit:
                r.nodes.clear()
                r.nodes.update(before)
                for done, nodes in moved:
                    done.nodes.clear()
                    done.nodes.update(nodes)
                    self.table.replace(self._table_row(rec, done))
                return False
            moved.append((r, before))
        if moved:
            self._touch((old_node, new_node))
        for r, _ in moved:
            self._journal(now, r, "reservation_changed")
        return bool(moved)

    # -- room held for lost vnodes (reschedule proposals) -----------------------------------------------------

    def hold(
        self, lease_id: int, vnode: int, node: int, start: float, end: float, now: float
    ) -> ReservationRecord | None:
        """Keeps room for one of the lease's VMs on `node` over [start, end) (a reschedule proposal's target; a
        later start when the room frees only then), or None when it does not fit there. Released by `release`,
        or when the lease's VM ends or its plan stops."""
        rec = self.leases.get(lease_id)
        if rec is None or end <= start or start < now or not 1 <= vnode <= len(rec.request.vnodes):
            return None
        use = rec.request.vnodes[vnode - 1]
        if node not in self._capacity or not self.table.fits(node, use, start, end):
            return None
        status = ACTIVE if start <= now else SCHEDULED
        r = ReservationRecord(self._next_rid, lease_id, HOLD, start, end, {vnode: node}, status=status)
        self._next_rid += 1
        row = self._table_row(rec, r)
        self.table.add(row)
        self._touch(row.alloc)
        self._records[r.rid] = r
        rec.reservations.append(r)
        self._push_events(r)
        self._journal(now, r, "reservation_added")
        return r

    def held(self, rid: int) -> ReservationRecord | None:
        """The live hold with this rid, or None."""
        r = self._records.get(rid)
        return r if r is not None and r.kind == HOLD and r.status in (SCHEDULED, ACTIVE) else None

    def release(self, rid: int, now: float) -> bool:
        """Gives back a hold's room (the proposal was approved, rejected, withdrawn or expired). False when it is
        not a live hold any more (released already, or over)."""
        r = self._records.get(rid)
        if r is None or r.kind != HOLD or r.status not in (SCHEDULED, ACTIVE):
            return False
        self._cancel_record(r, now)
        return True

    def _drop_holds(self, rec: LeaseRecord, now: float) -> None:
        for r in rec.holds():
            self._cancel_record(r, now)

    def detach(self, lease_id: int, vnode: int, node: int, now: float) -> bool:
        """Frees the room a lost vnode held on its dead node from now on: the vnode leaves the lease's reservations
        there (none of its work runs on that node any more), so a node re-admitted later does not count it. A
        move approved later attaches it to its new node (`attach`)."""
        rec = self.leases.get(lease_id)
        if rec is None:
            return False
        changed = []
        for r in rec.chain():
            if r.kind == MIGRATE or r.end <= now or r.nodes.get(vnode) != node:
                continue
            del r.nodes[vnode]
            self.table.replace(self._table_row(rec, r))
            changed.append(r)
        if changed:
            self._touch((node,))
        for r in changed:
            self._journal(now, r, "reservation_changed")
        return bool(changed)

    def attach(self, lease_id: int, vnode: int, node: int, now: float) -> bool:
        """Puts a detached vnode back into the lease's reservations that are not over, on `node` (an approved
        move). All or nothing: if any would overcommit the node, nothing changes."""
        rec = self.leases.get(lease_id)
        if rec is None:
            return False
        done: list[ReservationRecord] = []
        for r in rec.chain():
            if r.kind == MIGRATE or r.end <= now or vnode in r.nodes:
                continue
            r.nodes[vnode] = node
            try:
                self.table.replace(self._table_row(rec, r))
            except Overcommit:
                del r.nodes[vnode]
                for back in done:
                    del back.nodes[vnode]
                    self.table.replace(self._table_row(rec, back))
                return False
            done.append(r)
        if done:
            self._touch((node,))
        for r in done:
            self._journal(now, r, "reservation_changed")
        return bool(done)

    def detached(self, lease_id: int) -> set[int]:
        """The vnodes the lease's current VM runs on no node (lost, detached, not moved yet)."""
        rec = self.leases.get(lease_id)
        vm = rec.current_vm() if rec is not None else None
        if rec is None or vm is None:
            return set()
        return set(range(1, len(rec.request.vnodes) + 1)) - set(vm.nodes)

    def use_exclusions(self, excluded: Mapping[int, str] | None) -> None:
        """The nodes nothing may be placed on from now (node id -> "code: sentence"), until the next call: every
        planning entry point (a submission, `advance`, a cancel's queue run) plans with the exclusions last
        handed in, so whoever runs a pass hands in its own first (leases/planning/prepare.py, `_prepare`)."""
        # The room counts are sums over the usable nodes: a different set of exclusions makes them wrong.
        if (excluded or {}) != self._excluded:
            self._room.clear()
        self._excluded = excluded or {}

    def _enqueue(self, rec: LeaseRecord) -> None:
        self._seq += 1
        key = self._queue_keys[rec.request.id] = (rec.request.submit, self._seq, rec.request.id)
        insort(self._queue, key)

    def queue_position(self, lease_id: int) -> int:
        """The 1-based place of a queued lease in the queue: a bisection on its entry, not a scan of the queue
        (a burst's decision messages ask it of thousands of queued leases)."""
        key = self._queue_keys.get(lease_id)
        if key is not None:
            i = bisect_left(self._queue, key)
            if i < len(self._queue) and self._queue[i] == key:
                return i + 1
        return self.queue.index(lease_id) + 1

    def forget(self, lease_id: int) -> None:
        """Drops a lease and its reservations as if it had never been restored, so that `restore` can take it
        again as another process left it (the live service catching a cached scheduler up). Its stale events are
        skipped by `_event_valid`, which finds no record for their reservations."""
        rec = self.leases.pop(lease_id, None)
        if rec is None:
            return
        for r in rec.reservations:
            self._records.pop(r.rid, None)
            try:
                row = self.table.remove(r.rid)
            except KeyError:
                continue  # over or cancelled: no longer in the table
            self._touch(row.alloc)
        self._drop_from_queue(lease_id)
        self._future.discard(lease_id)
        for memo in (self._smallest, self._orders, self._barred):
            memo.pop(lease_id, None)

    def take_over(self, other: PlanBook) -> None:
        """Become `other`, which is used up: its leases, table, queue, events, journal and memos replace this
        book's own, and this object stays the one its holders know.

        The plan applier's way back from a submit that raised part-way (leases/planning/intents.py,
        `_plan_intents`). What such a submit changed is spread over other leases' records (a preemption retimes a
        VM and adds suspensions), the table, the queue, the event heap, the journal and a dozen memos; there is no
        undo log of all that, and a half-right undo would leave a cached scheduler that no longer matches the
        database. A scheduler built again from the records the pass started from is right by construction."""
        if type(other) is not type(self):
            raise TypeError(f"cannot take over a {type(other).__name__} as a {type(self).__name__}")
        state = vars(self)
        state.clear()
        state.update(vars(other))
        vars(other).clear()  # two live views of one state would drift apart: `other` is unusable from here

    def _drop_from_queue(self, lease_id: int) -> None:
        self._queue = [q for q in self._queue if q[2] != lease_id]
        self._queue_keys.pop(lease_id, None)

    def _isolate(self, rec: LeaseRecord, now: float, reason: str) -> None:
        """Take a lease the scheduler cannot handle out of the plan: its reservations leave the table, it leaves
        the queue, and it fails (whatever its state: this is a quarantine, not a lifecycle step)."""
        lid = rec.request.id
        for r in rec.reservations:
            if r.status not in (SCHEDULED, ACTIVE):
                continue
            if r.rid in self._records:
                with contextlib.suppress(KeyError):  # half-restored or already gone: nothing to release
                    self._touch(self.table.remove(r.rid).alloc)
            self._records.pop(r.rid, None)
            r.status = CANCELLED
            self._journal(now, r, "reservation_cancelled")
        self._drop_from_queue(lid)
        self._future.discard(lid)
        rec.in_future = False
        before = rec.state
        rec.state = _S.FAILED
        rec.end = now
        rec.history.append((now, str(before), str(_S.FAILED)))
        self._changes.append(Change(now, lid, "lease_state", state=_S.FAILED))
        self.isolated.append((lid, reason))

    def _contain(self, rec: LeaseRecord, now: float, exc: Exception) -> None:
        if self.strict:
            raise exc
        self._isolate(rec, now, f"{type(exc).__name__}: {exc}")

    def _commit(self, rec: LeaseRecord, plan: Plan, now: float) -> None:
        for spec in plan.specs:
            self._place(rec, spec, now)
        if rec.state in SUSPENDED_STATES:
            self._set_state(rec, _S.SUSPENDED_SCHEDULED, now)
        else:
            self._set_state(rec, _S.SCHEDULED, now)
            self._set_state(rec, _S.READY, now)
        if plan.in_future:
            self._future.add(rec.request.id)
            rec.in_future = True

    def _alloc(self, rec: LeaseRecord, spec: Spec) -> dict[int, Res]:
        if spec.kind == MIGRATE:
            return self._migration_alloc(spec)
        alloc: dict[int, Res] = {}
        for v, n in spec.nodes.items():
            use = rec.request.vnodes[v - 1]
            # A suspension or resumption holds the memory of the VMs it moves and the CPU that moves it (Q13).
            if spec.kind in (SUSPEND, RESUME):
                use = cpu_mem(use)
            # One VM per node is the common case: no sum to build (a 48-VM lease placed or retimed built 96 Res).
            alloc[n] = alloc[n] + use if n in alloc else use
        return alloc

    def alloc_of(self, rec: LeaseRecord, r: ReservationRecord) -> dict[int, Res]:
        """What a reservation holds on each node (node id -> resources), for checks and displays."""
        return self._alloc(rec, Spec(r.kind, r.start, r.end, r.nodes, r.sources))

    def _table_row(self, rec: LeaseRecord, r: ReservationRecord) -> Reservation:
        return Reservation(r.rid, r.lease_id, r.kind, r.start, r.end, self.alloc_of(rec, r))

    def _place(self, rec: LeaseRecord, spec: Spec, now: float) -> ReservationRecord:
        r = ReservationRecord(self._next_rid, rec.request.id, spec.kind, spec.start, spec.end, spec.nodes)
        r.sources = dict(spec.sources)
        self._next_rid += 1
        row = self._table_row(rec, r)
        self.table.add(row)
        self._touch(row.alloc)
        self._records[r.rid] = r
        rec.reservations.append(r)
        self._push_events(r)
        self._journal(now, r, "reservation_added")
        return r

    def _retime(self, r: ReservationRecord, end: float, now: float) -> None:
        """Move a reservation's end (a VM cut short to make room for its suspension)."""
        row = replace(self.table.get(r.rid), end=end)
        self.table.replace(row)
        self._touch(row.alloc)
        r.end = end
        self._push_events(r)
        self._journal(now, r, "reservation_changed")

    def _retire(self, r: ReservationRecord, end: float, now: float) -> None:
        """A reservation is over at `end` (<= now). Its row leaves the table: nothing is ever planned before
        now, and without this the 30-day replay's table grew to every reservation ever made."""
        self._touch(self.table.remove(r.rid).alloc)
        r.end, r.status = end, DONE
        self._journal(now, r, "reservation_changed")

    def _cancel_record(self, r: ReservationRecord, now: float) -> None:
        self._touch(self.table.remove(r.rid).alloc)
        r.status = CANCELLED
        self._journal(now, r, "reservation_cancelled")

    def _stop_chain(self, rec: LeaseRecord, now: float, *, count: bool = True) -> None:
        """Drop what has not started and cut what is running at `now`; a cut VM's time counts if `count`. The
        room held for its lost vnodes goes too: there is no VM left for it to be moved into."""
        self._drop_holds(rec, now)
        for r in rec.chain():
            if r.start >= now:
                self._cancel_record(r, now)
            else:
                if r.kind == VM and count:
                    rec.run_time += min(now, r.end) - r.start
                self._retire(r, min(now, r.end), now)

    def _touch(self, nodes: Iterable[int]) -> None:
        nodes = tuple(nodes)  # walked twice below, and callers may hand in a generator
        for node in nodes:
            self._views.pop(node, None)
            self._fit_memo.pop(node, None)
        self._room.touch(nodes)

    def _journal(self, now: float, r: ReservationRecord, what: str) -> None:
        snapshot = replace(r, nodes=dict(r.nodes), sources=dict(r.sources))
        self._changes.append(Change(now, r.lease_id, what, reservation=snapshot))

    def _set_state(self, rec: LeaseRecord, target: LeaseState, now: float, reason: str = "") -> None:
        before = rec.state
        rec.state = lease_transition(before, target, ident=str(rec.request.id), lease_type=rec.request.type)
        rec.history.append((now, str(before), str(target)))
        why = reason or self._cause
        self._changes.append(Change(now, rec.request.id, "lease_state", state=target, reason=why))

    @contextlib.contextmanager
    def _because(self, cause: str) -> Iterator[None]:
        """Every state change made inside, of any lease, is journaled with `cause` (unless it names its own): a
        lease preempted, requeued or moved by another's decision says whose and why."""
        before, self._cause = self._cause, cause
        try:
            yield
        finally:
            self._cause = before

    def _push_events(self, r: ReservationRecord) -> None:
        self._tick += 1
        if r.status == SCHEDULED:
            heapq.heappush(self._events, (r.start, 2, self._tick, r.rid))
        heapq.heappush(self._events, (r.end, 1, self._tick, r.rid))

    def _migration_fits(self, spec: Spec) -> bool:
        alloc = self._migration_alloc(spec)
        return all(self.table.fits(n, use, spec.start, spec.end) for n, use in alloc.items())

    def _migration_alloc(self, spec: Spec) -> dict[int, Res]:
        """The migration bandwidth on both ends, capped by what a node declares (a fleet may declare none)."""
        bw = self.config.migration_bandwidth
        alloc: dict[int, Res] = {}
        for v, dst in spec.nodes.items():
            src = spec.sources[v]
            alloc[src] = alloc.get(src, Res()) + Res(net_out=min(bw, self.table.capacity(src).net_out))
            alloc[dst] = alloc.get(dst, Res()) + Res(net_in=min(bw, self.table.capacity(dst).net_in))
        return alloc
