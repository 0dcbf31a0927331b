"""The per-node verdict loop as it was before the vectorised pass (leases/scheduling/explain.py): the oracle the
vectorised verdicts are checked against, node by node, on random plans (test_explain_vectorised.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleet.capacity import ReasonCode
from fleet.reports import Verdict as NodeVerdict
from leases.scheduling.explain import UNBOUNDED
from leases.scheduling.mapper import size_order
from leases.scheduling.records import LeaseRequest
from leases.slots.values import vec, vec_minus, vec_plus
from leases.slottable import Res

_R = ReasonCode
DIMENSIONS = (("disk", 2), ("mem", 1), ("cpu", 0))
_INDEX = dict(DIMENSIONS)
_NAMES = {i: name for name, i in DIMENSIONS}


def reference_verdicts(
    self,
    req: LeaseRequest,
    start: float,
    end: float,
    *,
    chosen: Mapping[int, Res] | None = None,
    proposed: Sequence[int] = (),
    excluded: Mapping[int, str] | None = None,
    now: float | None = None,
) -> list[NodeVerdict]:
    own = chosen or {}
    picked = list(own) or list(proposed)
    now = self._now if now is None else now
    ruled_out = self._excluded if excluded is None else excluded
    vm = req.vnodes[size_order(req.vnodes)[0] - 1]
    count = len(req.vnodes)
    table = self.table
    # The mapper's order: the nodes it chose first (it fills nodes in its order, so they led it), then the
    # rest as it would try them now.
    tried = self._order_used(req, start, end - start)
    if tried is None:
        tried = self._host_order(table, req, start, end - start, None)
    order = [n for n in own] + [n for n in tried if n not in own]
    ranks = {n: i + 1 for i, n in enumerate(order)}
    extra = {n: vec(r) for n, r in self._now_extra.items()} if start <= now else {}
    mine = {n: vec(r) for n, r in own.items()}
    taken = dict(req.taken)
    barred = dict(req.barred)
    need = vec(vm)
    wants = [(i, need[i]) for _, i in DIMENSIONS if need[i] > 0]
    mem_i = _INDEX["mem"]
    out = []
    for node in table.nodes:
        cap = vec(self._capacity[node])
        # The first that holds: a missing capability, too small even when empty, the node's state, a group rule.
        lacks = barred.get(node, "").startswith("missing_capability")
        too_small = any(cap[i] < w for i, w in wants)
        why = barred[node] if lacks else None if too_small else ruled_out.get(node) or barred.get(node)
        if why:
            code, _, note = why.partition(": ")
            out.append(
                NodeVerdict(
                    node,
                    0,
                    code,
                    "mem",
                    need[mem_i],
                    cap[mem_i],
                    cap[mem_i],
                    None,
                    False,
                    (),
                    note or why,
                    slots=0,
                )
            )
            continue
        if any(cap[i] < w for i, w in wants):
            dim = _short_vec(wants, cap)
            i = _INDEX[dim]
            out.append(
                NodeVerdict(node, 0, _R.TOO_SMALL.value, dim, need[i], cap[i], cap[i], None, False, slots=0)
            )
            continue
        free = table.free_over_vec(node, start, end)
        if node in mine:
            free = vec_plus(free, mine[node])
        if node in extra:
            free = vec_minus(free, extra[node])
        slots = min(max(free[i], 0) // w for i, w in wants) if wants else UNBOUNDED
        holds = min(slots, count)
        allowed = count if req.spread is None else max(req.spread - taken.get(node, 0), 0)
        rank = ranks.get(node)
        if holds and not allowed:
            code = _R.ANTI_AFFINITY.value
            out.append(
                NodeVerdict(
                    node, 0, code, "mem", need[mem_i], free[mem_i], cap[mem_i], rank, False, slots=slots
                )
            )
            continue
        holds = min(holds, allowed)
        if holds:
            chosen_here = node in picked
            out.append(
                NodeVerdict(
                    node,
                    holds,
                    None,
                    "mem",
                    need[mem_i],
                    free[mem_i],
                    cap[mem_i],
                    rank,
                    chosen_here,
                    slots=slots,
                )
            )
            continue
        dim = _short_vec(wants, free)
        i = _INDEX[dim]
        if dim == "disk":
            code = _R.NO_DISK.value
        elif start <= now and not _copies(vm, _free_now(self, node, start, own, self._now_extra)):
            code = _R.AT_CAPACITY.value  # short right now, not only later in the window
        else:
            code = _R.RESERVED.value
        blockers: tuple[int, ...] = ()
        if code != _R.NO_DISK:
            lids = {b.lease_id for b in table.blockers(node, vm, start, end) if b.lease_id != req.id}
            blockers = tuple(sorted(lids))
        out.append(NodeVerdict(node, 0, code, dim, need[i], free[i], cap[i], rank, False, blockers, slots=0))
    return out


def _free_now(self, node: int, t: float, own: Mapping[int, Res], extra: Mapping[int, Res]) -> Res:
    free = self.table.available_at(node, t)
    if node in own:
        free = free + own[node]
    return free - extra[node] if node in extra else free


def _copies(vm: Res, free: Res) -> int:
    need, have = vec(vm), vec(free)
    best = 1 << 30
    for _, i in DIMENSIONS:
        if need[i] > 0:
            best = min(best, max(have[i], 0) // need[i])
    return best


def _short_vec(wants: Sequence[tuple[int, int]], free: Sequence[int]) -> str:
    for i, w in wants:
        if free[i] < w:
            return _NAMES[i]
    return "mem"
