"""The whole fleet's usage as one step function (`Total`): what the slot table's fleet-wide upper bounds read
(SlotTable.total_free_at and the like), cheap to write and to copy however many reservations the table holds.

As a `Line`, every reservation's write moved every breakpoint after it and raised every level inside its window:
at 10,000 reservations (20,000 breakpoints) a write to the table cost about 200 us, of which the node's own line
took 4 (bench/bench_slottable.py, "the node line alone"), and a planning pass's copy of the table cloned all of
it again on its first write. Here a write is remembered as it is (`pending`) and the remembered writes are folded
into the steps in one numpy pass when there are enough of them; a point question reads the steps and adds the few
remembered writes covering it. The steps are never changed in place, so a copy shares them and copies only the
remembered writes.

PURE: no Django.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from leases.slots.values import ZERO_VEC, Vec

# Remembered writes are folded in when one more would pass this share of the steps (a fold costs about one numpy
# pass over the steps, a question one Python step per remembered write), within these bounds.
FOLD_PER_STEPS = 256
FOLD_MIN, FOLD_MAX = 8, 64


class Total:
    """`level_at(t)`: the summed usage at t, per resource; zero before every reservation and after them all.

    `times[k]` and `levels[k]` (five resources) give the level on [times[k], times[k+1]); `pending` holds writes
    not folded in yet, each (start, end, use) adding `use` on [start, end) (removals negative)."""

    __slots__ = ("levels", "pending", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.levels: list[list[int]] = []
        self.pending: list[tuple[float, float, Vec]] = []

    def clone(self) -> Total:
        other = Total.__new__(Total)
        other.times, other.levels = self.times, self.levels  # shared: a fold builds new lists
        other.pending = self.pending.copy()
        return other

    def add(self, start: float, end: float, use: Vec) -> None:
        self._write(start, end, use)

    def remove(self, start: float, end: float, use: Vec) -> None:
        self._write(start, end, (-use[0], -use[1], -use[2], -use[3], -use[4]))

    def level_at(self, t: float) -> Vec:
        k = bisect_right(self.times, t) - 1
        c0, c1, c2, c3, c4 = self.levels[k] if k >= 0 else ZERO_VEC
        for start, end, use in self.pending:
            if start <= t < end:
                c0, c1, c2, c3, c4 = c0 + use[0], c1 + use[1], c2 + use[2], c3 + use[3], c4 + use[4]
        return (c0, c1, c2, c3, c4)

    def cpu_at(self, t: float) -> int:
        """level_at(t)[0], building no tuple (asked before every queued lease is looked at)."""
        k = bisect_right(self.times, t) - 1
        cpu = self.levels[k][0] if k >= 0 else 0
        for start, end, use in self.pending:
            if start <= t < end:
                cpu += use[0]
        return cpu

    def _write(self, start: float, end: float, use: Vec) -> None:
        if end <= start or use == ZERO_VEC:
            return  # an instant raises no level
        self.pending.append((start, end, use))
        if len(self.pending) > min(FOLD_MAX, max(FOLD_MIN, len(self.times) // FOLD_PER_STEPS)):
            self._fold()

    def _fold(self) -> None:
        """The remembered writes folded into new steps: every breakpoint old and new, the old level at each plus
        the writes' running sum, and the breakpoints that change nothing dropped."""
        pending, self.pending = self.pending, []
        times = np.array(self.times, dtype=np.float64)
        levels = np.array(self.levels, dtype=np.int64).reshape(len(times), len(ZERO_VEC))
        at = np.array([p[0] for p in pending] + [p[1] for p in pending], dtype=np.float64)
        uses = np.array([p[2] for p in pending], dtype=np.int64)
        grid = np.union1d(times, at)
        level = np.zeros((len(grid), len(ZERO_VEC)), dtype=np.int64)
        if len(times):
            before = np.searchsorted(times, grid, side="right") - 1
            level[before >= 0] = levels[before[before >= 0]]
        delta = np.zeros_like(level)
        np.add.at(delta, np.searchsorted(grid, at), np.concatenate((uses, -uses)))
        level = level + np.cumsum(delta, axis=0)
        changes = np.ones(len(grid), dtype=bool)
        changes[0] = bool(level[0].any())
        changes[1:] = (level[1:] != level[:-1]).any(axis=1)
        self.times = grid[changes].tolist()
        self.levels = level[changes].tolist()
