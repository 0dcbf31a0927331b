"""Why each node can or cannot take a lease: the one verdict producer of every scheduler decision (submission,
the queue placing a lease later, a due reservation placed again, the what-if preview).

For a lease and its window, every node gets: how many of the lease's VMs it could hold there (`holds`, given the
others and the group spread), and when none, one reason code from the closed list in docs/capacity.md with the
figures behind it (the short dimension: need, free, allocatable) and the leases in the way. Ranks are the order
the mapper tried the nodes in. PURE: no Django; sentences are written where node names and zones are known
(fleet/reports.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat

import numpy as np
import numpy.typing as npt

from fleet.capacity import ReasonCode
from fleet.reports import BLOCKERS_NAMED, Columns, Verdict
from leases.scheduling.events import EventLoop
from leases.scheduling.mapper import HostOrder, size_order
from leases.scheduling.records import LeaseRequest
from leases.slots.arrays import DIMS
from leases.slots.values import vec
from leases.slottable import Res

# The dimensions a verdict can name, in the order they are checked: disk first (seed 001: a full disk fails every
# instance on the node), then memory, then cores. Indexes are the slot table's vector positions, which are also
# fleet/reports.DIMENSIONS' (cpu 0, memory 1, disk 2).
CHECK_ORDER = (2, 1, 0)
MEM = 1
DISK = 2
# Nodes whose blocking leases are named in a report (the ones closest to fitting first): naming them walks each
# node's reservations, and a report names at most five per node anyway.
BLOCKER_NODES = 8
# Capacity verdicts (one VM shape over one window) kept on the slot table's columns between writes, in bytes:
# each holds about 100 bytes a node (16 MiB is about 160 of them at 1,000 nodes; a pass of 500 requests asked
# for about 125), and all are dropped when they would hold more.
KEPT_VERDICT_BYTES = 16 << 20
UNBOUNDED = np.iinfo(np.int64).max
_R = ReasonCode
# The codes a verdict column indexes (fleet.reports.Columns), exclusions' own codes appended after them.
CODES: tuple[str, ...] = tuple(c.value for c in ReasonCode)
_CODE_AT = {c: i for i, c in enumerate(CODES)}
_NO_RANK = 0
MISSING = ReasonCode.MISSING_CAPABILITY.value


# One node's answer: the stored reports' own shape (fleet/reports.py).
NodeVerdict = Verdict


@dataclass(frozen=True)
class Explanation:
    start: float
    end: float
    vm: Res  # the largest VM, the one `holds` counts
    count: int
    columns: Columns  # every node's verdict, in node id order
    total: int = 0  # how many of its VMs the fleet holds, summed over the nodes
    holders: tuple[tuple[int, int], ...] = ()  # (node, holds) of the nodes holding most, at most five

    @property
    def verdicts(self) -> list[NodeVerdict]:
        return self.columns.verdicts()


class Explaining(EventLoop):
    _ruled_memo: tuple[Mapping[int, str], int, Mapping[int, int], _Ruled] | None = None

    def explain(
        self,
        req: LeaseRequest,
        start: float,
        end: float,
        *,
        chosen: Mapping[int, Res] | None = None,
        proposed: Sequence[int] = (),
        excluded: Mapping[int, str] | None = None,
        now: float | None = None,
    ) -> Explanation:
        """Every node's verdict for `req` over [start, end). `chosen`: what the lease itself holds per node when it
        was placed (added back, so its own nodes show what they held for it); `excluded`: the nodes ruled out
        before mapping, with "code: sentence" (default: the last pass's exclusions); `proposed`: the nodes a
        dry run would choose (marked, nothing added back).

        One pass over the whole fleet in numpy columns (leases/slots/arrays.py), not a loop per node: at 1,000
        nodes a loop cost most of a decision's report (docs/capacity.md)."""
        own = chosen or {}
        now = self._now if now is None else now
        ruled_out = self._excluded if excluded is None else excluded
        vm = _largest(req.vnodes)
        count = len(req.vnodes)
        table = self.table
        arr = table.arrays()
        pos = arr.pos
        size = len(table.nodes)
        cap = arr.caps
        need = np.array(vec(vm)[:DIMS], dtype=np.int64)
        wants = [d for d in CHECK_ORDER if need[d] > 0]
        allowed = count if req.spread is None else req.spread

        # Every node's capacity verdict as if the lease held nothing and no group member stood anywhere: kept on
        # the columns until the next write (a pass's reports ask the same few shapes over the same few windows
        # hundreds of times), then the rows that differ (the lease's own nodes, its group's) worked out again
        # one by one (_row_verdict, the same arithmetic for one row).
        extra = self._extra_columns(arr) if start <= now and self._now_extra else None
        key = ("verdicts", start, end, start <= now, vm)
        kept = arr.derived.get(key)
        if isinstance(kept, tuple) and kept[0] is extra:
            base: _Capacity = kept[1]
        else:
            peak, at_start = arr.over(start, end) if end > start else (arr.level_at(start),) * 2
            free = cap - peak
            free_now = cap - at_start if start <= now else None
            if extra is not None and free_now is not None:
                free -= extra
                free_now -= extra
            base = _Capacity.of(cap, free, free_now, need, wants, None)
            if len(arr.derived) >= max(8, KEPT_VERDICT_BYTES // (100 * max(size, 1))):
                arr.derived.clear()
            arr.derived[key] = (extra, base)  # with the now-gate's figures it was derived from, by identity
        most = min(count, allowed)  # on every node but the group's and the lease's own
        got = (
            base.copy(most)
            if most > 0
            else _Capacity.of(cap, base.free, base.free_now, need, wants, np.zeros(size, np.int64))
        )
        if own or (req.spread is not None and req.taken):
            # Per row in Python ints: a numpy call costs microseconds whatever its size, and these rows are few.
            limits = dict.fromkeys((pos[n] for n in own), most)
            if req.spread is not None:
                limits.update((pos[n], min(max(req.spread - k, 0), count)) for n, k in req.taken if n in pos)
            added = {pos[n]: vec(r)[:DIMS] for n, r in own.items()}
            needs = need.tolist()
            for row, limit in limits.items():
                free_row, now_row, back = base.free[row].tolist(), None, added.get(row)
                if base.free_now is not None:
                    now_row = base.free_now[row].tolist()
                if back is not None:
                    free_row = [f + b for f, b in zip(free_row, back, strict=True)]
                    now_row = None if now_row is None else [f + b for f, b in zip(now_row, back, strict=True)]
                got.set_row(row, _row_verdict(cap[row].tolist(), free_row, now_row, needs, wants, limit))
        # Seed 001's `slots`: how many VMs of this size each node could take over the window, whatever the lease's
        # own count (`holds` is bounded by it, and by the group's spread).
        slots = base.holds.copy()
        slots[base.too_small] = 0
        for row in got.rows_set:
            slots[row] = got.row_copies[row]
        holds, short, codes, capacity_short = got.holds, got.short, got.codes, got.capacity_short
        shown_free, shown_need, shown_cap = got.shown_free, got.shown_need, got.shown_cap
        too_small = got.too_small

        # The mapper's order: the nodes it chose first (it fills nodes in its order, so they led it), then the
        # rest in the order it tried them for this request. When it placed the lease before reaching the end of
        # a lazily built order (mapper.HostOrder), only the nodes it handed out and the idle nodes leading the
        # order are ranked: ranking the others would be the mapper's work done again, for nodes it never tried.
        # A dry run that would place the lease (a preview: `proposed`) is ranked the same way, so a preview and the
        # report of the same request placed rank the same nodes; ranking the rest was most of a preview's
        # verdicts at 1,000 nodes (every node scored at a `now` no pass had asked about). When it did not try
        # this window, the order it would try now.
        tried = self._order_used(req, start, end - start)
        if tried is None:
            tried = self._host_order(table, req, start, end - start, None)
        listed = tried.tried() if isinstance(tried, HostOrder) and (own or proposed) else list(tried)
        order = [*own, *(n for n in listed if n not in own)] if own else listed
        ranks = np.zeros(size, dtype=np.int64)
        if order:
            ranks[np.fromiter(map(pos.__getitem__, order), np.int64, len(order))] = np.arange(
                1, len(order) + 1
            )
        ranks[too_small] = _NO_RANK

        node_ids = list(table.nodes)
        # The exclusions (and the group's barred nodes) come first whatever the capacity says: the request's
        # barred nodes, then this pass's exclusions over them.
        notes = np.full(size, -1, dtype=np.int64)
        code_table: tuple[str, ...] = CODES
        texts: tuple[str, ...] = ()
        ruled = np.zeros(0, dtype=np.int64)
        # Seed 001's order, the first that holds: a missing capability, too small even when empty (what waiting
        # will not change comes first: a node both too small and draining is too small), then the node's state
        # (this pass's exclusions), then the group's rules, then capacity. Applied last to first, each over the
        # one before.
        lacking, grouped = _Ruled.of(req.barred, pos).split(MISSING)
        for reasons in (grouped.sparing(too_small), self._ruled(ruled_out, pos).sparing(too_small), lacking):
            if len(reasons.rows):
                code_table, texts, codes[reasons.rows], notes[reasons.rows] = reasons.joined(
                    code_table, texts
                )
                ruled = np.concatenate((ruled, reasons.rows))
        if len(ruled):
            holds[ruled], short[ruled], ranks[ruled], slots[ruled] = 0, MEM, _NO_RANK, 0
            shown_need[ruled], shown_free[ruled], shown_cap[ruled] = (
                need[MEM],
                cap[ruled, MEM],
                cap[ruled, MEM],
            )
            capacity_short[ruled] = False

        # The leases in the way, named for the nodes closest to fitting.
        blocking = np.flatnonzero(capacity_short & (short != DISK))
        blocking = blocking[np.lexsort((blocking, -shown_free[blocking]))][:BLOCKER_NODES]
        blockers: dict[int, tuple[int, ...]] = {}
        for i in blocking.tolist():
            # One more than a report names, in case the lease itself is among them.
            lids = table.blocking_leases(node_ids[i], vm, start, end, most=BLOCKERS_NAMED + 1)
            lids.discard(req.id)
            if lids:
                blockers[node_ids[i]] = tuple(sorted(lids)[:BLOCKERS_NAMED])

        # Who holds the most of it, for the summary: most VMs first, then the mapper's order.
        fit_at = np.flatnonzero(holds)
        top = fit_at[
            np.lexsort((fit_at, np.where(ranks[fit_at] > 0, ranks[fit_at], size + 1), -holds[fit_at]))
        ][:5]
        picked = set(own) or set(proposed)
        columns = Columns(
            node=arr.nodes,
            holds=holds,
            slots=slots,
            code=codes,
            codes=code_table,
            dim=short,
            need=shown_need,
            free=shown_free,
            allocatable=shown_cap,
            rank=ranks,
            chosen=sorted(n for n in picked if n in pos and holds[pos[n]]),
            blockers=blockers,
            note=notes,
            texts=texts,
        )
        holders = tuple((node_ids[i], int(holds[i])) for i in top.tolist())
        return Explanation(start, end, vm, count, columns, int(holds.sum()), holders)

    def shared_key(self, req: LeaseRequest, start: float, end: float) -> tuple | None:
        """A key under which `explain(req, start, end)`, with nothing chosen or proposed and the pass's exclusions
        and `now`, is the same for every request with the same key, for as long as the table, the exclusions and
        `now` stay as they are. A pass reports the requests it queued or rejected after its last decision, and a
        burst's queued leases share a few shapes and windows by the hundred.

        None when the answer also depends on the request itself: the host order the mapper last built was for
        this very request (a report ranks the order actually tried), or the request holds live reservations of
        its own (a report never names a lease among its own blockers)."""
        if self._order_used(req, start, end - start) is not None:
            return None
        rec = self.leases.get(req.id)
        if rec is not None and rec.chain():
            return None
        return (req.vnodes, req.spread, req.taken, req.avoid, req.barred, start, end)

    def _ruled(self, ruled_out: Mapping[int, str], pos: Mapping[int, int]) -> _Ruled:
        """`_Ruled.of` the exclusions, kept while they are the same mapping (by identity and size, as
        Mapper._usable_nodes keeps its list): a pass explains every decision against one set of exclusions, and
        reading a few hundred stale nodes' reasons again for each was a tenth of a burst's reports (measured)."""
        got = self._ruled_memo
        if got is None or got[0] is not ruled_out or got[1] != len(ruled_out) or got[2] is not pos:
            got = self._ruled_memo = (ruled_out, len(ruled_out), pos, _Ruled.of(ruled_out.items(), pos))
        return got[3]

    def propose(self, req: LeaseRequest, start: float, end: float, excluded: Mapping[int, str]) -> list[int]:
        """A dry run: the nodes the mapper would choose for `req` over [start, end) as the plan stands, in its
        order (empty when it fits nowhere). Nothing changes; `req.id` must not be a lease's."""
        self.use_exclusions(excluded)
        try:
            found = self._map(self.table, req, start, end, True, None)
        finally:
            for memo in (self._orders, self._smallest, self._barred):
                memo.pop(req.id, None)
        return list(dict.fromkeys(found[0][v] for v in sorted(found[0]))) if found else []


@dataclass
class _Capacity:
    """Every row's capacity verdict for one VM shape over one window: how many it holds, the short dimension and
    the figures shown for it, and the code (-1 when it holds some). `free` and `free_now` are what they were
    derived from, kept so that a few rows can be derived again with a lease's own share added back."""

    free: npt.NDArray[np.int64]
    free_now: npt.NDArray[np.int64] | None
    holds: npt.NDArray[np.int64]
    too_small: npt.NDArray[np.bool_]
    short: npt.NDArray[np.int64]
    capacity_short: npt.NDArray[np.bool_]
    shown_free: npt.NDArray[np.int64]
    shown_need: npt.NDArray[np.int64]
    shown_cap: npt.NDArray[np.int64]
    codes: npt.NDArray[np.int64]
    # The rows `set_row` worked out again, and how many VMs each holds with no bound (its `slots`).
    rows_set: list[int] = field(default_factory=list)
    row_copies: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        cap: npt.NDArray[np.int64],
        free: npt.NDArray[np.int64],
        free_now: npt.NDArray[np.int64] | None,
        need: npt.NDArray[np.int64],
        wants: list[int],
        allowed: npt.NDArray[np.int64] | None,
    ) -> _Capacity:
        """`allowed`: per row, the most of the lease's VMs it may hold (its VM count, or fewer for the group's
        spread less the members there); None: no bound, the copies that fit (`copy` bounds them);
        `free_now`: free at the window's start when it starts now, else None."""
        size = len(cap)
        holds = _copies(free, need, wants, UNBOUNDED)
        too_small = np.zeros(size, dtype=bool)
        for d in wants:
            too_small |= cap[:, d] < need[d]
        if allowed is None:
            anti = np.zeros(size, dtype=bool)
            holds[too_small] = 0
        else:
            anti = (holds > 0) & (allowed == 0) & ~too_small
            holds = np.where(too_small, 0, np.minimum(holds, allowed))

        # The short dimension: the first of disk, memory, cores falling short (of capacity when too small, else
        # of the free figure); memory where nothing falls short.
        short = np.full(size, MEM, dtype=np.int64)
        settled = np.zeros(size, dtype=bool)
        for d in wants:
            falls = np.where(too_small, cap[:, d], free[:, d]) < need[d]
            short = np.where(falls & ~settled, d, short)
            settled |= falls
        fit = holds > 0
        capacity_short = ~fit & ~too_small & ~anti
        short = np.where(fit | anti, MEM, short)
        rows = np.arange(size)
        shown_free = np.where(too_small, cap[rows, short], free[rows, short])

        # Why a node with no room has none: its disk, busy now (when the window starts now), else reservations.
        busy_now = (
            _copies(free_now, need, wants, 1) == 0 if free_now is not None else np.zeros(size, dtype=bool)
        )
        codes = np.full(size, -1, dtype=np.int64)
        codes[too_small] = _CODE_AT[_R.TOO_SMALL]
        codes[anti] = _CODE_AT[_R.ANTI_AFFINITY]
        codes[capacity_short & (short == DISK)] = _CODE_AT[_R.NO_DISK]
        codes[capacity_short & (short != DISK) & busy_now] = _CODE_AT[_R.AT_CAPACITY]
        codes[capacity_short & (short != DISK) & ~busy_now] = _CODE_AT[_R.RESERVED]
        return cls(
            free,
            free_now,
            holds,
            too_small,
            short,
            capacity_short,
            shown_free,
            need[short],
            cap[rows, short],
            codes,
        )

    def copy(self, most: int) -> _Capacity:
        """A copy whose verdict columns may be changed, holding at most `most` VMs a row (more than zero: a row
        held to none is an anti-affinity verdict, derived again with its own bound); `free` and `free_now` are
        shared, read-only."""
        return _Capacity(
            self.free,
            self.free_now,
            np.minimum(self.holds, most),
            self.too_small.copy(),
            self.short.copy(),
            self.capacity_short.copy(),
            self.shown_free.copy(),
            self.shown_need.copy(),
            self.shown_cap.copy(),
            self.codes.copy(),
        )

    def set_row(self, row: int, verdict: tuple[int, bool, int, bool, int, int, int, int, int]) -> None:
        """One row's verdict (`_row_verdict`'s) written over it."""
        self.rows_set.append(row)
        self.row_copies[row] = verdict[8]
        (
            self.holds[row],
            self.too_small[row],
            self.short[row],
            self.capacity_short[row],
            self.shown_free[row],
            self.shown_need[row],
            self.shown_cap[row],
            self.codes[row],
        ) = verdict[:8]


def _row_verdict(
    cap: list[int],
    free: list[int],
    free_now: list[int] | None,
    need: list[int],
    wants: list[int],
    allowed: int,
) -> tuple[int, bool, int, bool, int, int, int, int, int]:
    """One node's verdict, `_Capacity.of`'s arithmetic for a single row in Python ints: (holds, too small, short
    dimension, short of capacity, free, need and allocatable shown, code index or -1, slots)."""
    copies = min((max(free[d], 0) // need[d] for d in wants), default=int(UNBOUNDED))
    too_small = any(cap[d] < need[d] for d in wants)
    anti = copies > 0 and allowed == 0 and not too_small
    holds = 0 if too_small else min(copies, allowed)
    short = next((d for d in wants if (cap[d] if too_small else free[d]) < need[d]), MEM)
    capacity_short = holds == 0 and not too_small and not anti
    if holds > 0 or anti:
        short = MEM
    code = -1
    if too_small:
        code = _CODE_AT[_R.TOO_SMALL]
    elif anti:
        code = _CODE_AT[_R.ANTI_AFFINITY]
    elif capacity_short:
        busy_now = free_now is not None and any(free_now[d] < need[d] for d in wants)
        code = _CODE_AT[_R.NO_DISK if short == DISK else _R.AT_CAPACITY if busy_now else _R.RESERVED]
    shown_free = cap[short] if too_small else free[short]
    slots = 0 if too_small else copies
    return holds, too_small, short, capacity_short, shown_free, need[short], cap[short], code, slots


@lru_cache(maxsize=1024)
def _largest(vnodes: tuple[Res, ...]) -> Res:
    """The VM a verdict counts: the first in the mapper's size order (a burst asks the same few shapes)."""
    return vnodes[size_order(vnodes)[0] - 1]


def _copies(
    free: npt.NDArray[np.int64], need: npt.NDArray[np.int64], wants: list[int], most: int
) -> npt.NDArray[np.int64]:
    """Per node, how many VMs of `need` its free figures hold, at most `most`."""
    out = np.full(len(free), most, dtype=np.int64)
    for d in wants:
        np.minimum(out, np.maximum(free[:, d], 0) // need[d], out=out)
    return out


@dataclass(frozen=True)
class _Ruled:
    """Nodes ruled out before mapping, as rows of the fleet's columns: each one's code and sentence as indexes
    into this ruling's own small tables (a few codes and sentences recur over most of a fleet)."""

    rows: npt.NDArray[np.int64]
    codes: npt.NDArray[np.int64]
    code_names: tuple[str, ...]
    notes: npt.NDArray[np.int64]
    texts: tuple[str, ...]

    @classmethod
    def of(cls, reasons: Iterable[tuple[int, str]], pos: Mapping[int, int]) -> _Ruled:
        """Every node with a reason, in C loops: a capability most of a fleet lacks bars hundreds of nodes, each
        with one of a few sentences."""
        pairs = tuple(reasons)
        if not pairs:
            return _NONE_RULED
        nodes, whys = zip(*pairs, strict=True)
        distinct = {why: i for i, why in enumerate(dict.fromkeys(whys))}
        rows = np.fromiter(map(pos.get, nodes, repeat(-1)), np.int64, len(nodes))
        which = np.fromiter(map(distinct.__getitem__, whys), np.int64, len(whys))
        known = (rows >= 0) & np.array([bool(w) for w in distinct], dtype=bool)[which]
        split = [_split(why) for why in distinct]
        code_names = tuple(dict.fromkeys(code for code, _ in split))
        texts = tuple(dict.fromkeys(note for _, note in split))
        code_of = _ints([code_names.index(code) for code, _ in split])
        text_of = _ints([texts.index(note) for _, note in split])
        which = which[known]
        return cls(rows[known], code_of[which], code_names, text_of[which], texts)

    def sparing(self, rows: npt.NDArray[np.bool_]) -> _Ruled:
        """This ruling without the rows marked in `rows` (a fleet-wide mask)."""
        if not len(self.rows) or not rows.any():
            return self
        return self._kept(~rows[self.rows])

    def split(self, code: str) -> tuple[_Ruled, _Ruled]:
        """(the rows with `code`, the others)."""
        if code not in self.code_names:
            return _NONE_RULED, self
        has = self.codes == self.code_names.index(code)
        return self._kept(has), self._kept(~has)

    def _kept(self, keep: npt.NDArray[np.bool_]) -> _Ruled:
        if keep.all():
            return self
        return _Ruled(self.rows[keep], self.codes[keep], self.code_names, self.notes[keep], self.texts)

    def joined(
        self, codes: tuple[str, ...], texts: tuple[str, ...]
    ) -> tuple[tuple[str, ...], tuple[str, ...], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The code and sentence tables extended by this ruling's, and its rows' indexes into them."""
        codes += tuple(c for c in self.code_names if c not in codes)
        text_at = {t: i for i, t in enumerate(texts)}
        for t in self.texts:
            text_at.setdefault(t, len(text_at))
        code_of = _ints([codes.index(c) for c in self.code_names])
        text_of = _ints([text_at[t] for t in self.texts])
        return codes, tuple(text_at), code_of[self.codes], text_of[self.notes]


_NONE_RULED = _Ruled(np.zeros(0, np.int64), np.zeros(0, np.int64), (), np.zeros(0, np.int64), ())


def _ints(values: list[int]) -> npt.NDArray[np.int64]:
    return np.array(values, dtype=np.int64)


@lru_cache(maxsize=256)
def _split(why: str) -> tuple[str, str]:
    """ "code: sentence" as (code, sentence); the same few exclusion texts recur on most of a fleet."""
    code, _, note = why.partition(": ")
    return code, note or why
