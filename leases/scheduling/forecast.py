"""The queue forecast (issue 13 item 4): when each queued best-effort lease would run if nothing else changed.

Haizea's aggressive backfilling reserves only the first blocked lease, so the rest of the queue has no start at
all. The forecast answers "when will mine run?" as conservative backfilling would: on a copy of the current plan
(SlotTable.copy() is copy-on-write, so the scheduler's own table is never written), each queued lease in queue
order is reserved at the earliest instant it fits for its whole remaining duration (plus its resumption if it is
suspended, and its shutdown), under the mapper's rules: excluded nodes, barred nodes (capabilities, hard group
rules), at most `spread - taken` of its VMs on a node, `avoid` nodes tried last, a suspended lease without
migration on the nodes that hold its memory images. The estimate is not a promise: an advance reservation, an
early end or a cancellation moves it, and the live queue may also start a lease sooner in a shorter window that
it then suspends.

PURE: no Django. Reads the scheduler (`PlanBook`: table, queue, lease records, configuration, timing) and
changes none of it; or a `Snapshot` of those, taken under the plan lock by `snapshot`, so that the forecast itself
can run after the lock is released while the next pass changes the live scheduler.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass, replace
from typing import Protocol

from leases.scheduling.book import PlanBook
from leases.scheduling.mapper import size_order, smallest
from leases.scheduling.records import SUSPENDED_STATES, LeaseRecord, LeaseRequest, SchedulerConfig
from leases.scheduling.timing import Timing
from leases.slottable import Res, Reservation, SlotTable

ESTIMATE = "estimate"  # the kind of the reservations the forecast places on its copy of the table


@dataclass(frozen=True)
class Estimate:
    """When a queued lease would start and end; both None with `note` saying why when it can never fit."""

    start: float | None
    end: float | None
    note: str = ""


class Book(Protocol):
    """What the forecast reads: a live PlanBook, or a Snapshot of one."""

    @property
    def table(self) -> SlotTable: ...
    @property
    def queue(self) -> Sequence[int]: ...
    @property
    def leases(self) -> Mapping[int, LeaseRecord]: ...
    @property
    def config(self) -> SchedulerConfig: ...
    @property
    def timing(self) -> Timing: ...


@dataclass(frozen=True)
class Snapshot:
    """A copy of what the forecast reads off a PlanBook, sharing nothing the book will write to: the slot table
    as a copy-on-write copy (SlotTable.copy: from then on each side clones a node's line before writing to it),
    the queue's order, the queued leases' records (their mutable parts copied: a pass changes a record's state,
    run time and images in place), the configuration (frozen) and a timing model of its own (Timing memoises
    into dicts). Taking it costs the queue's length, not the table's size, so the plan lock is held for little."""

    table: SlotTable
    queue: tuple[int, ...]
    leases: Mapping[int, LeaseRecord]
    config: SchedulerConfig
    timing: Timing


def snapshot(book: PlanBook) -> Snapshot:
    queue = tuple(book.queue)
    leases = {}
    for lid in queue:
        rec = book.leases[lid]
        # The forecast reads request (frozen), state, run_time and images; reservations and history are left out.
        leases[lid] = replace(rec, reservations=[], history=[], images=dict(rec.images))
    return Snapshot(book.table.copy(), queue, leases, book.config, Timing(book.config))


def forecast(
    book: Book, now: float, excluded: Mapping[int, str] | None = None, *, limit: int | None = None
) -> dict[int, Estimate]:
    """{lease id: Estimate} for every lease in the queue (FCFS order), each reserved on a copy of the table
    before the next is looked at. `excluded` maps node id -> "code: reason" (the placer's unusable nodes).
    `limit` bounds the work: leases beyond the first `limit` get no estimate, with a note saying so."""
    return _Forecast(book, now, excluded or {}).run(limit)


class _Runs:
    """Where one need fits on every usable node of the forecast's table: each node's free runs from `now`
    (SlotTable.free_runs), and all of them in one list sorted by start, so "the earliest start of any node for d
    seconds" is a walk from the front to the first run at least d long, not a question to every node. A node's
    runs are read again only after the forecast writes to that node."""

    def __init__(self, table: SlotTable, need: Res, nodes: Sequence[int], now: float) -> None:
        self.table, self.need, self.now = table, need, now
        self.by_node: dict[int, list[tuple[float, float]]] = {}
        self.flat: list[tuple[float, float, int]] = []
        for n in nodes:
            runs = self.by_node[n] = table.free_runs(n, need, now)
            self.flat.extend((a, b, n) for a, b in runs)
        self.flat.sort()
        self.dirty: set[int] = set()

    def touch(self, node: int) -> None:
        if node in self.by_node:
            self.dirty.add(node)

    def starts(self, duration: float) -> Iterator[tuple[float, float, int]]:
        """(start, end, node) of every run at least `duration` long, by start."""
        self._refresh()
        for a, b, n in self.flat:
            if b - a >= duration:
                yield a, b, n

    def holds(self, node: int, start: float, end: float) -> bool:
        return any(a <= start and end <= b for a, b in self.by_node.get(node, ()))

    def _refresh(self) -> None:
        flat = self.flat
        for n in self.dirty:
            for a, b in self.by_node[n]:
                del flat[bisect_left(flat, (a, b, n))]
            runs = self.by_node[n] = self.table.free_runs(n, self.need, self.now)
            for a, b in runs:
                insort(flat, (a, b, n))
        self.dirty.clear()


class _Forecast:
    def __init__(self, book: Book, now: float, excluded: Mapping[int, str]) -> None:
        self.book = book
        self.now = now
        self.excluded = excluded
        self.table: SlotTable = book.table.copy()
        self.caps = {n: self.table.capacity(n) for n in self.table.nodes}
        self.usable = [n for n in self.table.nodes if n not in excluded]
        self.runs: dict[Res, _Runs] = {}
        self.copies: dict[Res, int] = {}
        self.rid = 0

    def run(self, limit: int | None) -> dict[int, Estimate]:
        out: dict[int, Estimate] = {}
        for i, lid in enumerate(self.book.queue):
            if limit is not None and i >= limit:
                out[lid] = Estimate(
                    None, None, f"beyond the first {limit} queued leases the forecast looks at"
                )
                continue
            out[lid] = self.place(self.book.leases[lid])
        return out

    # -- one lease -----------------------------------------------------------------------------------------

    def place(self, rec: LeaseRecord) -> Estimate:
        req = rec.request
        cfg, timing = self.book.config, self.book.timing
        resuming = rec.state in SUSPENDED_STATES
        resume = timing.estimate(req, cfg.resume_rate, cfg.override_resume_time) if resuming else 0.0
        duration = resume + max(req.duration - rec.run_time, 0.0) + timing.shutdown_time(req)
        if resuming and cfg.migration == "no" and rec.images:
            found = self.at_images(req, rec.images, duration)
        else:
            found = self.anywhere(req, duration)
        if isinstance(found, str):
            return Estimate(None, None, found)
        start, alloc = found
        if duration > 0:
            self.rid -= 1  # negative ids: never one of the scheduler's own
            self.table.add(Reservation(self.rid, req.id, ESTIMATE, start, start + duration, alloc))
            for node in alloc:
                for runs in self.runs.values():
                    runs.touch(node)
        return Estimate(start, start + duration)

    def at_images(
        self, req: LeaseRequest, images: Mapping[int, int], duration: float
    ) -> tuple[float, dict[int, Res]] | str:
        """Without migration a suspended lease resumes where its memory images are: the earliest instant every
        one of those nodes holds its share for the whole window (each node's earliest fit from the latest one
        so far, until they agree)."""
        alloc: dict[int, Res] = {}
        for v, n in images.items():
            alloc[n] = alloc[n] + req.vnodes[v - 1] if n in alloc else req.vnodes[v - 1]
        for n in sorted(alloc):
            if n in self.excluded:
                return f"suspended with its memory on node {n}, which is unusable ({self.excluded[n]})"
            if n not in self.caps:
                return f"suspended with its memory on node {n}, which is gone"
            if not alloc[n].fits_in(self.caps[n]):
                return f"suspended with its memory on node {n}, which can no longer hold its VMs"
        t = self.now
        while True:
            latest = t
            for n, need in alloc.items():
                e = self.table.earliest_fit(n, need, duration, t)
                if e is None:
                    return f"node {n}, where its memory is, is reserved for good"
                latest = max(latest, e)
            if latest == t:
                return t, alloc
            t = latest

    def anywhere(self, req: LeaseRequest, duration: float) -> tuple[float, dict[int, Res]] | str:
        barred = dict(req.barred)
        allowed = _allowance(req)
        usable = [n for n in self.usable if n not in barred] if barred else self.usable
        if not usable:
            return "no usable node: " + _count_codes([*self.excluded.values(), *barred.values()])
        if req.spread is not None:
            usable = [n for n in usable if allowed(n) > 0]  # a group already at its spread limit there
            if not usable:
                return f"no usable node: its group already has {req.spread} VM(s) on every node it may use"
        order = size_order(req.vnodes)
        if self.pack(req, order, usable, allowed, lambda n, need: need.fits_in(self.caps[n])) is None:
            spread = f", at most {req.spread} on a node" if req.spread is not None else ""
            return (
                f"its {len(req.vnodes)} VM(s) do not fit on the {len(usable)} usable node(s) even when they "
                f"are empty{spread}"
            )
        found = (
            self.one(req, duration, barred) if len(req.vnodes) == 1 else self.several(req, order, duration)
        )
        return found if found is not None else "every usable node is reserved for good"

    def one(
        self, req: LeaseRequest, duration: float, barred: Mapping[int, str]
    ) -> tuple[float, dict[int, Res]] | None:
        """One VM: the earliest start on any node it may use; ties go to a node not on its avoid list, then the
        lowest id."""
        vm = req.vnodes[0]
        allowed = _allowance(req)
        best: tuple[float, bool, int] | None = None
        for a, _, n in self.runs_of(vm).starts(duration):
            if best is not None and a > best[0]:
                break
            if n in barred or (req.spread is not None and allowed(n) <= 0):
                continue
            key = (a, n in req.avoid, n)
            if best is None or key < best:
                best = key
        return None if best is None else (best[0], {best[2]: vm})

    def several(
        self, req: LeaseRequest, order: list[int], duration: float
    ) -> tuple[float, dict[int, Res]] | None:
        """Several VMs: the earliest start is `now` or an instant at which some node gains room for one more of
        them. For identical VMs those instants are the starts of the runs of 1, 2, ... copies; for mixed sizes
        every changepoint of the table is tried as well. At each, the mapper's packing over the nodes that can
        hold the smallest VM for the whole window."""
        allowed = _allowance(req)
        barred = {n for n, _ in req.barred}
        unit = smallest(req.vnodes)
        same = all(v == unit for v in req.vnodes)
        count = len(req.vnodes)
        most = min(count, self.most_copies(unit), count if req.spread is None else req.spread)
        base = self.runs_of(unit)
        streams = [base.starts(duration)]
        if same:
            streams += [self.runs_of(unit.scaled(j)).starts(duration) for j in range(2, most + 1)]
        else:
            streams.append((t, t, -1) for t in self.table.changepoints(self.now))
        seen: set[int] = set()
        merged = heapq.merge(*streams)
        pending = next(merged, None)
        while pending is not None:
            t = pending[0]
            while pending is not None and pending[0] == t:  # every run starting at t, before looking at t
                if pending[2] >= 0 and pending[2] not in barred:
                    seen.add(pending[2])
                pending = next(merged, None)
            if t == math.inf:
                return None
            if self.table.total_copies_at(unit, t) < count:
                continue  # the whole fleet's free capacity at t cannot hold them: no node walk needed
            end = t + duration
            ready = sorted((n for n in seen if base.holds(n, t, end)), key=lambda n: (n in req.avoid, n))
            alloc = self.pack(
                req, order, ready, allowed, lambda n, need, t=t, end=end: self.table.fits(n, need, t, end)
            )
            if alloc is not None:
                return t, alloc
        return None

    # -- helpers -------------------------------------------------------------------------------------------

    def most_copies(self, unit: Res) -> int:
        got = self.copies.get(unit)
        if got is None:
            got = self.copies[unit] = max(_copies(unit, c) for c in set(self.caps.values()))
        return got

    def runs_of(self, need: Res) -> _Runs:
        got = self.runs.get(need)
        if got is None:
            got = self.runs[need] = _Runs(self.table, need, self.usable, self.now)
        return got

    @staticmethod
    def pack(
        req: LeaseRequest, order: list[int], nodes: Sequence[int], allowed, fits
    ) -> dict[int, Res] | None:
        """The mapper's packing: VMs largest first onto each node in turn while they fit (and the group's
        spread allows); the nodes' shares, or None."""
        alloc: dict[int, Res] = {}
        i = 0
        for node in nodes:
            need: Res | None = None
            placed = 0
            room = allowed(node)
            while i < len(order) and placed < room:
                vnode = req.vnodes[order[i] - 1]
                trial = vnode if need is None else need + vnode
                if not fits(node, trial):
                    break
                need = trial
                i += 1
                placed += 1
            if need is not None:
                alloc[node] = need
            if i == len(order):
                return alloc
        return None


def _copies(unit: Res, cap: Res) -> int:
    """How many copies of unit fit in cap (unit asks for something)."""
    pairs = [(c, u) for c, u in zip(astuple(cap), astuple(unit), strict=True) if u > 0]
    return min(c // u for c, u in pairs) if pairs else 1 << 30


def _allowance(req: LeaseRequest):
    if req.spread is None:
        return lambda node: len(req.vnodes)
    taken = dict(req.taken)
    spread = req.spread
    return lambda node: spread - taken.get(node, 0)


def _count_codes(reasons: Sequence[str]) -> str:
    """ "3 draining, 2 missing_capability": the codes of "code: sentence" reasons, counted."""
    counts = Counter(r.split(":", 1)[0].strip() or "unusable" for r in reasons)
    return ", ".join(f"{k} {code}" for code, k in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
