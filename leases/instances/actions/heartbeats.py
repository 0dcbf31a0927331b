"""The flush of buffered heartbeats (fleet/heartbeats.py): what each node said since the last flush, written the
way the per-request heartbeat would have written it, with the nodes that run nothing in one set-based statement.

Split by what the instances package knows and fleet does not: a node with instances on it (by the server's rows)
or in its report needs its reports ingested (the restart policy, unloads, lock order: its instances, then the
node), so it takes the composed per-node action (nodes.do_heartbeat_known), in order, one transaction each. Every
other node, the steady idle fleet, is written together by fleet.heartbeats.flush_health; what that refuses
(token rotated, node fenced, drained or marked offline meanwhile) is taken the full way at once, so a status
change a buffered heartbeat brings about lands within the flush that finds it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fleet import heartbeats as fleet_heartbeats
from fleet.heartbeats import Pending
from leases.instance_rows import ON_NODE
from leases.instances.actions import nodes
from leases.lifecycle import InstanceState
from leases.models import Instance
from slotkeeper import metrics
from slotkeeper.domain import DomainError

log = logging.getLogger(__name__)


@dataclass
class Flushed:
    set_based: int = 0
    per_node: int = 0
    stale: int = 0
    refused: int = 0  # rotated, deleted or fenced meanwhile: nothing written, its next heartbeat is refused


def flush(batch: dict[int, list[Pending]]) -> Flushed:
    """Writes one buffer's worth of heartbeats. An error on one node's per-node write is logged and that node's
    heartbeat dropped (its next one, a few seconds later, says the same); an error in the set-based statement
    propagates, so the caller can put the batch back."""
    done = Flushed()
    if not batch:
        return done
    running_something = set(
        Instance.objects.filter(node_id__in=list(batch), state__in=ON_NODE)
        .exclude(state=InstanceState.LOST)
        .values_list("node_id", flat=True)
        .distinct()
    )
    together = [
        entries[-1]
        for node_id, entries in batch.items()
        if node_id not in running_something and not any(e.report.instances for e in entries)
    ]
    one_by_one = [
        e
        for node_id, entries in batch.items()
        if node_id in running_something or any(e.report.instances for e in entries)
        for e in entries
    ]
    done.set_based, stale = fleet_heartbeats.flush_health(together)
    done.stale = len(stale)
    for entry in one_by_one + stale:
        if _one(entry):
            done.per_node += 1
        else:
            done.refused += 1
    metrics.inc("slotkeeper_heartbeat_flushes_total")
    metrics.inc("slotkeeper_heartbeats_buffered_total", sum(map(len, batch.values())))
    metrics.inc("slotkeeper_heartbeats_flushed_total", done.set_based, how="set")
    metrics.inc("slotkeeper_heartbeats_flushed_total", done.per_node, how="node")
    return done


def _one(entry: Pending) -> bool:
    try:
        # Guarded by the remembered token; takes the full way (bring back, refuse) when the row changed.
        return nodes.do_heartbeat_known(entry.token, entry.report, now=entry.at) is not None
    except DomainError:
        return False  # fenced meanwhile: refused and counted there (fleet.actions.refuse_fenced)
    except Exception:
        log.exception("buffered heartbeat failed", extra={"node": entry.token.node_name})
        return False
