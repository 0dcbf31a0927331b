"""The slot table's node lines as flat numpy columns, so a question about every node at once (the verdicts of a
decision: each node's least free capacity over a window, and its free capacity at the window's start) is a few
array operations instead of a Python loop over the fleet (docs/capacity.md, "Building a report").

The columns are kept in step with the table by splicing: the table notes which nodes it wrote to (`dirty`), and
only their segments are rebuilt; a decision changes a handful of nodes, so refreshing costs a copy of the arrays
in C, not a pass over every line in Python.

PURE: no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from leases.slots.lines import Line
from leases.slots.values import Vec

# cpu, memory, disk: the dimensions a verdict can name (vec indexes 0, 1, 2).
DIMS = 3

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class NodeArrays:
    """Every node's step function as flat columns, node after node, in the table's node order.

    For node i, points off[i]..off[i+1]-1 hold its breakpoints: `times`, the next breakpoint (`nexts`, inf after
    the last) and the usage level on that segment (`levels`, one column per dimension)."""

    def __init__(self, nodes: Sequence[int], caps: Mapping[int, Vec], lines: Mapping[int, Line]) -> None:
        self.nodes = np.asarray(nodes, dtype=np.int64)
        self.pos = {n: i for i, n in enumerate(nodes)}
        self.caps: IntArray = np.array([caps[n][:DIMS] for n in nodes], dtype=np.int64).reshape(-1, DIMS)
        pieces = [_columns(lines[n]) for n in nodes]
        self.sizes: IntArray = np.array([len(p[0]) for p in pieces], dtype=np.int64)
        self.times: FloatArray = np.concatenate([p[0] for p in pieces] or [np.zeros(0)])
        self.nexts: FloatArray = np.concatenate([p[1] for p in pieces] or [np.zeros(0)])
        self.levels: IntArray = np.concatenate([p[2] for p in pieces] or [np.zeros((0, DIMS), np.int64)])
        self._offsets()

    def refresh(self, lines: Mapping[int, Line], dirty: Iterable[int]) -> None:
        """Rebuild the segments of the nodes written to since the last refresh, in one splice per column."""
        changed = sorted(self.pos[n] for n in dirty if n in self.pos)
        if not changed:
            return
        parts: tuple[list[npt.NDArray], list[npt.NDArray], list[npt.NDArray]] = ([], [], [])
        at = 0
        for i in changed:
            a, b = int(self.off[i]), int(self.off[i + 1])
            new = _columns(lines[int(self.nodes[i])])
            for part, old, fresh in zip(parts, (self.times, self.nexts, self.levels), new, strict=True):
                part.append(old[at:a])
                part.append(fresh)
            self.sizes[i] = len(new[0])
            at = b
        for part, old in zip(parts, (self.times, self.nexts, self.levels), strict=True):
            part.append(old[at:])
        self.times = np.concatenate(parts[0])
        self.nexts = np.concatenate(parts[1])
        self.levels = np.concatenate(parts[2])
        self._offsets()

    def _offsets(self) -> None:
        self.off: IntArray = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.off[1:])
        self._owner = np.repeat(np.arange(len(self.sizes)), self.sizes)  # the node of each breakpoint

    def peak_over(self, start: float, end: float) -> IntArray:
        """Per node and dimension, the highest usage at any instant of [start, end) (end > start): what
        `SlotTable.free_over_vec` subtracts from the capacity."""
        return self._per_node((self.times < end) & (self.nexts > start), np.maximum)

    def level_at(self, t: float) -> IntArray:
        """Per node and dimension, the usage at instant t (the segment holding t; zero outside every segment)."""
        return self._per_node((self.times <= t) & (self.nexts > t), np.add)

    def over(self, start: float, end: float) -> tuple[IntArray, IntArray]:
        """`peak_over(start, end)` and `level_at(start)` from one gather (end > start): a node's first segment
        meeting the window holds `start` unless the node's line begins later."""
        peak = np.zeros((len(self.sizes), DIMS), dtype=np.int64)
        at_start = np.zeros((len(self.sizes), DIMS), dtype=np.int64)
        picked = np.flatnonzero((self.times < end) & (self.nexts > start))
        if len(picked):
            owners = self._owner[picked]
            first = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
            levels = self.levels[picked]
            peak[owners[first]] = np.maximum.reduceat(levels, first, axis=0)
            holding = self.times[picked[first]] <= start
            at_start[owners[first[holding]]] = levels[first[holding]]
        return peak, at_start

    def _per_node(self, mask: npt.NDArray[np.bool_], op: np.ufunc) -> IntArray:
        """`op` over the segments in `mask`, per node (zero for a node with none: usage is never negative). Only
        the masked segments are gathered: a window meets a small part of a busy table."""
        out = np.zeros((len(self.sizes), DIMS), dtype=np.int64)
        picked = np.flatnonzero(mask)
        if len(picked):
            owners = self._owner[picked]
            first = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
            out[owners[first]] = op.reduceat(self.levels[picked], first, axis=0)
        return out


def _columns(line: Line) -> tuple[FloatArray, FloatArray, IntArray]:
    times = np.array(line.times, dtype=np.float64)
    nexts = np.empty_like(times)
    if len(times):
        nexts[:-1] = times[1:]
        nexts[-1] = np.inf
    levels = np.zeros((len(times), DIMS), dtype=np.int64)
    for d in range(DIMS):
        if line.cols[d]:
            levels[:, d] = line.cols[d]
    return times, nexts, levels
