"""Node operations as the instances package sees them: fleet's action, then what it means for the instances on
the node, in one transaction. The agent's heartbeat, declare-dead, the sweep, a drain with a deadline and a node's
deletion all enter here (API, console, admin, the periodic step); fleet/actions.py alone knows nothing of
instances, and nothing calls back up into this module.

Lock order, as every writer takes it: the plan lock first, then instance rows by id, then node rows by id. The
heartbeat ingests the instance reports (instance rows) before fleet updates the node row; declare-dead and the
sweep take the plan lock before the node.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from fleet import actions as fleet_actions
from fleet.actions import HealthReport
from fleet.models import Node, NodeStatus
from leases import actions as lease_actions
from leases.instances import reads
from leases.instances.actions import drains, loss, reports
from slotkeeper import planlock
from slotkeeper.auth import NodeToken, node_token_of, node_tokens

log = logging.getLogger(__name__)


def do_heartbeat(node: Node, report: HealthReport, *, now: datetime) -> Node:
    """The agent's heartbeat: the instance reports ingested, then the node's health recorded, in one transaction.
    A fenced node is refused (409) before anything is read or written."""
    if node.fenced_at is not None:
        fleet_actions.refuse_fenced(node, now)
    # Only an idle report needs to know whether work is placed here (fleet then remembers the idle footprint).
    committed = bool(report.instances) or any(reads.claims([node.pk]).get(node.pk, ((), ())))
    with transaction.atomic():
        reports.ingest_reports(node, list(report.instances), now)
        node = fleet_actions.do_heartbeat(node, report, now=now, committed=committed)
    # What the next heartbeat's fast path guards on (a node coming back is online now); kept only while cached.
    node_tokens.update(node_token_of(node))
    return node


def do_heartbeat_known(token: NodeToken, report: HealthReport, *, now: datetime) -> str | None:
    """The heartbeat of a node whose token this process resolved recently (slotkeeper.auth.node_tokens), without
    reading the node row: the same work as `do_heartbeat` in one transaction, with fleet's guarded update. When
    the row changed meanwhile (token rotated, node fenced, deleted, or its status moved) that transaction is rolled
    back and the heartbeat taken the full way from a fresh read. Returns the node's status for the agent, or None
    when no node holds this token any more (rotated, or the node deleted): the caller refuses it as unknown."""
    committed = bool(report.instances) or any(reads.claims([token.node_id]).get(token.node_id, ((), ())))
    try:
        with transaction.atomic():
            # Only the id is used to find the node's instances; the name is for log lines.
            reports.ingest_reports(Node(pk=token.node_id, name=token.node_name), list(report.instances), now)
            fresh = fleet_actions.do_heartbeat_known(token, report, now=now, committed=committed)
        if fresh is not token:
            node_tokens.update(fresh)
        return token.status
    except fleet_actions.Stale:
        node_tokens.forget(token.digest)
    node = Node.objects.filter(pk=token.node_id, token_digest=token.digest).first()
    if node is None:
        return None
    node = do_heartbeat(node, report, now=now)  # refuses a fenced node (409)
    node_tokens.put(node_token_of(node, token.digest))
    return node.status


def do_declare_dead(actor, node_id: int, *, reason: str, now: datetime) -> Node:
    """Declares the node dead (fenced until re-admitted) and loses its live instances, in one transaction."""
    with transaction.atomic():
        planlock.take()
        before = fleet_actions.get_node(node_id, lock=True)
        node = fleet_actions.do_declare_dead(actor, node_id, reason=reason, now=now)
        # A node the sweep found dead already lost its instances then; declaring it now only fences it.
        if before.status != NodeStatus.DEAD:
            loss.on_nodes_died([node.pk], now, node.status_reason)
    return node


def do_preview_placement(actor, data: dict, *, now: datetime) -> dict:
    """A "what if" placement, asked of the scheduler as a submission would be (leases/actions.py do_preview): the
    API and the console's form both call this, so they show the same verdicts as a lease's report."""
    body, _ = lease_actions.do_preview(actor, data, now=now)
    return body


def sweep(now: datetime) -> fleet_actions.SweepResult:
    """Fleet's sweep, then every node silent past the dead cutoff declared dead and its instances lost, one
    transaction per node, so a heartbeat that lands meanwhile wins for that node."""
    result = fleet_actions.sweep(now)
    if result.dead_cutoff is not None:
        for node_id in fleet_actions.silent_dead(result.dead_cutoff):
            with transaction.atomic():
                node = fleet_actions.declare_silent_dead(node_id, now, result.dead_cutoff)
                if node is not None:
                    loss.on_nodes_died([node.pk], now, node.status_reason)
                    result.dead.append(node.name)
    if result.offline or result.dead or result.resumed_after_s is not None:
        log.info(
            "sweep",
            extra={
                "offline": result.offline,
                "dead": result.dead,
                "resumed_after_s": result.resumed_after_s,
                "disrupted": result.disrupted,
            },
        )
    return result


def do_drain(
    actor,
    node_id: int,
    *,
    reason: str,
    now: datetime,
    deadline: datetime | None = None,
    max_parallel: int = 2,
) -> Node:
    """Drains the node; with a deadline its live instances are proposed for moves in the same transaction."""
    with transaction.atomic():
        if deadline is not None:
            planlock.take()  # the proposals' holds are planned: the plan lock before the node row, as everywhere
        node = fleet_actions.do_drain(
            actor, node_id, reason=reason, now=now, deadline=deadline, max_parallel=max_parallel
        )
        if deadline is not None:
            drains.propose_moves(node, now)
    return node


def do_delete_node(actor, node_id: int, *, now: datetime) -> None:
    """Deletes a node that runs nothing and holds nothing, counting the instances placed on it under the plan
    lock (fleet checks the reservations and what the agent reports)."""
    with transaction.atomic():
        planlock.take()
        node = fleet_actions.get_node(node_id, lock=True)
        fleet_actions.do_delete_node(actor, node_id, now=now, placed=reads.placed_ids(node))
