"""Room counts: how many copies of a unit fit on each node at an instant, kept across table changes.

PURE: no Django.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

from leases.slots.values import (
    Res,
)

_Count = Callable[[Iterable[int]], dict[int, int]]
# [total, {node: copies}, log position, set of nodes to recount, the nodes with a copy (None until asked for)]
_Entry = list[Any]


class RoomCounts:
    """Per instant and unit: how many copies of the unit fit on each node, and their total, kept across table
    changes by recounting only the nodes a change touched.

    The scheduler asks "could this lease start at t at all" for every queued lease at every event; summing
    over all 144 Blue Horizon nodes each time, after every change had wiped the answers, was the top of the
    30-day replay's profile (docs/benchmarks/replay.md). The counts come from the caller (`count(nodes)` -> {node:
    copies}), so this knows nothing about resources; the caller says which nodes a change touched and which instants
    are over.
    """

    # Touched nodes go to a log rather than into every entry: with hundreds of live (instant, unit) entries,
    # marking each entry at every table change cost more than the recounts (docs/benchmarks/replay.md). An
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
            entry = self._entries[key] = [sum(per.values()), per, end, set(), None]
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
            roomy = entry[4]
            if roomy is not None:
                for node, copies in fresh.items():
                    if copies > 0:
                        roomy.add(node)
                    else:
                        roomy.discard(node)
            dirty.clear()
        return entry

    def total(self, t: float, unit: Res, nodes: Iterable[int], count: _Count) -> int:
        """The sum of the counts over `nodes` (the same nodes every time until `clear`)."""
        return int(self._current(t, unit, nodes, count)[0])

    def counts(self, t: float, unit: Res, nodes: Iterable[int], count: _Count) -> dict[int, int]:
        """Per node, its count, up to date; the caller must not change the dict."""
        per: dict[int, int] = self._current(t, unit, nodes, count)[1]
        return per

    def with_room(self, t: float, unit: Res, nodes: Iterable[int], count: _Count) -> set[int]:
        """The nodes whose count is above zero, up to date; the caller must not change the set. Kept once asked
        for, each change reading only the nodes it touched: on a busy fleet few nodes have room, and finding them
        among all the counts read every node's count for every lease that queues (docs/benchmarks/burst.md,
        "Placement reports stored as text")."""
        entry = self._current(t, unit, nodes, count)
        if entry[4] is None:
            entry[4] = {node for node, copies in entry[1].items() if copies > 0}
        roomy: set[int] = entry[4]
        return roomy

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
