"""A pass's scheduler made ready to plan on the fleet as this pass read it: the nodes it may not use now (draining,
offline, dead, stale or unreadable health: the placer's liveness checks) handed over, time settled to the pass's
`now`, and the now-gate's figures observed (docs/capacity.md: memory used beyond the remembered baseline, disk
short of what the plan thinks is free, and each node's CPU headroom for the ranking)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from django.conf import settings

from fleet import capacity, placement
from leases.planning.plan import Planning
from leases.scheduler import Scheduler
from leases.slottable import Res


def _excluded(fleet: placement.FleetRead) -> dict[int, str]:
    return fleet.excluded(settings.SLOTKEEPER["HEALTH_MAX_AGE_S"])


def _prepare(sched: Scheduler, plan: Planning) -> None:
    """A pass's scheduler made ready to plan: this pass's exclusions in force, time moved to the pass's `now`, the
    now-gate's figures observed. The exclusions first: a cancel or an approval runs the queue without handing them
    over itself, and a scheduler rebuilt after a fleet change had none, so the queue placed leases on a node that
    had never sent a heartbeat (tests/leases/test_exclusions_every_pass.py)."""
    sched.use_exclusions(plan.excluded)
    sched.settle(plan.t)
    sched.replaced = []  # set again by this pass's advance(), if it runs one
    _observe(sched, plan)


def _observe(sched: Scheduler, plan: Planning) -> None:
    extra, columns = observed_extra(plan.nodes, sched, plan.t, plan.excluded)
    sched.observe(extra, columns, headroom_of(plan.nodes))


def observed_extra(
    nodes: list[capacity.NodeState], sched: Scheduler, t: float, excluded: Mapping[int, str]
) -> tuple[dict[int, Res], npt.NDArray[np.int64]]:
    """The now-gate's figures (docs/capacity.md): per usable node, the memory it is observed to use beyond its
    remembered baseline and what the plan holds there now, and the disk it is short of what the plan thinks is
    free. Seed 001's rule: a node is charged the worse of observed and committed use. Returned twice: per node,
    and as cpu/memory/disk columns in the slot table's node order (what the report's vectorised verdicts use)."""
    arrays = sched.table.arrays()
    pos = arrays.pos
    columns = np.zeros((len(arrays.nodes), 3), dtype=np.int64)
    seen = [n for n in nodes if n.observed_mem_used_mib is not None and n.id in pos and n.id not in excluded]
    if not seen:
        return {}, columns
    # In columns: a loop over 1,000 nodes was an eighth of every planning pass.
    rows = np.fromiter((pos[n.id] for n in seen), np.int64, len(seen))
    planned = arrays.level_at(t)[rows]  # every node's planned use at t in one pass
    used = np.fromiter((n.observed_mem_used_mib for n in seen), np.int64, len(seen))
    remembered = np.fromiter((n.idle_baseline_mib or 0 for n in seen), np.int64, len(seen))
    mem = np.maximum(0, used - np.maximum(remembered, capacity.BASELINE_FLOOR_MIB) - planned[:, 1])
    disk_free = np.fromiter(
        (n.disk_free_gib if n.disk_free_gib is not None else np.nan for n in seen), np.float64, len(seen)
    )
    # The slot table's disk capacity is the node's allocatable disk (node_capacity; the cache is keyed on it).
    plan_free = arrays.caps[rows, 2] - planned[:, 2]
    short = np.ceil(plan_free - (disk_free - capacity.DISK_RESERVE_GIB))
    disk = np.where(np.isnan(disk_free), 0, np.maximum(0, np.nan_to_num(short))).astype(np.int64)
    columns[rows, 1] = mem
    columns[rows, 2] = disk
    out = {
        n.id: _extra_res(m, d) for n, m, d in zip(seen, mem.tolist(), disk.tolist(), strict=True) if m or d
    }
    return out, columns


# One Res per distinct (memory, disk) figure: a node whose figures did not move since the last pass gets the very
# object it had, so Scheduler.observe finds the figures unchanged by identity (a dataclass __eq__ per node
# otherwise), and a pass builds no Res for it. Bounded: cleared when it grows past a fleet's worth many times over.
_extra_memo: dict[tuple[int, int], Res] = {}


def _extra_res(mem: int, disk: int) -> Res:
    got = _extra_memo.get((mem, disk))
    if got is None:
        if len(_extra_memo) >= 1 << 16:
            _extra_memo.clear()
        got = _extra_memo[(mem, disk)] = Res(mem=mem, disk=disk)
    return got


# The last headroom mapping handed to a scheduler, kept while every node's figure is the same: the scheduler keeps
# its ranking column by the mapping's identity.
_headroom_kept: dict[int, float] = {}


def headroom_of(nodes: Sequence[capacity.NodeState]) -> dict[int, float]:
    """Per node, its live CPU headroom (idle %, 0 when unknown or stale): the placer's tie-break between two nodes
    with as many free slots (seed 001: the idler node)."""
    global _headroom_kept
    got = {n.id: capacity.headroom_of(n) for n in nodes}
    if got != _headroom_kept:
        _headroom_kept = got
    return _headroom_kept
