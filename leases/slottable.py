"""The slot table: every reservation of node capacity over time, and the questions asked of it.

This module owns `SlotTable` (its values, `Res` and `Reservation`, live in `leases/slots/`), which answers "how much is used / free on this node at t", "does this need fit on [a, b)",
"until when does it fit", "what is the earliest start for it", "who is in the way", the ongoing-availability
envelope and the changepoints the scheduler tries as start times (Haizea semantics, SEMANTICS.md §2).

Design (docs/slottable.md): each node keeps a step function of its usage — sorted breakpoints, the usage level
on each segment and a count of reservation endpoints per breakpoint — so point lookups are a bisection and
interval questions walk only the segments they cover. Haizea instead keeps two global lists and rebuilds an
availability window over every node for each query. Copies share node step functions until one side writes.

PURE: no Django; times are plain floats (seconds), injected by the caller.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from leases.slots.lines import (
    NEAR,
    Index,
    Line,
)
from leases.slots.rooms import RoomCounts
from leases.slots.values import (
    ZERO_VEC,
    Overcommit,
    Res,
    Reservation,
    Vec,
    nonzero_dims,
    room_limit,
    unit_wants,
    unvec,
    vec,
    vec_lowest,
    vec_minus,
    vec_plus,
)

if TYPE_CHECKING:
    from leases.slots.arrays import NodeArrays

# The slot table's vocabulary is imported from here; leases/slots/ holds its parts.
__all__ = ["Overcommit", "Res", "Reservation", "RoomCounts", "SlotTable"]

# The (need, start, end) answers of `blocking_leases` kept per node, all dropped when one more would pass this.
BLOCKED_KEPT = 64


@dataclass(frozen=True, slots=True)
class _Use:
    """One of a node's reservations as `blockers` reads it, kept until the node is next written."""

    start: float
    end: float
    used: int  # the dimensions it holds some of on this node, as bits (1 << dimension)
    lease_id: int
    row: Reservation


class SlotTable:
    """Reservations over time on a fixed set of nodes, never overcommitted at any instant."""

    def __init__(self, capacities: Mapping[int, Res]) -> None:
        self._caps: dict[int, Vec] = {n: vec(c) for n, c in capacities.items()}
        self.nodes: tuple[int, ...] = tuple(sorted(self._caps))
        self._lines: dict[int, Line] = {n: Line() for n in self.nodes}
        self._owned: set[int] = set(self.nodes)
        self._index = Index()
        self._index_owned = True
        # The whole fleet's usage as one step function: "is there room for n copies at t" has a one-bisection
        # upper bound (total_free_at), which rules out most candidate instants without looking at any node.
        self._total = Line()
        self._total_owned = True
        self._total_cap: Vec = ZERO_VEC
        # The flat columns of every node's line, built on first use (`arrays`), and the nodes written since.
        self._arrays: NodeArrays | None = None
        self._dirty: set[int] = set()
        # Per node, its reservations as `_Use` rows in (start, rid) order and in lease order, built when `blockers`
        # first asks and dropped when the node is written to.
        self._uses: dict[int, tuple[list[_Use], list[_Use]]] = {}
        # Per node, `blocking_leases` answers by (need, start, end, most), dropped with `_uses`: the reports of one pass
        # ask about the same few shapes and windows on the same nodes, the table unchanged in between.
        self._blocked: dict[int, dict[tuple[Res, float, float, int | None], frozenset[int]]] = {}
        for cap in self._caps.values():
            self._total_cap = (
                self._total_cap[0] + cap[0],
                self._total_cap[1] + cap[1],
                self._total_cap[2] + cap[2],
                self._total_cap[3] + cap[3],
                self._total_cap[4] + cap[4],
            )

    # -- reading -------------------------------------------------------------------------------------------

    def capacity(self, node: int) -> Res:
        return unvec(self._cap(node))

    def get(self, rid: int) -> Reservation:
        return self._index.by_rid[rid]

    def __len__(self) -> int:
        return len(self._index.by_rid)

    def reservations(
        self,
        start: float | None = None,
        end: float | None = None,
        node: int | None = None,
        lease_id: int | None = None,
    ) -> list[Reservation]:
        """Reservations overlapping [start, end) (None = unbounded), sorted by start then rid.

        A zero-length window [t, t) returns the reservations running at t (start <= t < end), as Haizea's
        get_reservations_at does.
        """
        lo = -math.inf if start is None else start
        hi = math.inf if end is None else end
        if node is not None:
            pool: Iterable[Reservation] = (self._index.by_rid[rid] for rid in self._line(node).rids)
        elif lease_id is not None:
            pool = (self._index.by_rid[rid] for rid in self._index.by_lease.get(lease_id, ()))
        else:
            pool = self._index.starting_between(lo - self._index.longest, hi)
        found = [r for r in pool if r.overlaps(lo, hi) and (lease_id is None or r.lease_id == lease_id)]
        found.sort(key=lambda r: (r.start, r.rid))
        return found

    def total_free_at(self, t: float) -> Res:
        """Free capacity at t summed over every node: no need larger than this fits at t, split or not."""
        return unvec(vec_minus(self._total_cap, self._total.level_at(t)))

    def copies_at(self, node: int, unit: Res, t: float) -> int:
        """How many copies of `unit` fit on the node at t (1 << 30 for a unit asking nothing)."""
        self._cap(node)
        return self.copies_many((node,), unit, t)[node]

    def copies_many(self, nodes: Iterable[int], unit: Res, t: float) -> dict[int, int]:
        """copies_at for many nodes in one loop, building no Res: the scheduler asks this for every node at
        every candidate instant, and as a call per node it was the top of the 30-day replay's profile."""
        wants = unit_wants(unit)
        caps, lines = self._caps, self._lines
        out: dict[int, int] = {}
        if len(wants) == 2:  # cpu and memory, the common shape: the same sum, unrolled
            (d0, w0), (d1, w1) = wants
            for node in nodes:
                line = lines[node]
                k = bisect_right(line.times, t) - 1
                cap = caps[node]
                col0, col1 = line.cols[d0], line.cols[d1]
                a = (cap[d0] - (col0[k] if k >= 0 and col0 else 0)) // w0
                b = (cap[d1] - (col1[k] if k >= 0 and col1 else 0)) // w1
                if b < a:
                    a = b
                if a > 1 << 30:
                    a = 1 << 30
                out[node] = a if a > 0 else 0
            return out
        for node in nodes:
            line = lines[node]
            k = bisect_right(line.times, t) - 1
            cap = caps[node]
            cols = line.cols
            best = 1 << 30
            for d, want in wants:
                col = cols[d]
                c = (cap[d] - (col[k] if k >= 0 and col else 0)) // want
                if c < best:
                    best = c
            out[node] = best if best > 0 else 0
        return out

    def total_free_cpu_at(self, t: float) -> int:
        """total_free_at(t).cpu, building no Res (asked before every queued lease is looked at)."""
        times = self._total.times
        k = bisect_right(times, t) - 1
        cpu = self._total.cols[0]
        return self._total_cap[0] - (cpu[k] if k >= 0 and cpu else 0)

    def total_copies_at(self, unit: Res, t: float) -> int:
        """How many copies of `unit` the fleet's total free capacity at t holds (an upper bound on how many fit
        on its nodes); the same as counting them in total_free_at(t), without building a Res."""
        level = self._total.level_at(t)
        cap = self._total_cap
        best = 1 << 30
        for d, want in unit_wants(unit):
            c = (cap[d] - level[d]) // want
            if c < best:
                best = c
        return best if best > 0 else 0

    def used_at(self, node: int, t: float) -> Res:
        return unvec(self._line(node).level_at(t))

    def available_at(self, node: int, t: float) -> Res:
        return unvec(vec_minus(self._cap(node), self._line(node).level_at(t)))

    def fits(self, node: int, need: Res, start: float, end: float) -> bool:
        """Need fits for all of [start, end); on a zero-length interval, whether it fits at start."""
        _check_interval(start, end)
        limit = room_limit(self._cap(node), need)
        if limit is None:
            return False
        line = self._line(node)
        if end == start:
            level = line.level_at(start)
            return all(level[d] <= limit[0][d] for d in limit[1])
        return line.has_room(start, end, *limit)

    def fits_until(self, node: int, need: Res, start: float) -> float:
        """The latest t' with need fitting on [start, t'); start if it does not fit then; inf if forever."""
        limit = room_limit(self._cap(node), need)
        if limit is None:
            return start
        line = self._line(node)
        k = line.first_segment(start)
        # Look at the next few segments first: most answers lie there, and flagging the whole future of a
        # busy node costs ~4x more at the median (bench/bench_slottable.py).
        for j in (k + NEAR, None):
            blocked = line.room(k, j, *limit).find(0)
            if blocked >= 0:
                return max(line.times[k + blocked], start)
        return math.inf

    def earliest_fit(self, node: int, need: Res, duration: float, after: float) -> float | None:
        """The earliest t >= after with need fitting on [t, t + duration); None if it never fits there."""
        if duration < 0:
            raise ValueError(f"negative duration {duration}")
        limit = room_limit(self._cap(node), need)
        if limit is None:
            return None
        line = self._line(node)
        if duration > 0 and line.has_room(after, after + duration, *limit):
            return after  # The common answer, checked without flagging the node's whole future.
        k = line.first_segment(after)
        room, times = line.room(k, None, *limit), line.times
        t, free = after, 0
        while True:
            blocked = room.find(0, free)
            # [t, t + duration) is clear when the next blocked segment starts after t and not before the end;
            # a zero-length window needs only the instant t itself.
            if blocked < 0 or (times[k + blocked] > t and times[k + blocked] >= t + duration):
                return t
            # Any start before the end of this blocked run would overlap it. A free segment always follows:
            # usage falls to zero after the last end.
            free = room.find(1, blocked)
            t = times[k + free]
            if t == math.inf:
                return None  # Only a reservation that never ends can push the start out to infinity.

    def earliest_fits(self, need: Res, duration: float, after: float) -> dict[int, float]:
        """`earliest_fit` of every node, as {node: t}, leaving out the nodes where it never fits; one pass over
        the whole table's columns (`NodeArrays.earliest_fits`), not a walk of each node's line. A need for the
        network dimensions, which the columns do not hold, is walked node by node."""
        if duration < 0:
            raise ValueError(f"negative duration {duration}")
        from leases.slots.arrays import DIMS

        nv = vec(need)
        dims = nonzero_dims(nv)
        if any(d >= DIMS for d in dims):
            found = {n: self.earliest_fit(n, need, duration, after) for n in self.nodes}
            return {n: t for n, t in found.items() if t is not None}
        arrays = self.arrays()
        lims = arrays.caps - np.array([nv[:DIMS]], dtype=np.int64)
        fits = arrays.earliest_fits(lims, dims, duration, after)
        if dims:  # a need larger than a node's capacity never fits there (room_limit's None)
            fits[(lims[:, list(dims)] < 0).any(axis=1)] = math.inf
        return {n: t for n, t in zip(self.nodes, fits.tolist(), strict=True) if t != math.inf}

    def free_runs(self, node: int, need: Res, after: float) -> list[tuple[float, float]]:
        """The maximal intervals from `after` on over which `need` fits on the node, in time order; the last one
        ends at inf (usage falls to zero after the last end). Empty if it never fits. The earliest fit for any
        duration d is the start of the first run at least d long: the queue forecast asks that of many durations
        per node, so it keeps these runs rather than asking earliest_fit again and again."""
        limit = room_limit(self._cap(node), need)
        if limit is None:
            return []
        line = self._line(node)
        times = line.times
        if not times or times[-1] <= after:
            return [(after, math.inf)]
        k = line.first_segment(after)
        room = line.room(k, None, *limit)
        runs: list[tuple[float, float]] = []
        if after < times[0]:
            # Nothing is reserved before the first breakpoint: a free run from `after`, joined to the first
            # segment's if that one has room too.
            runs.append((after, times[0]))
        pos = 0
        while True:
            a = room.find(1, pos)
            if a < 0:
                return runs
            b = room.find(0, a)
            start = max(times[k + a], after)
            end = times[k + b] if b >= 0 else math.inf
            if runs and runs[-1][1] >= start:
                runs[-1] = (runs[-1][0], end)
            else:
                runs.append((start, end))
            if b < 0:
                return runs
            pos = b

    def free_over(self, node: int, start: float, end: float) -> Res:
        return unvec(self.free_over_vec(node, start, end))

    def free_over_vec(self, node: int, start: float, end: float) -> Vec:
        """The least free capacity of each resource at any instant of [start, end) (negative where running work
        exceeds a capacity that shrank): what a newcomer can have for the whole window. One `max` over a column
        slice per resource in use, so explaining a decision over 1,000 nodes stays cheap."""
        _check_interval(start, end)
        cap = self._cap(node)
        line = self._line(node)
        times = line.times
        first = max(bisect_right(times, start) - 1, 0)
        last = bisect_left(times, end) - 1 if end > start else bisect_right(times, start) - 1
        peak = [0, 0, 0, 0, 0]
        if last >= first:
            for d in line.live:
                peak[d] = max(line.cols[d][first : last + 1])
        return (cap[0] - peak[0], cap[1] - peak[1], cap[2] - peak[2], cap[3] - peak[3], cap[4] - peak[4])

    def blockers(self, node: int, need: Res, start: float, end: float) -> list[Reservation]:
        """The reservations that keep `need` from fitting on [start, end), for messages such as
        "reserved 13:30-14:00 by lease 7"; empty when it fits. A need larger than the node blames no one."""
        return [use.row for use in self._blocking(node, need, start, end)]

    def blocking_leases(
        self, node: int, need: Res, start: float, end: float, most: int | None = None
    ) -> set[int]:
        """The leases of `blockers(node, need, start, end)` (a report names them for several nodes in every
        decision), or only the `most` lowest of their ids: a full node is blocked by every lease on it and a report
        names five, so the walk stops at the `most`-th. Kept per node until it is written to, and a fresh set every
        call for the caller to change."""
        memo = self._blocked.get(node)
        if memo is None:
            memo = self._blocked[node] = {}
        key = (need, start, end, most)
        got = memo.get(key)
        if got is None:
            if len(memo) >= BLOCKED_KEPT:  # a node nobody writes to is asked about at every pass's `now`
                memo.clear()
            got = memo[key] = frozenset(use.lease_id for use in self._blocking(node, need, start, end, most))
        return set(got)

    def _blocking(
        self, node: int, need: Res, start: float, end: float, most: int | None = None
    ) -> list[_Use]:
        """The node's reservations (in `_uses_on` order) that keep `need` from fitting on [start, end): those
        overlapping a segment of the window whose level leaves no room in a dimension they use; none when the
        need is larger than the node. With `most`: in lease id order instead, those of the `most` lowest lease
        ids only."""
        _check_interval(start, end)
        limit = room_limit(self._cap(node), need)
        if limit is None:
            return []
        lim, dims = limit
        line = self._line(node)
        # The short segments merged into runs (contiguous, short in the same dimensions): a node filled for the
        # whole window is one run however many reservations end inside it.
        runs: list[list] = []
        for seg_start, seg_end, level in line.segments(start, end):
            short = 0  # the dimensions short here, as bits
            for d in dims:
                if level[d] > lim[d]:
                    short |= 1 << d
            if not short:
                continue
            if runs and runs[-1][1] == seg_start and runs[-1][2] == short and seg_start < seg_end:
                runs[-1][1] = seg_end
            else:
                runs.append([seg_start, seg_end, short])
        if not runs:
            return []
        # A plain loop over the node's kept reservations: a node holds tens of them, and at that size numpy's
        # per-call cost made columns 2.7 times slower than this loop (one set of array operations over every run
        # and reservation at once, 7 times), measured on bench_reports' 1,000-node table.
        hits: list[_Use] = []
        by_start, by_lease = self._uses_on(node, line)
        leases: set[int] = set()
        for use in by_start if most is None else by_lease:
            if most is not None and len(leases) == most and use.lease_id not in leases:
                break
            for run_start, run_end, short in runs:
                if run_start == run_end:  # an instant: the reservations running then
                    meets = use.start <= run_start < use.end
                else:
                    meets = (use.start < run_end and use.end > run_start) or (
                        use.start == use.end and run_start <= use.start < run_end
                    )
                if meets and use.used & short:
                    hits.append(use)
                    leases.add(use.lease_id)
                    break
        return hits

    def _uses_on(self, node: int, line: Line) -> tuple[list[_Use], list[_Use]]:
        """The node's reservations as `_Use` rows twice: in (start, rid) order and in (lease, start, rid) order."""
        got = self._uses.get(node)
        if got is None:
            by_rid = self._index.by_rid
            rows = sorted((by_rid[rid] for rid in line.rids), key=lambda r: (r.start, r.rid))
            by_start = [
                _Use(
                    r.start,
                    r.end,
                    sum(1 << d for d, x in enumerate(vec(r.alloc[node])) if x > 0),
                    r.lease_id,
                    r,
                )
                for r in rows
            ]
            got = self._uses[node] = (by_start, sorted(by_start, key=lambda u: u.lease_id))
        return got

    def envelope(self, node: int, start: float) -> list[tuple[Res, float]]:
        """Haizea's ongoing availability from `start`: (available, until) pairs, non-increasing per resource.

        An entry starts only when some resource drops below every earlier entry; rises are ignored, so the
        entry covering t is the minimum availability over [start, t]. The last entry's until is inf.
        """
        cap = self._cap(node)
        line = self._line(node)
        pairs: list[tuple[Res, float]] = []
        current: Vec | None = None
        for seg_start, _seg_end, level in line.segments(start, math.inf):
            free = vec_minus(cap, level)
            low = free if current is None else vec_lowest(current, free)
            if current is not None and low != current:
                pairs.append((unvec(current), seg_start))
            current = low
        assert current is not None
        pairs.append((unvec(current), math.inf))
        return pairs

    def changepoints(
        self, after: float, until: float | None = None, nodes: Iterable[int] | None = None
    ) -> list[float]:
        """Sorted distinct reservation starts and ends strictly after `after` (and <= until)."""
        hi = math.inf if until is None else until
        if nodes is None:
            return list(self._index.points.between(after, hi, include_lo=False))
        found: set[float] = set()
        for n in nodes:
            times = self._line(n).times
            found.update(times[bisect_right(times, after) : bisect_right(times, hi)])
        return sorted(found)

    # -- writing -------------------------------------------------------------------------------------------

    def add(self, r: Reservation, *, force: bool = False) -> None:
        """Add a reservation, or raise Overcommit (and change nothing) if any node would exceed capacity.

        `force` adds it whatever the capacity: only for work already running on a node whose capacity has shrunk
        since (a new host baseline, a resized node), which cannot be undone by refusing to know about it. The
        node then stays over capacity, and so refuses new work, until that work ends."""
        if r.rid in self._index.by_rid:
            raise ValueError(f"reservation {r.rid} is already in the table")
        # Vectors once, and the room check straight on the columns: a replay adds ~200,000 node rows, and going
        # through fits() (a Res per node, a cached-limit lookup) was a fifth of the 30-day replay's time.
        # Each node is checked and written in one step; a node without room undoes the ones written before it.
        total = ZERO_VEC
        rid, start, end = r.rid, r.start, r.end
        done: list[tuple[int, Vec]] = []
        for node, use in r.alloc.items():
            v = vec(use)
            cap = None if force else self._cap(node)
            if min(v) < 0 or not self._writable_line(node).add(rid, start, end, v, nonzero_dims(v), cap):
                for n, w in done:
                    self._lines[n].remove(rid, start, end, w, nonzero_dims(w))
                if min(v) < 0:
                    raise ValueError(f"negative use {unvec(v)} on node {node}")
                instant = max(start, self.fits_until(node, unvec(v), start))
                raise Overcommit(node, instant, unvec(v), self.available_at(node, instant))
            done.append((node, v))
            total = vec_plus(total, v)
        self._writable_total().add(rid, start, end, total)
        self._writable_index().add(r)

    def remove(self, rid: int) -> Reservation:
        r = self._index.by_rid[rid]
        total = ZERO_VEC
        start, end = r.start, r.end
        for node, use in r.alloc.items():
            v = vec(use)
            self._writable_line(node).remove(rid, start, end, v, nonzero_dims(v))
            total = vec_plus(total, v)
        self._writable_total().remove(rid, r.start, r.end, total)
        self._writable_index().remove(r)
        return r

    def replace(self, r: Reservation) -> None:
        """Swap the reservation with r.rid for r; if r is refused the old one stays, so nothing is lost."""
        current = self._index.by_rid[r.rid]
        if (r.start, r.end, r.lease_id) == (current.start, current.end, current.lease_id) and _sum(
            r.alloc.values()
        ) == _sum(current.alloc.values()):
            self._shift(current, r)
            return
        old = self.remove(r.rid)
        try:
            self.add(r)
        except Exception:
            self.add(old)
            raise

    def _shift(self, old: Reservation, r: Reservation) -> None:
        """`replace` when only the split over nodes changes (a vnode moved by a reschedule): the same times and the
        same total, so only the nodes whose share changed are rewritten. The fleet-wide total line and the index's
        time lookups stay as they are; rewriting the total (thousands of breakpoints at a few thousand leases) was
        most of the cost of a move."""
        rid, start, end = r.rid, r.start, r.end
        changed = sorted(n for n in {*old.alloc, *r.alloc} if old.alloc.get(n) != r.alloc.get(n))
        removed: list[tuple[int, Vec]] = []
        for node in changed:
            if node in old.alloc:
                v = vec(old.alloc[node])
                self._writable_line(node).remove(rid, start, end, v, nonzero_dims(v))
                removed.append((node, v))
        added: list[tuple[int, Vec]] = []
        for node in changed:
            if node not in r.alloc:
                continue
            v = vec(r.alloc[node])
            if min(v) < 0 or not self._writable_line(node).add(
                rid, start, end, v, nonzero_dims(v), self._cap(node)
            ):
                for n, w in added:
                    self._lines[n].remove(rid, start, end, w, nonzero_dims(w))
                for n, w in removed:
                    self._lines[n].add(rid, start, end, w, nonzero_dims(w), None)
                if min(v) < 0:
                    raise ValueError(f"negative use {unvec(v)} on node {node}")
                instant = max(start, self.fits_until(node, unvec(v), start))
                raise Overcommit(node, instant, unvec(v), self.available_at(node, instant))
            added.append((node, v))
        self._writable_index().by_rid[rid] = r
        for node in r.alloc:
            self._uses.pop(node, None)  # they list the reservation as it was

    def copy(self) -> SlotTable:
        """A snapshot to plan on; node step functions are shared and cloned only when one side writes."""
        other = SlotTable.__new__(SlotTable)
        other._caps = self._caps
        other.nodes = self.nodes
        other._lines = self._lines.copy()
        other._index = self._index
        other._total = self._total
        other._total_cap = self._total_cap
        # Both sides now share everything, so both must clone what they write to first.
        other._owned, self._owned = set(), set()
        other._index_owned = self._index_owned = False
        other._total_owned = self._total_owned = False
        other._arrays, other._dirty = None, set()
        other._uses, other._blocked = {}, {}
        return other

    def arrays(self) -> NodeArrays:
        """Every node's line as flat numpy columns, for questions about the whole fleet at once (the verdicts of
        a decision); kept in step with the table by rebuilding only the nodes written to since the last call."""
        from leases.slots.arrays import NodeArrays

        if self._arrays is None:
            self._arrays = NodeArrays(self.nodes, self._caps, self._lines)
        elif self._dirty:
            self._arrays.refresh(self._lines, self._dirty)
        self._dirty = set()
        return self._arrays

    # -- internals -----------------------------------------------------------------------------------------

    def _cap(self, node: int) -> Vec:
        try:
            return self._caps[node]
        except KeyError:
            raise KeyError(f"node {node} is not in the slot table") from None

    def _line(self, node: int) -> Line:
        self._cap(node)
        return self._lines[node]

    def _writable_line(self, node: int) -> Line:
        self._dirty.add(node)
        self._uses.pop(node, None)
        self._blocked.pop(node, None)
        if node not in self._owned:
            self._lines[node] = self._lines[node].clone()
            self._owned.add(node)
        return self._lines[node]

    def _writable_total(self) -> Line:
        if not self._total_owned:
            self._total = self._total.clone()
            self._total_owned = True
        return self._total

    def _writable_index(self) -> Index:
        if not self._index_owned:
            self._index = self._index.clone()
            self._index_owned = True
        return self._index


def _check_interval(start: float, end: float) -> None:
    if end < start:
        raise ValueError(f"interval ends ({end}) before it starts ({start})")


def _sum(uses) -> Vec:
    total = ZERO_VEC
    for use in uses:
        total = vec_plus(total, vec(use))
    return total
