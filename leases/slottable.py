"""The slot table: every reservation of node capacity over time, and the questions asked of it.

This module owns resource tuples (`Res`), reservations (`Reservation`, half-open `[start, end)`), and
`SlotTable`, which answers "how much is used / free on this node at t", "does this need fit on [a, b)",
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
import operator
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice, repeat
from typing import Any, ClassVar, TypeVar

_Vec = tuple[int, int, int, int, int]
_ZERO_VEC: _Vec = (0, 0, 0, 0, 0)
_G = TypeVar("_G", int, float)


@dataclass(frozen=True, slots=True)
class Res:
    """A resource tuple: cpu in percent of one core, mem in MiB, disk in GiB, net_in / net_out in Mbit/s."""

    cpu: int = 0
    mem: int = 0
    disk: int = 0
    net_in: int = 0
    net_out: int = 0

    ZERO: ClassVar[Res]

    def __add__(self, o: Res) -> Res:
        return Res(
            self.cpu + o.cpu,
            self.mem + o.mem,
            self.disk + o.disk,
            self.net_in + o.net_in,
            self.net_out + o.net_out,
        )

    def __sub__(self, o: Res) -> Res:
        return Res(
            self.cpu - o.cpu,
            self.mem - o.mem,
            self.disk - o.disk,
            self.net_in - o.net_in,
            self.net_out - o.net_out,
        )

    def fits_in(self, capacity: Res) -> bool:
        return (
            self.cpu <= capacity.cpu
            and self.mem <= capacity.mem
            and self.disk <= capacity.disk
            and self.net_in <= capacity.net_in
            and self.net_out <= capacity.net_out
        )

    def scaled(self, k: int) -> Res:
        return Res(self.cpu * k, self.mem * k, self.disk * k, self.net_in * k, self.net_out * k)


Res.ZERO = Res()


def _vec(r: Res) -> _Vec:
    return (r.cpu, r.mem, r.disk, r.net_in, r.net_out)


def _res(v: _Vec) -> Res:
    return Res(*v)


def _minus(a: _Vec, b: _Vec) -> _Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3], a[4] - b[4])


def _plus(a: _Vec, b: _Vec) -> _Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def _lowest(a: _Vec, b: _Vec) -> _Vec:
    return (min(a[0], b[0]), min(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]), min(a[4], b[4]))


@dataclass(frozen=True, slots=True)
class Reservation:
    """One row of the slot table: a lease's use of some nodes over the half-open interval [start, end)."""

    rid: int
    lease_id: int
    kind: str
    start: float
    end: float
    alloc: Mapping[int, Res] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.end >= self.start:
            raise ValueError(f"reservation {self.rid} ends ({self.end}) before it starts ({self.start})")
        # Copy the mapping: a caller mutating its own dict after `add` would otherwise change what `remove`
        # subtracts, and the node's step function would drift away from its reservations for good.
        object.__setattr__(self, "alloc", dict(self.alloc))

    def overlaps(self, start: float, end: float) -> bool:
        """Shares an instant with [start, end); a zero-length window [t, t) asks "is it running at t"."""
        if start == end:
            return self.start <= start < self.end
        if self.start == self.end:
            return start <= self.start < end
        return self.start < end and self.end > start


class Overcommit(Exception):
    """Adding a reservation would use more than a node's capacity at some instant."""

    def __init__(self, node: int, instant: float, need: Res, available: Res) -> None:
        super().__init__(f"node {node} at t={instant}: needs {need}, only {available} available")
        self.node = node
        self.instant = instant
        self.need = need
        self.available = available


@lru_cache(maxsize=1024)
def _nonzero(use: _Vec) -> tuple[int, ...]:
    """The dimensions a use vector writes to."""
    return tuple(d for d in range(5) if use[d])


@lru_cache(maxsize=256)
def _wants(unit: Res) -> tuple[tuple[int, int], ...]:
    """(dimension, amount) for every resource the unit asks for."""
    return tuple((d, a) for d, a in enumerate(_vec(unit)) if a > 0)


@lru_cache(maxsize=4096)  # few distinct (capacity, need) pairs, asked for every node of every mapping
def _limit(capacity: _Vec, need: Res) -> tuple[_Vec, tuple[int, ...]] | None:
    """The highest usage level that still leaves room for `need`, and the dimensions worth checking.

    Only dimensions where the need is positive can block it, because `add` never lets a level exceed capacity;
    checking two of five components is what keeps the segment walks fast. None when the need exceeds the
    capacity outright, so callers answer "never" without walking anything.
    """
    nv = _vec(need)
    lim = (
        capacity[0] - nv[0],
        capacity[1] - nv[1],
        capacity[2] - nv[2],
        capacity[3] - nv[3],
        capacity[4] - nv[4],
    )
    dims = tuple(d for d in range(5) if nv[d] > 0)
    if any(lim[d] < 0 for d in dims):
        return None
    return lim, dims


class _Line:
    """One node's usage as a step function, one column per resource.

    `cols[d][k]` is the usage of resource d on [times[k], times[k+1]); before times[0] and after times[-1] usage
    is zero. Columns rather than a tuple per segment let the questions below run over list slices with `max`,
    `map` and `bytes.find`, in C: a Python loop over segments made a whole-node earliest_fit over 300 segments
    cost ~360 us at p99 (bench/bench_slottable.py). `refs[k]` counts the reservation starts and ends at
    times[k], so a breakpoint goes with its last reservation and removed history never slows a walk.

    A column no reservation has used yet is kept empty rather than as zeros (`live` lists the kept ones):
    on most fleets disk and network stay at zero, and keeping five columns in step on every write was the
    largest cost of the 30-day replay (docs/BENCHMARKS.md). An empty column reads as zero everywhere.
    """

    __slots__ = ("cols", "live", "live_cols", "refs", "rids", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cols: tuple[list[int], ...] = ([], [], [], [], [])
        self.live: list[int] = []  # the columns kept in step with times, in ascending order
        self.live_cols: list[list[int]] = []  # those columns themselves
        self.refs: list[int] = []
        self.rids: set[int] = set()

    def clone(self) -> _Line:
        other = _Line()
        other.times = self.times.copy()
        other.cols = tuple(col.copy() for col in self.cols)
        other.live = self.live.copy()
        other.live_cols = [other.cols[d] for d in other.live]
        other.refs = self.refs.copy()
        other.rids = self.rids.copy()
        return other

    def level(self, k: int) -> _Vec:
        if k < 0:
            return _ZERO_VEC
        c0, c1, c2, c3, c4 = self.cols
        return (
            c0[k] if c0 else 0,
            c1[k] if c1 else 0,
            c2[k] if c2 else 0,
            c3[k] if c3 else 0,
            c4[k] if c4 else 0,
        )

    def level_at(self, t: float) -> _Vec:
        return self.level(bisect_right(self.times, t) - 1)

    def first_segment(self, t: float) -> int:
        """The index of the segment holding t, or 0 when t lies before every breakpoint (in the zero prefix)."""
        return max(bisect_right(self.times, t) - 1, 0)

    def has_room(self, start: float, end: float, lim: _Vec, dims: tuple[int, ...]) -> bool:
        """Whether every segment meeting [start, end) stays within lim (end > start)."""
        k, j = self.first_segment(start), bisect_left(self.times, end)
        cols = self.cols
        return all(max(cols[d][k:j], default=0) <= lim[d] for d in dims)

    def room(self, k: int, j: int | None, lim: _Vec, dims: tuple[int, ...]) -> bytes:
        """One byte per segment k..j-1 (k.. when j is None): 1 where its level leaves room within lim."""
        flags: Iterator[bool] | None = None
        for d in dims:
            col = self.cols[d]
            if not col:
                continue  # zero everywhere, and lim[d] >= 0 for every dimension a need asks for (_limit)
            ok = map(lim[d].__ge__, col[k:j])
            flags = ok if flags is None else map(operator.and_, flags, ok)
        return b"\x01" * len(self.times[k:j]) if flags is None else bytes(flags)

    def segments(self, start: float, end: float) -> Iterator[tuple[float, float, _Vec]]:
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

    def _materialise(self, use: _Vec) -> None:
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
        use: _Vec,
        dims: tuple[int, ...] | None = None,
        cap: _Vec | None = None,
    ) -> bool:
        """Count the reservation's two endpoints (a new breakpoint continues the level before it) and raise the
        level by `use` on [start, end): one pass, with the bisections shared. `dims`: use's non-zero dimensions.

        With `cap`, first check that `use` fits under it on every segment meeting [start, end) (as `holds`),
        and write nothing and answer False when it does not."""
        if dims is None:
            dims = _nonzero(use)
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
        self, rid: int, start: float, end: float, use: _Vec, dims: tuple[int, ...] | None = None
    ) -> None:
        if dims is None:
            dims = _nonzero(use)
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


_CHUNK = 512
_NEAR = 16


class _SortedFloats:
    """Distinct floats in order, kept in chunks of at most 2 * _CHUNK.

    One flat sorted list of 150,000 reservation times made every add and remove move the whole list: ~40 us
    of memmove per insort and a 4.5 ms p99 for add+remove (bench/bench_slottable.py). Chunks bound each move
    to about a thousand items.
    """

    __slots__ = ("_chunks", "_maxes")

    def __init__(self) -> None:
        self._chunks: list[list[float]] = []
        self._maxes: list[float] = []

    def clone(self) -> _SortedFloats:
        other = _SortedFloats()
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
        if len(chunk) > 2 * _CHUNK:
            chunks[k : k + 1] = [chunk[:_CHUNK], chunk[_CHUNK:]]
            maxes[k : k + 1] = [chunk[_CHUNK - 1], chunk[-1]]

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


class _Index:
    """The table-wide lookups: reservations by id, by lease and by start, and every distinct start or end."""

    __slots__ = ("by_lease", "by_rid", "by_start", "longest", "point_refs", "points", "starts")

    def __init__(self) -> None:
        self.by_rid: dict[int, Reservation] = {}
        # Groups are tuples, not sets, so that clone() is a shallow copy: deep-copying 150,000 sets made the
        # first write to a copy of a full table take ~0.5 s (bench/bench_slottable.py).
        self.by_lease: dict[int, tuple[int, ...]] = {}
        self.by_start: dict[float, tuple[int, ...]] = {}
        self.starts = _SortedFloats()
        self.point_refs: dict[float, int] = {}
        self.points = _SortedFloats()
        # An upper bound on any reservation's length (it never shrinks), so a window query only has to look at
        # starts in [lo - longest, hi] instead of at every reservation.
        self.longest = 0.0

    def clone(self) -> _Index:
        other = _Index()
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
        _join(self.by_lease, r.lease_id, r.rid)
        if _join(self.by_start, r.start, r.rid):
            self.starts.add(r.start)
        self.longest = max(self.longest, r.end - r.start)
        for t in (r.start, r.end):
            refs = self.point_refs.get(t, 0)
            if refs == 0:
                self.points.add(t)
            self.point_refs[t] = refs + 1

    def remove(self, r: Reservation) -> None:
        del self.by_rid[r.rid]
        _leave(self.by_lease, r.lease_id, r.rid)
        if _leave(self.by_start, r.start, r.rid):
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


def _join(groups: dict[_G, tuple[int, ...]], key: _G, rid: int) -> bool:
    """Add rid to its group; True when the group is new."""
    group: tuple[int, ...] = groups.get(key, ())
    groups[key] = (*group, rid)
    return not group


def _leave(groups: dict[_G, tuple[int, ...]], key: _G, rid: int) -> bool:
    """Drop rid from its group, and the group once empty; True when the group went."""
    rest = tuple(x for x in groups[key] if x != rid)
    if rest:
        groups[key] = rest
        return False
    del groups[key]
    return True


class SlotTable:
    """Reservations over time on a fixed set of nodes, never overcommitted at any instant."""

    def __init__(self, capacities: Mapping[int, Res]) -> None:
        self._caps: dict[int, _Vec] = {n: _vec(c) for n, c in capacities.items()}
        self.nodes: tuple[int, ...] = tuple(sorted(self._caps))
        self._lines: dict[int, _Line] = {n: _Line() for n in self.nodes}
        self._owned: set[int] = set(self.nodes)
        self._index = _Index()
        self._index_owned = True
        # The whole fleet's usage as one step function: "is there room for n copies at t" has a one-bisection
        # upper bound (total_free_at), which rules out most candidate instants without looking at any node.
        self._total = _Line()
        self._total_owned = True
        self._total_cap: _Vec = _ZERO_VEC
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
        return _res(self._cap(node))

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
        return _res(_minus(self._total_cap, self._total.level_at(t)))

    def copies_at(self, node: int, unit: Res, t: float) -> int:
        """How many copies of `unit` fit on the node at t (1 << 30 for a unit asking nothing)."""
        self._cap(node)
        return self.copies_many((node,), unit, t)[node]

    def copies_many(self, nodes: Iterable[int], unit: Res, t: float) -> dict[int, int]:
        """copies_at for many nodes in one loop, building no Res: the scheduler asks this for every node at
        every candidate instant, and as a call per node it was the top of the 30-day replay's profile."""
        wants = _wants(unit)
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
        for d, want in _wants(unit):
            c = (cap[d] - level[d]) // want
            if c < best:
                best = c
        return best if best > 0 else 0

    def used_at(self, node: int, t: float) -> Res:
        return _res(self._line(node).level_at(t))

    def available_at(self, node: int, t: float) -> Res:
        return _res(_minus(self._cap(node), self._line(node).level_at(t)))

    def fits(self, node: int, need: Res, start: float, end: float) -> bool:
        """Need fits for all of [start, end); on a zero-length interval, whether it fits at start."""
        _check_interval(start, end)
        limit = _limit(self._cap(node), need)
        if limit is None:
            return False
        line = self._line(node)
        if end == start:
            level = line.level_at(start)
            return all(level[d] <= limit[0][d] for d in limit[1])
        return line.has_room(start, end, *limit)

    def fits_until(self, node: int, need: Res, start: float) -> float:
        """The latest t' with need fitting on [start, t'); start if it does not fit then; inf if forever."""
        limit = _limit(self._cap(node), need)
        if limit is None:
            return start
        line = self._line(node)
        k = line.first_segment(start)
        # Look at the next few segments first: most answers lie there, and flagging the whole future of a
        # busy node costs ~4x more at the median (bench/bench_slottable.py).
        for j in (k + _NEAR, None):
            blocked = line.room(k, j, *limit).find(0)
            if blocked >= 0:
                return max(line.times[k + blocked], start)
        return math.inf

    def earliest_fit(self, node: int, need: Res, duration: float, after: float) -> float | None:
        """The earliest t >= after with need fitting on [t, t + duration); None if it never fits there."""
        if duration < 0:
            raise ValueError(f"negative duration {duration}")
        limit = _limit(self._cap(node), need)
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

    def blockers(self, node: int, need: Res, start: float, end: float) -> list[Reservation]:
        """The reservations that keep `need` from fitting on [start, end), for messages such as
        "reserved 13:30-14:00 by lease 7"; empty when it fits. A need larger than the node blames no one."""
        _check_interval(start, end)
        limit = _limit(self._cap(node), need)
        if limit is None:
            return []
        lim, dims = limit
        line = self._line(node)
        culprits: dict[int, Reservation] = {}
        for seg_start, seg_end, level in line.segments(start, end):
            short = [d for d in dims if level[d] > lim[d]]
            if not short:
                continue
            for r in self.reservations(seg_start, seg_end, node=node):
                use = _vec(r.alloc[node])
                if any(use[d] > 0 for d in short):
                    culprits[r.rid] = r
        return sorted(culprits.values(), key=lambda r: (r.start, r.rid))

    def envelope(self, node: int, start: float) -> list[tuple[Res, float]]:
        """Haizea's ongoing availability from `start`: (available, until) pairs, non-increasing per resource.

        An entry starts only when some resource drops below every earlier entry; rises are ignored, so the
        entry covering t is the minimum availability over [start, t]. The last entry's until is inf.
        """
        cap = self._cap(node)
        line = self._line(node)
        pairs: list[tuple[Res, float]] = []
        current: _Vec | None = None
        for seg_start, _seg_end, level in line.segments(start, math.inf):
            free = _minus(cap, level)
            low = free if current is None else _lowest(current, free)
            if current is not None and low != current:
                pairs.append((_res(current), seg_start))
            current = low
        assert current is not None
        pairs.append((_res(current), math.inf))
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

    def add(self, r: Reservation) -> None:
        """Add a reservation, or raise Overcommit (and change nothing) if any node would exceed capacity."""
        if r.rid in self._index.by_rid:
            raise ValueError(f"reservation {r.rid} is already in the table")
        # Vectors once, and the room check straight on the columns: a replay adds ~200,000 node rows, and going
        # through fits() (a Res per node, a cached-limit lookup) was a fifth of the 30-day replay's time.
        # Each node is checked and written in one step; a node without room undoes the ones written before it.
        total = _ZERO_VEC
        rid, start, end = r.rid, r.start, r.end
        done: list[tuple[int, _Vec]] = []
        for node, use in r.alloc.items():
            v = _vec(use)
            cap = self._cap(node)
            if min(v) < 0 or not self._writable_line(node).add(rid, start, end, v, _nonzero(v), cap):
                for n, w in done:
                    self._lines[n].remove(rid, start, end, w, _nonzero(w))
                if min(v) < 0:
                    raise ValueError(f"negative use {_res(v)} on node {node}")
                instant = max(start, self.fits_until(node, _res(v), start))
                raise Overcommit(node, instant, _res(v), self.available_at(node, instant))
            done.append((node, v))
            total = _plus(total, v)
        self._writable_total().add(rid, start, end, total)
        self._writable_index().add(r)

    def remove(self, rid: int) -> Reservation:
        r = self._index.by_rid[rid]
        total = _ZERO_VEC
        start, end = r.start, r.end
        for node, use in r.alloc.items():
            v = _vec(use)
            self._writable_line(node).remove(rid, start, end, v, _nonzero(v))
            total = _plus(total, v)
        self._writable_total().remove(rid, r.start, r.end, total)
        self._writable_index().remove(r)
        return r

    def replace(self, r: Reservation) -> None:
        """Swap the reservation with r.rid for r; if r is refused the old one stays, so nothing is lost."""
        old = self.remove(r.rid)
        try:
            self.add(r)
        except Exception:
            self.add(old)
            raise

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
        return other

    # -- internals -----------------------------------------------------------------------------------------

    def _cap(self, node: int) -> _Vec:
        try:
            return self._caps[node]
        except KeyError:
            raise KeyError(f"node {node} is not in the slot table") from None

    def _line(self, node: int) -> _Line:
        self._cap(node)
        return self._lines[node]

    def _writable_line(self, node: int) -> _Line:
        if node not in self._owned:
            self._lines[node] = self._lines[node].clone()
            self._owned.add(node)
        return self._lines[node]

    def _writable_total(self) -> _Line:
        if not self._total_owned:
            self._total = self._total.clone()
            self._total_owned = True
        return self._total

    def _writable_index(self) -> _Index:
        if not self._index_owned:
            self._index = self._index.clone()
            self._index_owned = True
        return self._index


def _check_interval(start: float, end: float) -> None:
    if end < start:
        raise ValueError(f"interval ends ({end}) before it starts ({start})")


_Count = Callable[[Iterable[int]], dict[int, int]]
_Entry = list[Any]  # [total, {node: copies}, log position, set of nodes to recount]


class RoomCounts:
    """Per instant and unit: how many copies of the unit fit on each node, and their total, kept across table
    changes by recounting only the nodes a change touched.

    The scheduler asks "could this lease start at t at all" for every queued lease at every event; summing
    over all 144 Blue Horizon nodes each time, after every change had wiped the answers, was the top of the
    30-day replay's profile (docs/BENCHMARKS.md). The counts come from the caller (`count(nodes)` -> {node: copies}), so this
    knows nothing about resources; the caller says which nodes a change touched and which instants are over.
    """

    # Touched nodes go to a log rather than into every entry: with hundreds of live (instant, unit) entries,
    # marking each entry at every table change cost more than the recounts (docs/BENCHMARKS.md, replay). An
    # entry remembers how far into the log it is up to date and reads the rest when it is next asked.
    __slots__ = ("_base", "_entries", "_log")

    _LOG_LIMIT = 8192

    def __init__(self) -> None:
        # (t, unit) -> [total, {node: copies}, log position it is current to, nodes to recount on the next ask]
        self._entries: dict[tuple[float, Res], _Entry] = {}
        self._log: list[int] = []
        self._base = 0  # the log position of self._log[0]

    def _current(self, t: float, unit: Res, nodes: Iterable[int], count: _Count) -> _Entry:
        key = (t, unit)
        end = self._base + len(self._log)
        entry = self._entries.get(key)
        if entry is None:
            per = count(nodes)
            entry = self._entries[key] = [sum(per.values()), per, end, set()]
            return entry
        per, pos, dirty = entry[1], entry[2], entry[3]
        if pos < end:
            dirty.update(self._log[pos - self._base :])
            dirty.intersection_update(per)
            entry[2] = end
        if dirty:
            fresh = count(dirty)
            entry[0] += sum(fresh.values()) - sum(per[n] for n in dirty)
            per.update(fresh)
            dirty.clear()
        return entry

    def total(self, t: float, unit: Res, nodes: Iterable[int], count: _Count) -> int:
        """The sum of the counts over `nodes` (the same nodes every time until `clear`)."""
        return int(self._current(t, unit, nodes, count)[0])

    def counts(self, t: float, unit: Res, nodes: Iterable[int], count: _Count) -> dict[int, int]:
        """Per node, its count, up to date; the caller must not change the dict."""
        per: dict[int, int] = self._current(t, unit, nodes, count)[1]
        return per

    def subtotal(self, t: float, unit: Res, nodes: Iterable[int], only: Iterable[int], count: _Count) -> int:
        """The sum of the counts over the nodes of `only` that are among `nodes`."""
        per = self._current(t, unit, nodes, count)[1]
        return sum(map(per.get, only, repeat(0)))

    def knows(self, t: float, unit: Res) -> bool:
        """Whether the counts for (t, unit) are kept (asked before, and not forgotten since)."""
        return (t, unit) in self._entries

    def touch(self, nodes: Iterable[int]) -> None:
        self._log.extend(nodes)
        if len(self._log) > self._LOG_LIMIT:
            # Hand the log to the entries that have not read it yet, as nodes to recount, and start afresh.
            end = self._base + len(self._log)
            for entry in self._entries.values():
                if entry[2] < end:
                    entry[3].update(self._log[entry[2] - self._base :])
                    entry[3].intersection_update(entry[1])
                    entry[2] = end
            self._log.clear()
            self._base = end

    def forget_before(self, t: float) -> None:
        for key in [k for k in self._entries if k[0] < t]:
            del self._entries[key]
        if not self._entries:
            self._base += len(self._log)
            self._log.clear()

    def clear(self) -> None:
        self._entries.clear()
        self._base += len(self._log)
        self._log.clear()
