"""The slot table's node lines as flat numpy columns, so a question about every node at once (the verdicts of a
decision: each node's least free capacity over a window, and its free capacity at the window's start) is a few
array operations instead of a Python loop over the fleet (docs/capacity.md, "Building a report").

The columns are kept in step with the table in place: the table notes which nodes it wrote to (`dirty`), and only
their slots are rewritten; a decision changes a handful of nodes, so refreshing costs a few small writes, not a
pass over every line in Python nor a copy of every column.

PURE: no Django.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from leases.slots.lines import Line
from leases.slots.values import Vec

# cpu, memory, disk: the dimensions a verdict can name (vec indexes 0, 1, 2).
DIMS = 3
# Spare slots per node: a decision adds or removes a few breakpoints on a node (two per reservation); a node
# holding n breakpoints gets SPARE_SLOTS + n // SPARE_SHARE spare ones, so a busy node's line can grow for a
# while before more slots are spliced in after it (NodeArrays._grow).
SPARE_SLOTS = 2  # at least 1: a node's last segment ends at the spare slot's time, inf
SPARE_SHARE = 16
GROWN_SHARE = 4
WINDOWS = 32  # windows whose over() answers are kept between writes
BUSY_KEPT = 4  # instants whose busy_from() columns are kept current across writes

# Usage levels: cores in hundredths, memory in MiB, disk in GiB; a node's capacity is far below 2**31 of each.
LEVEL = np.int32
IntArray = npt.NDArray[np.int64]
LevelArray = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]


class NodeArrays:
    """Every node's step function as flat columns, node after node, in the table's node order.

    Node i owns slots off[i]..off[i+1]-1: its breakpoints first (`sizes[i]` of them: `times`, and the usage
    level on the segment each one begins in `levels`, one column per dimension), then at least one spare slot
    (time inf, levels zero), which no window meets. A segment ends at the next slot's time, so the spare slot
    after a node's last breakpoint ends its last segment at inf.

    A write that changes a node's line rewrites its slots in place, after inserting more when it outgrew them:
    most decisions copy no column of a 10,000-reservation table. A report reads these columns once per
    decision, usually cold (the planning pass before it evicted them from the CPU's caches), so they are kept
    narrow: 20 bytes a slot (a float64 time, int32 levels), not 48 with a column of next times and int64
    levels."""

    sizes: IntArray  # breakpoints per node
    off: IntArray  # node i's slots: off[i]..off[i+1]-1
    times: FloatArray
    levels: LevelArray
    _owner: IntArray  # the node of each slot

    def __init__(self, nodes: Sequence[int], caps: Mapping[int, Vec], lines: Mapping[int, Line]) -> None:
        self.nodes = np.array(nodes, dtype=np.int64)
        self.nodes.setflags(write=False)  # handed to every report as its node column (fleet/reports.py)
        self.pos = {n: i for i, n in enumerate(nodes)}
        self.caps: IntArray = np.array([caps[n][:DIMS] for n in nodes], dtype=np.int64).reshape(-1, DIMS)
        # over()'s answers per window until the next write: a pass's reports (one per decision, built after
        # every submit) ask the same few windows, "now" for each of a handful of durations, hundreds of times.
        self._windows: dict[tuple[float, float], tuple[LevelArray, LevelArray]] = {}
        # Answers other modules derive from these columns, kept by them under their own keys and dropped here at
        # the next write, as over()'s are (a pass's reports derive every node's verdicts for the same few shapes
        # and windows again and again: leases/scheduling/explain.py).
        self.derived: dict[Hashable, object] = {}
        # busy_from()'s columns per instant, the least recently asked first: rewritten row by row at each write.
        self._busy: dict[float, FloatArray] = {}
        self._layout([_columns(lines[n]) for n in nodes])

    def refresh(self, lines: Mapping[int, Line], dirty: Iterable[int]) -> None:
        """Rewrite the slots of the nodes written to since the last refresh, first giving more slots to a node
        whose line outgrew its own."""
        changed = sorted(self.pos[n] for n in dirty if n in self.pos)
        if not changed:
            return
        self._windows.clear()
        self.derived.clear()
        fresh = {i: _columns(lines[int(self.nodes[i])]) for i in changed}
        self._grow({i: len(piece[0]) for i, piece in fresh.items()})
        for i, (times, levels) in fresh.items():
            a, b, n = int(self.off[i]), int(self.off[i + 1]), len(times)
            self.times[a : a + n], self.levels[a : a + n] = times, levels
            self.times[a + n : b] = np.inf
            self.levels[a + n : b] = 0
            self.sizes[i] = n
        for t, column in self._busy.items():
            for i in changed:
                column[i] = self._busy_row(i, t)

    def _grow(self, sizes: Mapping[int, int]) -> None:
        """Spare slots inserted after each node whose line of `sizes[i]` breakpoints would leave it none: one
        concatenation per column for all of them (about 30 us at 1,000 nodes and 10,000 reservations), not the
        columns laid out again (2 ms) nor np.insert (0.4 ms for the levels alone), measured."""
        more = {
            # A node that outgrew its slots is being written to: it gets a quarter more than it holds, so it
            # grows again only after several more decisions (each growth copies every column).
            i: n + SPARE_SLOTS + n // GROWN_SHARE - int(self.off[i + 1] - self.off[i])
            for i, n in sizes.items()
            if n >= self.off[i + 1] - self.off[i]  # one slot stays spare: it ends the node's last segment
        }
        if not more:
            return
        at = [(int(self.off[i + 1]), k, i) for i, k in sorted(more.items())]
        self.times = _spliced(self.times, at, lambda k, i: np.full(k, np.inf))
        self.levels = _spliced(self.levels, at, lambda k, i: np.zeros((k, DIMS), dtype=LEVEL))
        self._owner = _spliced(self._owner, at, lambda k, i: np.full(k, i, dtype=self._owner.dtype))
        added = np.zeros(len(self.off), dtype=np.int64)
        added[[i + 1 for i in more]] = list(more.values())
        self.off += np.cumsum(added)

    def _layout(self, pieces: Sequence[tuple[FloatArray, LevelArray]]) -> None:
        """The columns from every node's own, each node given spare slots for the lines it will grow into."""
        self._allot(np.array([len(p[0]) for p in pieces], dtype=np.int64))
        # Where each breakpoint goes: its node's first slot, plus its place on the node's line.
        firsts = np.cumsum(self.sizes) - self.sizes
        at = np.arange(int(self.sizes.sum())) + np.repeat(self.off[:-1] - firsts, self.sizes)
        if len(at):
            self.times[at] = np.concatenate([p[0] for p in pieces])
            self.levels[at] = np.concatenate([p[1] for p in pieces])

    def _allot(self, sizes: IntArray) -> None:
        """Empty columns for lines of `sizes` breakpoints, each node with its spare slots."""
        self.sizes = sizes
        slots = sizes + SPARE_SLOTS + sizes // SPARE_SHARE
        self.off = np.zeros(len(slots) + 1, dtype=np.int64)
        np.cumsum(slots, out=self.off[1:])
        total = int(self.off[-1])
        self.times = np.full(total, np.inf)
        self.levels = np.zeros((total, DIMS), dtype=LEVEL)
        self._owner = np.repeat(np.arange(len(slots)), slots)

    def busy_from(self, t: float) -> FloatArray:
        """Per node, the first instant at or after t at which it uses anything (inf: never). A node is idle over
        [t, end) exactly when its figure is at least `end`, for any end, so the mapper's idle nodes for each
        duration a pass asks are one comparison, not a gather over every slot after every write
        (`~peak_over(t, end).any(axis=1)`, which it equals: tests/leases/test_host_order.py). Kept per instant
        and rewritten only for the rows a write changes; read-only for the caller."""
        got = self._busy.pop(t, None)
        if got is None:
            got = self._busy_all(t)
            if len(self._busy) >= BUSY_KEPT:
                del self._busy[next(iter(self._busy))]
        self._busy[t] = got  # the most recently asked last
        view = got.view()
        view.setflags(write=False)
        return view

    def _busy_all(self, t: float) -> FloatArray:
        out = np.full(len(self.sizes), np.inf)
        times = self.times
        mask = np.zeros(len(times), dtype=bool)
        if len(times) > 1:  # a segment using something that ends after t (a spare slot uses nothing)
            np.logical_and(self.levels[:-1].any(axis=1), times[1:] > t, out=mask[:-1])
        picked = np.flatnonzero(mask)
        if len(picked):
            owners = self._owner[picked]
            first = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
            out[owners[first]] = np.maximum(times[picked[first]], t)
        return out

    def _busy_row(self, i: int, t: float) -> float:
        a, n = int(self.off[i]), int(self.sizes[i])
        if not n:
            return math.inf
        times = self.times[a : a + n + 1]  # the slot after the last breakpoint (spare) ends its segment
        busy = self.levels[a : a + n].any(axis=1) & (times[1:] > t)
        k = int(busy.argmax())
        return max(float(times[k]), t) if busy[k] else math.inf

    def earliest_fits(self, lims: IntArray, dims: Sequence[int], duration: float, after: float) -> FloatArray:
        """Per node, `SlotTable.earliest_fit` for every node at once: the earliest t >= after at which usage stays
        within `lims[i]` (a row per node, as `room_limit` gives it) in each of `dims` over [t, t + duration);
        inf where it never does. The counter-offers ask it of the whole fleet (leases/scheduling/deciding.py):
        a Python walk of every node's line cost 30-40 ms at 1,000 nodes and 150 reservations each.

        Each node's free runs for a limit are kept until the next write (`derived`), so a search that moves its
        start along asks only a comparison per run."""
        runs = self._free_runs(lims, dims)
        owner, begin, end, prefix = runs
        eff = np.maximum(begin, after)
        # [eff, eff + duration) inside the run; a zero-length window needs the instant eff itself.
        fit = np.flatnonzero((eff + duration <= end) & (eff < end))
        out = np.full(len(self.sizes), np.inf)
        if len(fit):
            owners = owner[fit]
            first = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
            out[owners[first]] = eff[fit[first]]
        # The free stretch before a node's first breakpoint, when its first segment has no room: it comes first.
        out[(after + duration <= prefix) & (after < prefix)] = after
        return out

    def _free_runs(
        self, lims: IntArray, dims: Sequence[int]
    ) -> tuple[IntArray, FloatArray, FloatArray, FloatArray]:
        """The maximal runs of segments with room within `lims`, node after node in time order: their node, start
        (-inf for a run from a node's first breakpoint: nothing is used before it) and end (inf: the run reaches
        past the last breakpoint); and per node, the end of the free stretch before its first breakpoint when
        that breakpoint begins a run of its own (-inf otherwise: no separate stretch)."""
        key = ("free_runs", lims.tobytes(), tuple(dims))
        got = self.derived.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        owner, times = self._owner, self.times
        ok = np.ones(len(times), dtype=bool)
        for d in dims:
            ok &= self.levels[:, d] <= lims[owner, d]
        firsts = self.off[:-1]
        opens = ok.copy()
        opens[1:] &= ~ok[:-1]
        opens[firsts] = ok[firsts]  # every node begins afresh: its first slot opens a run when it has room
        at = np.flatnonzero(opens)
        # Each run stops at the next slot without room, if that is still its node's (the last slot stands in).
        closed = np.append(np.flatnonzero(~ok), len(times) - 1)
        stop = closed[np.searchsorted(closed, at)]
        run_owner = owner[at]
        end = np.where((stop < self.off[run_owner + 1]) & ~ok[stop], times[stop], np.inf)
        begin = np.where(at == firsts[run_owner], -np.inf, times[at])
        prefix = np.where(ok[firsts], -np.inf, times[firsts])
        got = (run_owner, begin, end, prefix)
        self.derived[key] = got
        return got

    def peak_over(self, start: float, end: float) -> LevelArray:
        """Per node and dimension, the highest usage at any instant of [start, end) (end > start): what
        `SlotTable.free_over_vec` subtracts from the capacity."""
        return self.over(start, end)[0]

    def level_at(self, t: float) -> LevelArray:
        """Per node and dimension, the usage at instant t (the segment holding t; zero outside every segment)."""
        return self._per_node(self._meeting(t, t, np.nextafter(t, np.inf)), np.add)

    def over(self, start: float, end: float) -> tuple[LevelArray, LevelArray]:
        """`peak_over(start, end)` and `level_at(start)` from one gather (end > start): a node's first segment
        meeting the window holds `start` unless the node's line begins later. Read-only arrays, kept until the
        next refresh: the same window asked again is answered without a gather."""
        got = self._windows.get((start, end))
        if got is not None:
            return got
        # In the levels' own type: a scatter converting each row to int64 cost as much as the reduction.
        peak = np.zeros((len(self.sizes), DIMS), dtype=LEVEL)
        at_start = np.zeros((len(self.sizes), DIMS), dtype=LEVEL)
        picked = np.flatnonzero(self._meeting(start, end, end))
        if len(picked):
            owners = self._owner[picked]
            first = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
            levels = np.take(self.levels, picked, axis=0)  # a third of fancy indexing's time, measured
            peak[owners[first]] = np.maximum.reduceat(levels, first, axis=0)
            holding = self.times[picked[first]] <= start
            at_start[owners[first[holding]]] = levels[first[holding]]
        peak.setflags(write=False)
        at_start.setflags(write=False)
        if len(self._windows) >= WINDOWS:
            self._windows.clear()
        self._windows[(start, end)] = (peak, at_start)
        return peak, at_start

    def _meeting(self, start: float, end: float, before: float) -> npt.NDArray[np.bool_]:
        """The slots whose segment begins before `before` and ends after `start`: [start, end) with before = end
        (end > start), the instant t with start = end = t and before just after t."""
        times = self.times
        mask = np.zeros(len(times), dtype=bool)
        if len(times) > 1:
            np.logical_and(times[:-1] < before, times[1:] > start, out=mask[:-1])
        return mask

    def _per_node(self, mask: npt.NDArray[np.bool_], op: np.ufunc) -> LevelArray:
        """`op` over the segments in `mask`, per node (zero for a node with none: usage is never negative). Only
        the masked segments are gathered: a window meets a small part of a busy table."""
        out = np.zeros((len(self.sizes), DIMS), dtype=LEVEL)
        picked = np.flatnonzero(mask)
        if len(picked):
            owners = self._owner[picked]
            first = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
            out[owners[first]] = op.reduceat(np.take(self.levels, picked, axis=0), first, axis=0)
        return out


def _spliced(
    column: npt.NDArray, at: Sequence[tuple[int, int, int]], filler: Callable[[int, int], npt.NDArray]
) -> npt.NDArray:
    """`column` with `filler(k, i)` inserted before position p, for each (p, k, i) of `at` (p ascending)."""
    pieces, last = [], 0
    for p, k, i in at:
        pieces += [column[last:p], filler(k, i)]
        last = p
    pieces.append(column[last:])
    return np.concatenate(pieces)


def _columns(line: Line) -> tuple[FloatArray, LevelArray]:
    times = np.array(line.times, dtype=np.float64)
    levels = np.zeros((len(times), DIMS), dtype=LEVEL)
    for d in range(DIMS):
        if line.cols[d]:
            levels[:, d] = line.cols[d]
    return times, levels
