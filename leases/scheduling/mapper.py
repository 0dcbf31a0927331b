"""The greedy mapper (SEMANTICS §4.1, §4.2): which nodes a lease's vnodes go to at an instant, in host-policy order,
and the cheap bounds that let a long queue skip most mapping attempts.

PURE: no Django.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import fields
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from leases.scheduling.book import PlanBook
from leases.scheduling.records import (
    IMMEDIATE,
    LeaseRequest,
)
from leases.slots.arrays import DIMS, NodeArrays
from leases.slots.values import vec
from leases.slottable import Res, SlotTable

ONE_CPU = Res(cpu=1)
EMPTY = Res()  # a node's share before any vnode is mapped to it (compared by identity)
_NONE: dict = {}  # read-only: no extra use, no group members (no dict built per mapping attempt)
# From this many nodes on, the host order is handed out lazily (HostOrder); below it sorting them all is cheap.
LAZY_NODES = 256
# Score columns (Summaries) kept per start, the least recently used dropped first.
SUMMARIES = 4
# Summaries kept per node (Mapper._summary), each for the span of instants it holds over.
VIEWS_KEPT = 8
# Answers kept on the slot table's columns between writes (NodeArrays.derived) past which the idle nodes' lists
# clear them all.
IDLE_KEPT = 256


class Mapper(PlanBook):
    _extra_memo: tuple[Mapping[int, Res], NodeArrays, npt.NDArray[np.int64]] | None = None
    _headroom_memo: tuple[Mapping[int, float], NodeArrays, npt.NDArray[np.float64]] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per node: live idle CPU in percent (the placer's headroom), handed in by `observe`; none in replay.
        self._headroom: Mapping[int, float] = {}
        # Every node's score summary at one start as columns (Summaries), per start, and the starts asked for once.
        self._summaries: OrderedDict[float, Summaries] = OrderedDict()
        self._asked_at: OrderedDict[float, None] = OrderedDict()

    def _touch(self, nodes: Iterable[int]) -> None:
        nodes = tuple(nodes)
        super()._touch(nodes)
        # The columns are stale exactly where the per-node summaries are (PlanBook._touch drops those).
        for kept in self._summaries.values():
            kept.dirty.update(nodes)

    def _packs(self, vnodes: tuple[Res, ...]) -> bool:
        # Memoised here rather than only by packs' lru_cache, whose key hashed all 144 nodes' capacities at
        # every submission.
        got = self._packs_memo.get(vnodes)
        if got is None:
            got = self._packs_memo[vnodes] = packs(vnodes, self._fleet)
        return got

    def _counter(self, unit: Res, t: float) -> Callable[[Iterable[int]], dict[int, int]]:
        return lambda nodes: self.table.copies_many(nodes, unit, t)

    def _usable_nodes(self) -> Sequence[int]:
        """The table's nodes less the exclusions in force. Asked at every room count, and a live fleet always has
        some node excluded (draining, stale, dead): the list is built once per set of exclusions, not once per
        ask (a queue pass asked it for every queued lease at every future instant: 85 µs each at 1,000 nodes,
        10 s of a 15-request profile with 20 leases queued)."""
        excluded = self._excluded
        if not excluded:
            return self.table.nodes  # no list to build in the common case
        nodes = self.table.nodes
        got = self._usable_memo
        if got is None or got[0] is not excluded or got[1] != len(excluded) or got[2] is not nodes:
            got = self._usable_memo = (
                excluded,
                len(excluded),
                nodes,
                [n for n in nodes if n not in excluded],
            )
        return got[3]

    def _order_of(self, req: LeaseRequest) -> list[int]:
        """size_order of the lease's vnodes, memoised: every mapping attempt asked for it afresh."""
        got = self._orders.get(req.id)
        if got is None:
            got = self._orders[req.id] = size_order(req.vnodes)
        return got

    def _barred_of(self, req: LeaseRequest) -> frozenset[int]:
        got = self._barred.get(req.id)
        if got is None:
            got = self._barred[req.id] = frozenset(n for n, _ in req.barred)
        return got

    def _ruled_out(self, req: LeaseRequest) -> Set[int]:
        """The nodes `req` may not be mapped to: this pass's exclusions and the request's barred nodes."""
        return self._excluded.keys() | self._barred_of(req) if req.barred else self._excluded.keys()

    def _smallest_of(self, req: LeaseRequest) -> Res:
        got = self._smallest.get(req.id)
        if got is None:
            got = self._smallest[req.id] = smallest(req.vnodes)
        return got

    def _map(
        self,
        table: SlotTable,
        req: LeaseRequest,
        start: float,
        end: float,
        strict: bool,
        only: set[int] | None,
    ) -> tuple[dict[int, int], float] | None:
        """Pack vnodes (largest first) onto nodes in host-policy order; without `strict` the window may shrink.

        Returns (vnode -> node, end of the window found), or None."""
        if self._by_slots(table, req, start, only):
            return self._map_spread(req, start, end)
        order = self._order_of(req)
        mapping: dict[int, int] = {}
        latest = end
        i = 0
        # Work that starts now must also fit what the node is observed to use beyond the plan (the now-gate).
        extra = self._now_extra if start <= self._now else _NONE
        taken = dict(req.taken) if req.taken else _NONE
        for node in self._host_order(table, req, start, end - start, only):
            need = EMPTY
            cap = self._capacity[node]
            seen = extra.get(node)
            allowed = len(order) if req.spread is None else req.spread - taken.get(node, 0)
            placed = 0
            while i < len(order) and placed < allowed:
                vnode = req.vnodes[order[i] - 1]
                trial = need + vnode if need is not EMPTY else vnode
                checked = trial + seen if seen is not None else trial
                # More than the node holds when empty never fits: fits_until would answer `start` (a full
                # node's second VM, every time a wide lease is mapped).
                until = self._fits_until(table, node, checked, start) if checked.fits_in(cap) else start
                if until < latest:
                    if strict or until <= start:
                        break
                    latest = until
                need = trial
                mapping[order[i]] = node
                i += 1
                placed += 1
            if i == len(order):
                return mapping, latest
        return None

    def _by_slots(self, table: SlotTable, req: LeaseRequest, start: float, only: set[int] | None) -> bool:
        """Whether `req` is placed by free slots (SchedulerConfig.rank_by_slots): live work that runs now, whole."""
        return (
            self.config.rank_by_slots
            and req.type == IMMEDIATE
            and table is self.table
            and only is None
            and start <= self._now
        )

    def _free_over(self, start: float, end: float) -> npt.NDArray[np.int64]:
        """Every node's free cpu, memory and disk over [start, end) (the least it has at any instant of it), less
        the now-gate's observed use when the window starts now: the figures a verdict is judged by."""
        arr = self.table.arrays()
        peak, _ = arr.over(start, end) if end > start else (arr.level_at(start), None)
        free = arr.caps - peak
        if start <= self._now and self._now_extra:
            free = free - self._extra_columns(arr)
        return free

    def _spread_limits(self, req: LeaseRequest, arr: NodeArrays) -> npt.NDArray[np.int64]:
        """Per row, how many of the lease's VMs it may take: 0 on excluded and barred nodes, the group's spread
        less its members there, else the VM count."""
        count = len(req.vnodes)
        limit = np.full(len(arr.nodes), count if req.spread is None else min(req.spread, count), np.int64)
        ruled = self._ruled_out(req)
        if ruled:
            rows = [arr.pos[n] for n in ruled if n in arr.pos]
            limit[rows] = 0
        if req.spread is not None:
            for n, k in req.taken:
                if n in arr.pos:
                    row = arr.pos[n]
                    limit[row] = max(0, min(limit[row], req.spread - k))
        return limit

    def headroom_column(self, arr: NodeArrays) -> npt.NDArray[np.float64]:
        """The live headroom (idle CPU %) of every row, 0 where unknown, built once per observation."""
        got = self._headroom_memo
        if got is not None and got[0] is self._headroom and got[1] is arr:
            return got[2]
        column = np.fromiter(
            (self._headroom.get(n, 0.0) for n in arr.nodes.tolist()), np.float64, len(arr.nodes)
        )
        self._headroom_memo = (self._headroom, arr, column)
        return column

    def slots_order(self, req: LeaseRequest, start: float, end: float) -> list[int]:
        """The nodes that can take one of the lease's largest VMs over [start, end), in the placer's rank (seed
        001): nodes a soft rule avoids last, then the most free slots, then the most live headroom, then the
        lowest id."""
        arr = self.table.arrays()
        need = np.array(vec(self._largest_of(req))[:DIMS], dtype=np.int64)
        copies = _copies(self._free_over(start, end), need)
        copies[self._spread_limits(req, arr) == 0] = 0
        rows = np.flatnonzero(copies > 0)
        keys = [arr.nodes[rows], -self.headroom_column(arr)[rows], -copies[rows]]
        if req.avoid:
            keys.append(np.fromiter((n in req.avoid for n in arr.nodes[rows].tolist()), bool, len(rows)))
        return arr.nodes[rows[np.lexsort(keys)]].tolist()

    def _map_spread(self, req: LeaseRequest, start: float, end: float) -> tuple[dict[int, int], float] | None:
        """Seed 001's greedy placement over the slot table: each VM, largest first, to the node with the most free
        slots for it as the VMs before it left them (so a lease spreads instead of stacking), then the most live
        headroom, then the lowest id; nodes a soft rule avoids only when no other can take it. Strict: the whole
        window, or None. `slots_order` is the same ranking for the first VM, which the verdicts show."""
        arr = self.table.arrays()
        free = self._free_over(start, end).copy()
        limit = self._spread_limits(req, arr)
        headroom = self.headroom_column(arr)
        avoided = (
            np.fromiter((n in req.avoid for n in arr.nodes.tolist()), bool, len(arr.nodes))
            if req.avoid
            else None
        )
        mapping: dict[int, int] = {}
        for v in self._order_of(req):
            need = np.array(vec(req.vnodes[v - 1])[:DIMS], dtype=np.int64)
            copies = _copies(free, need)
            copies[limit <= 0] = 0
            fit = np.flatnonzero(copies > 0)
            if not len(fit):
                return None
            keys = [arr.nodes[fit], -headroom[fit], -copies[fit]]
            if avoided is not None:
                keys.append(avoided[fit])
            row = int(fit[np.lexsort(keys)[0]])
            free[row] -= need
            limit[row] -= 1
            mapping[v] = int(arr.nodes[row])
        return mapping, end

    def _largest_of(self, req: LeaseRequest) -> Res:
        return req.vnodes[self._order_of(req)[0] - 1]

    def _extra_columns(self, arr: NodeArrays) -> npt.NDArray[np.int64]:
        """The now-gate's extra use as a column per dimension, built once per observation."""
        got = self._extra_memo
        if got is not None and got[0] is self._now_extra and got[1] is arr:
            return got[2]  # given by `observe`, or built by an earlier call for the same observation
        extra = np.zeros((len(arr.nodes), DIMS), dtype=np.int64)
        seen = [(arr.pos[n], r) for n, r in self._now_extra.items() if n in arr.pos]
        if seen:
            rows = [i for i, _ in seen]
            for d, name in enumerate(("cpu", "mem", "disk")):
                extra[rows, d] = np.fromiter((getattr(r, name) for _, r in seen), np.int64, len(seen))
        self._extra_memo = (self._now_extra, arr, extra)
        return extra

    def _check_fixed(
        self,
        table: SlotTable,
        req: LeaseRequest,
        fixed: dict[int, int],
        start: float,
        end: float,
        strict: bool,
    ) -> tuple[dict[int, int], float] | None:
        per_node: dict[int, Res] = {}
        for v, n in fixed.items():
            if n in self._excluded:
                return None
            use = req.vnodes[v - 1]
            per_node[n] = per_node[n] + use if n in per_node else use  # no Res built for a one-VM node
        latest = min(min(self._fits_until(table, n, need, start) for n, need in per_node.items()), end)
        if latest <= start or (strict and latest < end):
            return None
        return dict(fixed), latest

    def _fits_until(self, table: SlotTable, node: int, need: Res, start: float) -> float:
        if table is not self.table:
            return table.fits_until(node, need, start)
        memo = self._fit_memo.get(node)
        if memo is None:
            memo = self._fit_memo[node] = {}
        until = memo.get((need, start))
        if until is None:
            until = memo[(need, start)] = table.fits_until(node, need, start)
        return until

    def _host_order(
        self, table: SlotTable, req: LeaseRequest, start: float, duration: float, only: set[int] | None
    ) -> Iterable[int]:
        """The nodes to try for `req` at `start`, in host-policy order. On a large fleet, for the live table, the
        order is handed out as the mapper consumes it (HostOrder); the same order either way."""
        if self._by_slots(table, req, start, only):
            ranked = self.slots_order(req, start, start + duration)
            self._last_order = (req, start, duration, ranked)
            return ranked
        lazy = (
            table is self.table
            and only is None
            and not req.avoid
            and duration > 0
            and len(table.nodes) >= LAZY_NODES
            and self.config.policy_host_selection != "no-policy"
        )
        nodes: Iterable[int] = (
            HostOrder(self, req, start, duration)
            if lazy
            else self._sorted_hosts(table, req, start, duration, only)
        )
        if table is self.table and only is None:
            self._last_order = (req, start, duration, nodes)
        return nodes

    def _sorted_hosts(
        self, table: SlotTable, req: LeaseRequest, start: float, duration: float, only: set[int] | None
    ) -> list[int]:
        nodes = [n for n in table.nodes if n not in self._excluded and (only is None or n in only)]
        if req.barred:
            barred = self._barred_of(req)
            nodes = [n for n in nodes if n not in barred]
        if self.config.policy_host_selection == "no-policy":
            return nodes
        # A node where not even the smallest vnode fits at `start` can take nothing, so it is left out before
        # scoring: on a busy fleet this skips most of the per-node work of every mapping attempt.
        smallest = self._smallest_of(req)
        if table is self.table:
            # The room counts of _could_start already say, per node, how many smallest vnodes fit at `start`.
            per = self._room.counts(start, smallest, self._usable_nodes(), self._counter(smallest, start))
            nodes = [n for n in nodes if per[n] > 0]
        else:
            nodes = [n for n in nodes if smallest.fits_in(table.available_at(n, start))]

        if table is self.table:
            columns = self._summary_columns(start)
            if columns is not None:
                return columns.order(self, nodes, start, duration, req.avoid)

        def score(node: int) -> float:
            leases, change = (
                self._summary(node, start) if table is self.table else summary(table, node, start)
            )
            return host_score(leases, change, start, duration)

        if req.avoid:
            return sorted(nodes, key=lambda n: (n in req.avoid, -score(n)))
        return sorted(nodes, key=lambda n: -score(n))

    def _summary_columns(self, start: float) -> Summaries | None:
        """Every node's score summary at `start` on the live table, as columns kept current across mapping attempts
        and reports (Summaries); None the first time a start is asked for, when scoring the nodes with room is
        cheaper than building columns for all of them."""
        got = self._summaries.get(start)
        if got is None:
            if not _asked_before(self._asked_at, start, 4 * SUMMARIES):
                return None
            if len(self._summaries) >= SUMMARIES:
                self._summaries.popitem(last=False)
            got = self._summaries[start] = Summaries(self, start)
        else:
            self._summaries.move_to_end(start)
        return got

    def _order_used(self, req: LeaseRequest, start: float, duration: float) -> Iterable[int] | None:
        """The host order the mapper last tried for this very request over this window, if that was the last
        order it built: a report ranks nodes in the order that was actually used."""
        got = self._last_order
        if got is not None and got[0] is req and got[1] == start and got[2] == duration:
            return got[3]
        return None

    def _summary(self, node: int, t: float) -> tuple[int, float]:
        spans = self._views.get(node)
        if spans is None:
            spans = self._views[node] = []
        else:
            for got in reversed(spans):
                if got[0] <= t < got[1]:
                    return got[2], got[3]
        leases, change, _ = summary_span(self.table, node, t)
        # The answer holds for every t' in [t, change): the node's usage and lease set stay what they are at t
        # until `change`, so the count is the same and the first change after t' is still `change`.
        if len(spans) >= VIEWS_KEPT:
            del spans[0]
        spans.append((t, change, leases, change))
        return leases, change


def host_score(leases: int, change: float, start: float, duration: float) -> float:
    """Haizea's greedy host score (SEMANTICS §4.1) from a node's summary at `start`: fewer leases there, and a
    longer spell before the node changes, score higher; 1.0 at most. Summaries.order is its vectorised form."""
    crowd = (4 - min(leases, 4)) / 4
    steady = 1.0 if change == math.inf or duration <= 0 else min(1.0, (change - start) / duration)
    return 0.5 * crowd + 0.25 + 0.25 * steady


def _asked_before(asked: OrderedDict, key: Hashable, bound: int) -> bool:
    """Whether `key` was asked for before; if not, it is remembered (the oldest forgotten past `bound`). The kept
    score columns are built from a start's second ask on: most starts are asked once."""
    if key in asked:
        return True
    asked[key] = None
    if len(asked) > bound:
        asked.popitem(last=False)
    return False


class Summaries:
    """Every node of the live table's (leases there, next change) at one start, as numpy columns, and the nodes
    touched since (`dirty`, kept by Mapper._touch, the same writes that drop `_summary`'s memo): a batch of
    approvals shares its `now` and moves one vnode at a time, so two nodes are read again per approval instead of
    scoring every node in Python for every host order (most of an approval's report, measured).

    The score is Mapper._score's arithmetic, term for term and in the same order, over the columns, so it is the
    same float; sorting by it is stable, so ties keep node order, as `sorted` keeps them."""

    def __init__(self, mapper: Mapper, start: float) -> None:
        self.start = start
        self.nodes = list(mapper.table.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self.ids = np.asarray(self.nodes, dtype=np.int64)
        self.leases = np.zeros(len(self.nodes), dtype=np.int64)
        self.change = np.zeros(len(self.nodes), dtype=np.float64)
        self.dirty: set[int] = set(self.nodes)

    def current(self, mapper: Mapper, nodes: Iterable[int]) -> None:
        """Reads again the summaries of `nodes` touched since they were read (or never read): a batch of approvals
        excludes the dead nodes, which are then never read at all."""
        dirty = self.dirty
        if not dirty:
            return
        stale = dirty.intersection(nodes)
        for node in stale:
            i = self.pos[node]
            self.leases[i], self.change[i] = mapper._summary(node, self.start)
        dirty -= stale

    def order(
        self, mapper: Mapper, nodes: Sequence[int], start: float, duration: float, avoid: Iterable[int]
    ) -> list[int]:
        """`nodes` sorted by descending score (then, with `avoid`, the avoided ones after the others)."""
        if not nodes:
            return []
        self.current(mapper, nodes)
        rows = np.fromiter(map(self.pos.__getitem__, nodes), np.int64, len(nodes))
        key = self._keys(rows, start, duration)
        if avoid:
            avoided = set(avoid)
            ranked = np.lexsort((key, np.fromiter((n in avoided for n in nodes), bool, len(nodes))))
        else:
            ranked = np.argsort(key, kind="stable")
        picked = np.asarray(nodes, dtype=np.int64)[ranked]
        return picked.tolist()

    def order_of(self, mapper: Mapper, nodes: Set[int], start: float, duration: float) -> list[int]:
        """The set `nodes` in the order `order` gives them listed in the table's node order: sorted by row in
        numpy rather than by position in Python (HostOrder._rest asks this for every lease that maps past the idle
        nodes, with hundreds of nodes with room early in a burst)."""
        if not nodes:
            return []
        self.current(mapper, nodes)
        rows = np.fromiter(map(self.pos.__getitem__, nodes), np.int64, len(nodes))
        rows.sort()
        picked = self.ids[rows[np.argsort(self._keys(rows, start, duration), kind="stable")]]
        return picked.tolist()

    def _keys(self, rows: npt.NDArray[np.int64], start: float, duration: float) -> npt.NDArray[np.float64]:
        crowd = (4 - np.minimum(self.leases[rows], 4)) / 4
        if duration <= 0:
            steady: npt.NDArray[np.float64] | float = 1.0
        else:
            # inf - start is inf, and min(1, inf) is 1: the same as `change == inf` answering 1.
            steady = np.minimum(1.0, (self.change[rows] - start) / duration)
        key: npt.NDArray[np.float64] = -(0.5 * crowd + 0.25 + 0.25 * steady)
        return key


class HostOrder:
    """`Mapper._sorted_hosts`'s order, produced as it is consumed.

    A node with nothing reserved over the whole window [start, start + duration) scores 1.0, the most any node
    can (no lease there now, nothing changing within the window), and every other node scores less (a lease
    there now caps it at 0.875; an empty node that changes within the window scores 0.75 plus less than 0.25).
    The sort is stable, so these idle nodes lead the order in node order. They are found in one vectorised pass
    over the slot table's columns (leases/slots/arrays.py) and handed out one by one; only if the mapper wants
    more are the others taken: the nodes with room, ordered by the score columns kept for the start across
    mapping attempts (`Summaries`: a batch of submissions shares its `now`), which read again only the nodes
    written to since. A burst on a large fleet places most leases on idle nodes, and scoring every node for every
    mapping attempt was four-fifths of the pure cost of a submission (docs/benchmarks/burst.md and mapper.md). The
    columns are kept per start, not per window: a ranking kept per (start, duration) was built again for every
    duration a burst asks for (docs/benchmarks/burst.md, the fifteenth session).

    Every reservation uses some cpu, memory or disk on each of its nodes (a VM always does), so "nothing
    reserved" and "no use in those three" are the same; tests/leases/test_host_order.py checks the two orders
    agree on random plans."""

    def __init__(self, mapper: Mapper, req: LeaseRequest, start: float, duration: float) -> None:
        self._mapper, self._req, self._start, self._duration = mapper, req, start, duration
        # The order handed out so far: the idle nodes that lead it (all found at once, on the first ask), then
        # the rest as `_rest` yields them.
        self._given: list[int] = []
        self._leading: list[int] | None = None
        self._lead: set[int] = set()
        self._rest_of: Iterator[int] | None = None

    def tried(self) -> list[int]:
        """The nodes handed out so far, and the rest of the idle ones that lead the order (found without scoring
        anything): all of the order a report can rank without doing the mapper's work again."""
        lead = self._lead_nodes()
        if len(self._given) < len(lead):  # still among the leading nodes: the rest of them, as a slice
            self._given.extend(lead[len(self._given) :])
        return list(self._given)

    def __iter__(self) -> Iterator[int]:
        i = 0
        while True:
            if i == len(self._given) and not self._hand_out():
                return
            yield self._given[i]
            i += 1

    def _hand_out(self) -> bool:
        """One more node of the order onto `_given`; False when there are no more."""
        lead = self._lead_nodes()
        if len(self._given) < len(lead):
            self._given.append(lead[len(self._given)])
            return True
        if self._rest_of is None:
            self._rest_of = self._rest()
        node = next(self._rest_of, None)
        if node is None:
            return False
        self._given.append(node)
        return True

    def _lead_nodes(self) -> list[int]:
        if self._leading is None:
            self._leading = self._idle()
            self._lead.update(self._leading)  # read by _rest only, which runs once these are all handed out
        return self._leading

    def _idle(self) -> list[int]:
        m, req, start, duration = self._mapper, self._req, self._start, self._duration
        arrays = m.table.arrays()
        smallest = m._smallest_of(req)
        # Kept on the columns until the next write, for the exclusions in force (by identity and size, as
        # Mapper._usable_nodes keeps its list): a pass's reports, written against a table that no longer changes,
        # ask for the same few (start, duration, smallest vnode) hundreds of times. Read-only for the caller.
        excluded = m._excluded
        key = ("idle", start, duration, smallest, m._barred_of(req) if req.barred else None)
        kept = arrays.derived.get(key)
        if isinstance(kept, tuple) and kept[0] is excluded and kept[1] == len(excluded):
            return kept[2]
        lead = self._idle_nodes(arrays, smallest)
        if len(arrays.derived) >= IDLE_KEPT:  # a quiet table asked about at every new `now` (previews)
            arrays.derived.clear()
        arrays.derived[key] = (excluded, len(excluded), lead)
        return lead

    def _idle_nodes(self, arrays: NodeArrays, smallest: Res) -> list[int]:
        m, req, start, duration = self._mapper, self._req, self._start, self._duration
        # Idle over the window and, empty, large enough for the smallest vnode in the columns' dimensions (cpu,
        # memory, disk), both over the whole fleet at once: a report lists every such node, and testing each one
        # in Python was about 7 % of a submission's CPU in a burst on an empty fleet (docs/benchmarks/burst.md, the
        # eighth session's "In the pass").
        idle = arrays.busy_from(start) >= start + duration
        idle &= (arrays.caps >= np.array((smallest.cpu, smallest.mem, smallest.disk), np.int64)).all(axis=1)
        skipped = m._ruled_out(req)
        nodes = arrays.nodes[idle]
        if skipped:
            nodes = nodes[~np.isin(nodes, np.fromiter(skipped, np.int64, len(skipped)))]
        lead = nodes.tolist()
        if smallest.net_in or smallest.net_out:  # the dimensions the columns leave out, when asked for at all
            lead = [node for node in lead if smallest.fits_in(m._capacity[node])]
        return lead

    def _rest(self) -> Iterator[int]:
        m, req, start, duration = self._mapper, self._req, self._start, self._duration
        columns = m._summary_columns(start)
        if columns is None:
            for node in m._sorted_hosts(m.table, req, start, duration, None):
                if node not in self._lead:
                    yield node
            return
        # The nodes _sorted_hosts would sort (usable nodes where the smallest vnode fits at `start`, from the
        # same kept room counts), less the idle ones already handed out, in the table's node order, then ordered
        # by the kept score columns: the same order without scoring a node that was not written to. On a busy
        # fleet few nodes have room (none once it is full, as for every lease a burst queues), and only those
        # are read.
        barred = m._barred_of(req) if req.barred else frozenset()
        smallest = m._smallest_of(req)
        with_room = m._room.with_room(start, smallest, m._usable_nodes(), m._counter(smallest, start))
        nodes = with_room - self._lead
        if barred:
            nodes -= barred
        yield from columns.order_of(m, nodes, start, duration)


def _copies(free: npt.NDArray[np.int64], need: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per row, how many VMs of `need` its free figures hold (every dimension the VM asks for)."""
    out = np.full(len(free), np.iinfo(np.int64).max, dtype=np.int64)
    for d in range(DIMS):
        if need[d] > 0:
            np.minimum(out, np.maximum(free[:, d], 0) // need[d], out=out)
    return out


def size_order(vnodes: Sequence[Res]) -> list[int]:
    """vnode numbers (1..n), largest first by Haizea's normalised size; ties keep vnode order."""
    names = [f.name for f in fields(Res)]
    peaks = {n: max(getattr(v, n) for v in vnodes) for n in names}

    def size(v: Res) -> float:
        return sum(getattr(v, n) / peaks[n] for n in names if peaks[n])

    return sorted(range(1, len(vnodes) + 1), key=lambda i: -size(vnodes[i - 1]))


@lru_cache(maxsize=4096)
def smallest(vnodes: tuple[Res, ...]) -> Res:
    """The component-wise minimum of a lease's vnodes: no vnode can go where this does not fit."""
    return Res(*(min(getattr(v, f.name) for v in vnodes) for f in fields(Res)))


@lru_cache(maxsize=1024)  # a trace asks the same few shapes again and again; each check is O(vnodes x nodes)
def packs(vnodes: tuple[Res, ...], capacities: tuple[Res, ...]) -> bool:
    """First-fit, largest first, into empty nodes: a lease failing this could never run, and queueing it
    would keep a replay (or the live queue) waiting forever."""
    free = list(capacities)
    for v in size_order(vnodes):
        need = vnodes[v - 1]
        slot = next((i for i, f in enumerate(free) if need.fits_in(f)), None)
        if slot is None:
            return False
        free[slot] = free[slot] - need
    return True


def summary(table: SlotTable, node: int, t: float) -> tuple[int, float]:
    """At t on a node: how many leases are there, and when its availability or lease set next changes."""
    leases, change, _ = summary_span(table, node, t)
    return leases, change


def summary_span(table: SlotTable, node: int, t: float) -> tuple[int, float, float]:
    """summary, plus the node's next reservation start or end after t: the answer holds until then."""
    rows = [(r.start, r.end, r.lease_id, r.alloc[node]) for r in table.reservations(start=t, node=node)]

    def state_at(x: float) -> tuple[Res, frozenset[int]]:
        used = Res()
        leases: set[int] = set()
        for a, b, lid, use in rows:
            if a <= x < b:
                used = used + use
                leases.add(lid)
        return used, frozenset(leases)

    now = state_at(t)
    # Back-to-back reservations of one lease with the same use (a VM and its shutdown) are one span, as in
    # Haizea's availability window, so only a real change of availability or of lease set counts.
    points = sorted({p for a, b, _, _ in rows for p in (a, b) if p > t})
    # A sweep keeps the lease set at each point from the starts and ends there; where it differs from the one at t,
    # the state differs, and only where it is the same is the use summed again (state_at). Summing at every point
    # was quadratic in the node's reservations, and a bulk approval asks it of every node it ranks.
    count: dict[int, int] = {}
    for a, b, lid, _ in rows:
        if a <= t < b:
            count[lid] = count.get(lid, 0) + 1
    edges: dict[float, list[tuple[int, int]]] = {}
    for a, b, lid, _ in rows:
        if a >= b:
            continue  # never running (a <= x < b holds nowhere)
        if a > t:
            edges.setdefault(a, []).append((lid, 1))
        if b > t:
            edges.setdefault(b, []).append((lid, -1))
    present = {lid for lid, n in count.items() if n}
    change = math.inf
    for x in points:
        for lid, step in edges.get(x, ()):
            n = count[lid] = count.get(lid, 0) + step
            if n:
                present.add(lid)
            else:
                present.discard(lid)
        if present != now[1] or state_at(x) != now:
            change = x
            break
    return len(now[1]), change, points[0] if points else math.inf
