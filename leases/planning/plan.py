"""`Planning`: what one pass plans with and its caller is handed (the scheduler, the pass's `now`, the nodes it
excludes, the fleet as read), and what the pass collects for its write (the leases reported, the decided
requests' messages, the forecast job). `move_vnode` is a reschedule's one step on it."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from fleet import capacity
from leases import forecasting
from leases.planning.records import to_epoch
from leases.scheduler import Scheduler

# Node names per cached scheduler (see Planning.names).
_names: weakref.WeakKeyDictionary[Scheduler, dict[int, str]] = weakref.WeakKeyDictionary()


@dataclass
class Planning:
    scheduler: Scheduler
    now: datetime
    excluded: dict[int, str]
    nodes: list[capacity.NodeState]
    # Leases whose placement report the caller wrote; the applier writes one for every other lease placed.
    reported: set[int] = field(default_factory=set)
    # The periodic tick's pass while it holds the forecast runner: a large queue's forecast, if this says it may
    # be taken now, is snapshotted under the lock and handed back in `forecast`, to be computed after the pass
    # commits (leases/forecasting.py).
    tick: Callable[[], bool] | None = None
    forecast: forecasting.Job | None = None
    # The decided requests' messages, written with the rest of their rows by the applier (applying.py,
    # `_write_leases`).
    messages: dict[int, str] = field(default_factory=dict)
    # Set by a caller that sent future reservations back to the queue (Scheduler.make_way): it runs the queue.
    make_way: bool = False

    @property
    def t(self) -> float:
        return to_epoch(self.now)

    @cached_property
    def names(self) -> dict[int, str]:
        """Node id -> name. A cached scheduler is only reused while every node keeps its name (the fleet
        fingerprint holds them), so the mapping is built once per scheduler, not once per pass."""
        got = _names.get(self.scheduler)
        if got is None:
            got = _names[self.scheduler] = {n.id: n.name for n in self.nodes}
        return got


def move_vnode(plan: Planning, lease_id: int, vnode: int, old_node: int, new_node: int) -> bool:
    """Moves one vnode's share of a lease's live reservations from `old_node` to `new_node` in the slot table (a
    reschedule), all or nothing (Scheduler.move_vnode). The caller advances the scheduler to now first."""
    return plan.scheduler.move_vnode(lease_id, vnode, old_node, new_node, plan.t)
