"""One node's usage as a step function (`Line`) and the table-wide index of reservations (`Index`); design in
docs/slottable.md.

PURE: no Django.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from itertools import islice
from typing import TypeVar

from leases.slots.values import (
    ZERO_VEC,
    Reservation,
    Vec,
    nonzero_dims,
)

G = TypeVar("G", int, float)


class Line:
    """One node's usage as a step function, one column per resource.

    `cols[d][k]` is the usage of resource d on [times[k], times[k+1]); before times[0] and after times[-1] usage
    is zero. Columns rather than a tuple per segment let the questions below run over list slices with `max`,
    `map` and `bytes.find`, in C: a Python loop over segments made a whole-node earliest_fit over 300 segments
    cost ~360 us at p99 (bench/bench_slottable.py). `refs[k]` counts the reservation starts and ends at
    times[k], so a breakpoint goes with its last reservation and removed history never slows a walk.

    A column no reservation has used yet is kept empty rather than as zeros (`live` lists the kept ones):
    on most fleets disk and network stay at zero, and keeping five columns in step on every write was the
    largest cost of the 30-day replay (docs/benchmarks/replay.md). An empty column reads as zero everywhere.
    """

    __slots__ = ("cols", "live", "live_cols", "refs", "rids", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cols: tuple[list[int], ...] = ([], [], [], [], [])
        self.live: list[int] = []  # the columns kept in step with times, in ascending order
        self.live_cols: list[list[int]] = []  # those columns themselves
        self.refs: list[int] = []
        self.rids: set[int] = set()

    def clone(self) -> Line:
        other = Line()
        other.times = self.times.copy()
        other.cols = tuple(col.copy() for col in self.cols)
        other.live = self.live.copy()
        other.live_cols = [other.cols[d] for d in other.live]
        other.refs = self.refs.copy()
        other.rids = self.rids.copy()
        return other

    def level(self, k: int) -> Vec:
        if k < 0:
            return ZERO_VEC
        c0, c1, c2, c3, c4 = self.cols
        return (
            c0[k] if c0 else 0,
            c1[k] if c1 else 0,
            c2[k] if c2 else 0,
            c3[k] if c3 else 0,
            c4[k] if c4 else 0,
        )

    def level_at(self, t: float) -> Vec:
        return self.level(bisect_right(self.times, t) - 1)

    def first_segment(self, t: float) -> int:
        """The index of the segment holding t, or 0 when t lies before every breakpoint (in the zero prefix)."""
        return max(bisect_right(self.times, t) - 1, 0)

    def has_room(self, start: float, end: float, lim: Vec, dims: tuple[int, ...]) -> bool:
        """Whether every segment meeting [start, end) stays within lim (end > start)."""
        k, j = self.first_segment(start), bisect_left(self.times, end)
        cols = self.cols
        return all(max(cols[d][k:j], default=0) <= lim[d] for d in dims)

    def room(self, k: int, j: int | None, lim: Vec, dims: tuple[int, ...]) -> bytes:
        """One byte per segment k..j-1 (k.. when j is None): 1 where its level leaves room within lim."""
        flags: Iterator[bool] | None = None
        for d in dims:
            col = self.cols[d]
            if not col:
                continue  # zero everywhere, and lim[d] >= 0 for every dimension a need asks for (limit)
            ok = map(lim[d].__ge__, col[k:j])
            flags = ok if flags is None else map(operator.and_, flags, ok)
        return b"\x01" * len(self.times[k:j]) if flags is None else bytes(flags)

    def segments(self, start: float, end: float) -> Iterator[tuple[float, float, Vec]]:
        """(from, to, level) for the segments covering [start, end), clipped to it.

        A zero-length interval yields the one segment holding `start`, as (start, start, level).
        """
        times = self.times
        k = bisect_right(times, start) - 1
        t = start
        while True:
            nxt = times[k + 1] if k + 1 < len(times) else math.inf
            yield t, min(nxt, end), self.level(k)
            if nxt >= end:
                return
            t, k = nxt, k + 1

    def _materialise(self, use: Vec) -> None:
        """Keep the columns `use` writes to in step with times from now on (zeros so far)."""
        for d in range(5):
            if use[d] and d not in self.live:
                self.cols[d][:] = [0] * len(self.times)
                self.live.append(d)
                self.live.sort()
                self.live_cols = [self.cols[x] for x in self.live]

    def add(
        self,
        rid: int,
        start: float,
        end: float,
        use: Vec,
        dims: tuple[int, ...] | None = None,
        cap: Vec | None = None,
    ) -> bool:
        """Count the reservation's two endpoints (a new breakpoint continues the level before it) and raise the
        level by `use` on [start, end): one pass, with the bisections shared. `dims`: use's non-zero dimensions.

        With `cap`, first check that `use` fits under it on every segment meeting [start, end) (as `holds`),
        and write nothing and answer False when it does not."""
        if dims is None:
            dims = nonzero_dims(use)
        cols = self.cols
        times, refs = self.times, self.refs
        k = bisect_left(times, start)
        if cap is not None and end != start:
            lo = k if k < len(times) and times[k] == start else (k - 1 if k > 0 else 0)
            hi = bisect_left(times, end, k)
            for d in dims:
                if max(cols[d][lo:hi], default=0) > cap[d] - use[d]:
                    return False
        for d in dims:
            if not cols[d]:
                self._materialise(use)
                break
        live = self.live_cols
        if k == len(times) or times[k] != start:
            times.insert(k, start)
            for col in live:
                col.insert(k, col[k - 1] if k > 0 else 0)
            refs.insert(k, 0)
        refs[k] += 1
        j = bisect_left(times, end, k)
        if j == len(times) or times[j] != end:
            times.insert(j, end)
            for col in live:
                col.insert(j, col[j - 1] if j > 0 else 0)
            refs.insert(j, 0)
        refs[j] += 1
        if j > k:
            for d in dims:
                col = cols[d]
                col[k:j] = map(use[d].__add__, col[k:j])
        self.rids.add(rid)
        return True

    def remove(
        self, rid: int, start: float, end: float, use: Vec, dims: tuple[int, ...] | None = None
    ) -> None:
        if dims is None:
            dims = nonzero_dims(use)
        times, refs, cols = self.times, self.refs, self.cols
        k = bisect_left(times, start)
        j = bisect_left(times, end, k)
        if j > k:
            for d in dims:
                col = cols[d]
                col[k:j] = map((-use[d]).__add__, col[k:j])
        # A breakpoint no reservation starts or ends at any more goes: the level continues the previous one's.
        refs[j] -= 1
        if refs[j] == 0:
            del times[j], refs[j]
            for col in self.live_cols:
                del col[j]
        refs[k] -= 1
        if refs[k] == 0:
            del times[k], refs[k]
            for col in self.live_cols:
                del col[k]
        self.rids.discard(rid)


CHUNK = 512
NEAR = 16


class SortedFloats:
    """Distinct floats in order, kept in chunks of at most 2 * CHUNK.

    One flat sorted list of 150,000 reservation times made every add and remove move the whole list: ~40 us
    of memmove per insort and a 4.5 ms p99 for add+remove (bench/bench_slottable.py). Chunks bound each move
    to about a thousand items.
    """

    __slots__ = ("_chunks", "_maxes")

    def __init__(self) -> None:
        self._chunks: list[list[float]] = []
        self._maxes: list[float] = []

    def clone(self) -> SortedFloats:
        other = SortedFloats()
        other._chunks = [chunk.copy() for chunk in self._chunks]
        other._maxes = self._maxes.copy()
        return other

    def add(self, x: float) -> None:
        chunks, maxes = self._chunks, self._maxes
        if not chunks:
            chunks.append([x])
            maxes.append(x)
            return
        k = min(bisect_left(maxes, x), len(maxes) - 1)
        chunk = chunks[k]
        insort(chunk, x)
        maxes[k] = chunk[-1]
        if len(chunk) > 2 * CHUNK:
            chunks[k : k + 1] = [chunk[:CHUNK], chunk[CHUNK:]]
            maxes[k : k + 1] = [chunk[CHUNK - 1], chunk[-1]]

    def remove(self, x: float) -> None:
        k = bisect_left(self._maxes, x)
        chunk = self._chunks[k]
        del chunk[bisect_left(chunk, x)]
        if chunk:
            self._maxes[k] = chunk[-1]
        else:
            del self._chunks[k], self._maxes[k]

    def between(self, lo: float, hi: float, *, include_lo: bool) -> Iterator[float]:
        """The items x with lo <= x <= hi (lo < x <= hi unless include_lo), in order."""
        find = bisect_left if include_lo else bisect_right
        k = find(self._maxes, lo)
        for n, chunk in enumerate(islice(self._chunks, k, None)):
            i = find(chunk, lo) if n == 0 else 0
            j = bisect_right(chunk, hi)
            yield from chunk[i:j]
            if j < len(chunk):
                return


class Index:
    """The table-wide lookups: reservations by id, by lease and by start, and every distinct start or end."""

    __slots__ = ("by_lease", "by_rid", "by_start", "longest", "point_refs", "points", "starts")

    def __init__(self) -> None:
        self.by_rid: dict[int, Reservation] = {}
        # Groups are tuples, not sets, so that clone() is a shallow copy: deep-copying 150,000 sets made the
        # first write to a copy of a full table take ~0.5 s (bench/bench_slottable.py).
        self.by_lease: dict[int, tuple[int, ...]] = {}
        self.by_start: dict[float, tuple[int, ...]] = {}
        self.starts = SortedFloats()
        self.point_refs: dict[float, int] = {}
        self.points = SortedFloats()
        # An upper bound on any reservation's length (it never shrinks), so a window query only has to look at
        # starts in [lo - longest, hi] instead of at every reservation.
        self.longest = 0.0

    def clone(self) -> Index:
        other = Index()
        other.by_rid = self.by_rid.copy()
        other.by_lease = self.by_lease.copy()
        other.by_start = self.by_start.copy()
        other.starts = self.starts.clone()
        other.point_refs = self.point_refs.copy()
        other.points = self.points.clone()
        other.longest = self.longest
        return other

    def add(self, r: Reservation) -> None:
        self.by_rid[r.rid] = r
        join_group(self.by_lease, r.lease_id, r.rid)
        if join_group(self.by_start, r.start, r.rid):
            self.starts.add(r.start)
        self.longest = max(self.longest, r.end - r.start)
        for t in (r.start, r.end):
            refs = self.point_refs.get(t, 0)
            if refs == 0:
                self.points.add(t)
            self.point_refs[t] = refs + 1

    def remove(self, r: Reservation) -> None:
        del self.by_rid[r.rid]
        leave_group(self.by_lease, r.lease_id, r.rid)
        if leave_group(self.by_start, r.start, r.rid):
            self.starts.remove(r.start)
        for t in (r.start, r.end):
            self.point_refs[t] -= 1
            if self.point_refs[t] == 0:
                del self.point_refs[t]
                self.points.remove(t)

    def starting_between(self, lo: float, hi: float) -> Iterator[Reservation]:
        for t in self.starts.between(lo, hi, include_lo=True):
            for rid in self.by_start[t]:
                yield self.by_rid[rid]


def join_group(groups: dict[G, tuple[int, ...]], key: G, rid: int) -> bool:
    """Add rid to its group; True when the group is new."""
    group: tuple[int, ...] = groups.get(key, ())
    groups[key] = (*group, rid)
    return not group


def leave_group(groups: dict[G, tuple[int, ...]], key: G, rid: int) -> bool:
    """Drop rid from its group, and the group once empty; True when the group went."""
    group = groups[key]
    i = group.index(rid)  # in C: a burst's reservations share one start, thousands to a group
    rest = group[:i] + group[i + 1 :]
    if rest:
        groups[key] = rest
        return False
    del groups[key]
    return True
