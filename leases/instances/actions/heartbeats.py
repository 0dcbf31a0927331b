"""The flush of buffered heartbeats (fleet/heartbeats.py): what each node said since the last flush, written the
way the per-request heartbeat would have written it, with the nodes that run nothing in one set-based statement.

Split by what the instances package knows and fleet does not: a node whose report would change an instance row
(a state to confirm, an exit, a missing instance, a stop to acknowledge, a new log or detail) needs its reports
ingested (the restart policy, unloads, lock order: its instances, then the node), so it takes the composed
per-node action (nodes.do_heartbeat_known), in order, one transaction each. Every other node, the steady fleet
(idle, or running what it should with nothing new to say), is written together by fleet.heartbeats.flush_health; what that refuses
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
    # Measured before the write replaces what they are measured against, counted once it is done: a flush that
    # fails is tried again with the same batch.
    ages = fleet_heartbeats.ages({node_id: [e.at for e in entries] for node_id, entries in batch.items()})
    on_node: dict[int, list[dict]] = {}
    for row in (
        Instance.objects.filter(node_id__in=list(batch), state__in=ON_NODE)
        .exclude(state=InstanceState.LOST)
        .values("node_id", "iid", "state", "desired_state", "last_exit_code", "log_tail", "detail")
    ):
        on_node.setdefault(row["node_id"], []).append(row)
    together, one_by_one = [], []
    for node_id, entries in batch.items():
        if len(entries) == 1 and _nothing_to_ingest(entries[0], on_node.get(node_id, [])):
            together.append(entries[0])
        else:
            one_by_one.extend(entries)
    # As the per-node path decides `committed`: work placed on the node, or any instance in its report.
    busy = {e.token.node_id for e in together if e.token.node_id in on_node or e.report.instances}
    done.set_based, stale = fleet_heartbeats.flush_health(together, busy=busy)
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
    fleet_heartbeats.count_ages(ages)
    return done


def _nothing_to_ingest(entry: Pending, instances: list[dict]) -> bool:
    """Whether `reports.ingest_reports` would change no instance row for this report: every instance the server
    has on the node is meant to run, is running, and is reported running with nothing new (exit code, log, detail).
    Read without locks: a cancel or a move committed after this read is seen by the node's next heartbeat, and
    nothing is written to the instance rows meanwhile, so nothing of it can be overwritten."""
    reported = {r["id"]: r for r in entry.report.instances}
    for inst in instances:
        report = reported.get(inst["iid"])
        if (
            report is None
            or report["status"] != "running"
            or inst["state"] != InstanceState.RUNNING
            or inst["desired_state"] != "running"
            or report.get("exit_code") not in (None, inst["last_exit_code"])
            or (report.get("log_tail") and report["log_tail"][-50:] != inst["log_tail"])
            or (report.get("detail") and report["detail"][:2000] != inst["detail"])
        ):
            return False
    return True


def _one(entry: Pending) -> bool:
    try:
        # Guarded by the remembered token; takes the full way (bring back, refuse) when the row changed.
        return nodes.do_heartbeat_known(entry.token, entry.report, now=entry.at) is not None
    except DomainError:
        return False  # fenced meanwhile: refused and counted there (fleet.actions.refuse_fenced)
    except Exception:
        log.exception("buffered heartbeat failed", extra={"node": entry.token.node_name})
        return False
