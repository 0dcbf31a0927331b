"""The distinct shapes (cores, memory, disk, idle baseline) of the fleet's nodes that are not dead: what every lease
request's VMs are checked against before the request is stored ("exceeds the largest node", a 400).

Reading them is a scan of every node row, and it was the costliest statement of a lease burst: 0.44 ms of the
database's time a request at 1,000 nodes, 39 % of all it spent (pg_stat_statements, docs/benchmarks/burst-http.md). A
fleet's shapes change when a node is registered, changes its figures, is deleted, or dies or comes back: rarely. So a
process keeps the answer for SHAPES_TTL_S, and forgets it at once when it writes a node itself (a saved or deleted
Node, and again when that write commits).

What that costs in exactness: a change made by another process is seen here up to SHAPES_TTL_S late. The check is a
fast answer to a request that could never be placed, and the planning pass decides every request on the fleet as
it then is, so a late view changes only which answer a request racing a node's change gets: a 400 for a node
registered a moment ago, or, for a node just dead or deleted, the scheduler's own answer (rejected, or queued until
such a node is back), as a request validated just before the change already gets. Only reads outside a transaction
are kept: a read inside one may see rows that are rolled back.
"""

from __future__ import annotations

import threading
import time

from django.db import router, transaction

from slotkeeper import statements

SHAPES_TTL_S = 1.0
FIGURES = ("cpu_cores", "mem_total_mib", "disk_total_gib", "idle_baseline_mib")

_lock = threading.Lock()
_kept: tuple[float, str, tuple[tuple, ...]] | None = None  # (monotonic expiry, database alias, shapes)
_forgotten = 0  # how many times forget() ran: a read that overlapped one is not kept


def live_shapes() -> tuple[tuple, ...]:
    """(cores, memory MiB, disk GiB, idle baseline MiB) of each distinct shape among the nodes not dead."""
    global _kept
    from fleet.models import Node

    alias = router.db_for_read(Node)
    kept = _kept
    if kept is not None and kept[1] == alias and time.monotonic() < kept[0]:
        return kept[2]
    keep = not transaction.get_connection(alias).in_atomic_block
    taken, generation = time.monotonic(), _forgotten
    # A statement compiled once (slotkeeper/statements.py): building the queryset cost more than the answer.
    rows = tuple(
        tuple(row) for row in statements.template(alias, "fleet.live_shapes", _statement).rows(alias)
    )
    if keep:
        with _lock:
            # Not if a node was written while this read ran: that write may be missing from `rows`.
            if _forgotten == generation:
                _kept = (taken + SHAPES_TTL_S, alias, rows)
    return rows


def forget(**_) -> None:
    """Drops the kept shapes now and once the current transaction commits (a signal receiver for Node)."""
    _drop()
    transaction.on_commit(_drop)


def _drop() -> None:
    global _kept, _forgotten
    with _lock:
        _kept = None
        _forgotten += 1


def _statement():
    from fleet.models import Node, NodeStatus

    return Node.objects.exclude(status=NodeStatus.DEAD).values_list(*FIGURES).order_by().distinct()
