"""The only write paths of the fleet: register, update, delete, heartbeat, drain / undrain, declare dead, sweep.

Fleet knows nothing of what runs on its nodes: what a node's death, a drain's deadline or a heartbeat's instance
reports mean for instances is the instances package's (leases/instances/actions/nodes.py), which calls these
actions inside its own transaction and then does its part. Each action is one transaction, writes an audit row when an operator-visible state changes, and announces the change
only after commit. Status changes are compare-and-swap updates (`filter(status=OLD).update(status=NEW)`), so a sweep
and a heartbeat racing on one node cannot both apply: the loser's update matches no row.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When

from fleet import nodestate, token_notices
from fleet.models import HealthSample, Node, NodeStatus, SweepState
from slotkeeper import audit, events, metrics, outbox, planlock
from slotkeeper.auth import NodeToken, node_tokens
from slotkeeper.domain import DomainError, NotFound
from slotkeeper.models import hash_token, new_token

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthReport:
    mem_total_mib: int
    mem_used_mib: int
    disk_free_gib: float
    cpu_pct: float
    load1: float
    instances: tuple[dict, ...] = ()


def get_node(node_id: int, *, lock: bool = False) -> Node:
    qs = Node.objects.select_for_update() if lock else Node.objects
    try:
        return qs.get(pk=node_id)
    except Node.DoesNotExist:
        raise NotFound(f"node {node_id} does not exist") from None


def do_register_node(
    actor, *, name: str, cpu_cores: int, mem_total_mib: int, disk_total_gib: int, capabilities, now: datetime
) -> tuple[Node, str]:
    """Creates a node and returns it with its token, which is shown this once and stored only as a digest."""
    raw = new_token("skn")
    try:
        with transaction.atomic():
            node = Node.objects.create(
                name=name,
                cpu_cores=cpu_cores,
                mem_total_mib=mem_total_mib,
                disk_total_gib=disk_total_gib,
                capabilities=sorted(set(capabilities)),
                status=NodeStatus.OFFLINE,
                status_changed_at=now,
                status_reason="registered; waiting for its first heartbeat",
                token_digest=hash_token(raw),
            )
            audit.record(at=now, actor=actor, action="node.register", target=node)
            _node_event(node.pk, "registered", now, "", "registered; waiting for its first heartbeat")
            events.send_on_commit("node-changed", node=node.pk)
    except IntegrityError:
        raise DomainError(f"a node named {name!r} already exists") from None
    return node, raw


def do_rotate_token(actor, node_id: int, *, now: datetime) -> str:
    raw = new_token("skn")
    with transaction.atomic():
        node = get_node(node_id, lock=True)
        node.token_digest = hash_token(raw)
        node.save(update_fields=["token_digest"])
        audit.record(at=now, actor=actor, action="node.rotate_token", target=node)
    _forget_tokens(node_id)
    return raw


def _forget_tokens(node_id: int) -> None:
    """Drops the node's remembered token in this process, now and once the caller's transaction commits (a
    heartbeat between the two finds the row changed and takes the slow path anyway), and in the other web
    processes when it commits (fleet/token_notices.py: their buffered heartbeats would otherwise see it at the
    next flush)."""
    node_tokens.forget_node(node_id)
    transaction.on_commit(lambda: node_tokens.forget_node(node_id))
    token_notices.announce(node_id)


EDITABLE = ("name", "cpu_cores", "mem_total_mib", "disk_total_gib", "capabilities")


def do_update_node(actor, node_id: int, changes: dict, *, now: datetime) -> Node:
    try:
        with transaction.atomic():
            node = get_node(node_id, lock=True)
            before = {f: getattr(node, f) for f in changes if f in EDITABLE}
            for field, value in changes.items():
                if field in EDITABLE:
                    setattr(node, field, sorted(set(value)) if field == "capabilities" else value)
            node.version += 1
            node.save(update_fields=[*before, "version"])
            _forget_tokens(node.pk)  # a renamed node's agent is named anew in logs and the audit
            audit.record(
                at=now,
                actor=actor,
                action="node.update",
                target=node,
                details={"before": before, "after": {f: getattr(node, f) for f in before}},
            )
            events.send_on_commit("node-changed", node=node.pk)
    except IntegrityError:
        raise DomainError(f"a node named {changes.get('name')!r} already exists") from None
    return node


def running_instance_count(node: Node, placed: Collection[str]) -> int:
    """Instances that occupy the node: what its agent reports, and what the server has placed there (`placed`,
    from the caller that knows instances), unioned by id."""
    ids = set(placed)
    ids.update(str(i.get("id") if isinstance(i, dict) else i) for i in node.reported_instances or ())
    return len(ids)


def do_delete_node(actor, node_id: int, *, now: datetime, placed: Collection[str] = ()) -> None:
    """Deletes a node that holds nothing: no instance, and no reservation that is running or still to come.

    Deleting one that still held reservations took its allocations with it while the reservations kept naming it,
    and every later tick, submission and cancel failed. Under the plan lock, so no plan lands on it meanwhile;
    the caller reads `placed` (the instances placed on it) under the same lock."""
    with transaction.atomic():
        planlock.take()
        node = get_node(node_id, lock=True)
        running = running_instance_count(node, placed)
        if running:
            raise DomainError(f"node {node.name} still runs {running} instance(s); drain it first")
        # Through the reverse relation: the fleet does not import the lease app.
        held = list(
            node.allocations.filter(live=True, end__gt=now)
            .order_by("start")
            .values_list("reservation__rid", "reservation__lease_id")
        )
        if held:
            leases = sorted({lease for _, lease in held})
            raise DomainError(
                f"node {node.name} holds {len(held)} reservation(s) of lease(s) "
                f"{', '.join(str(x) for x in leases[:10])}{' …' if len(leases) > 10 else ''}; "
                "drain it and let them end or move first",
                extra={
                    "code": "has_reservations",
                    "reservations": [rid for rid, _ in held],
                    "leases": leases,
                },
            )
        audit.record(at=now, actor=actor, action="node.delete", target=node)
        node.delete()
        _forget_tokens(node_id)
        events.send_on_commit("node-changed", node=node_id)


class Fenced(DomainError):
    """A heartbeat from a node an operator declared dead: it stays out until an admin re-admits it (409)."""


def _health_fields(report: HealthReport, instances: list, now: datetime) -> dict:
    """The node row's columns a heartbeat writes, whichever path it takes."""
    return {
        "last_heartbeat_at": now,
        "obs_mem_total_mib": report.mem_total_mib,
        "obs_mem_used_mib": report.mem_used_mib,
        "obs_disk_free_gib": report.disk_free_gib,
        "obs_cpu_pct": report.cpu_pct,
        "obs_load1": report.load1,
        "reported_instances": instances,
    }


def do_heartbeat(node: Node, report: HealthReport, *, now: datetime, committed: bool = False) -> Node:
    """Stores the latest health on the node row and one history sample; brings an offline or dead node back.

    `committed` says whether the server has work placed on the node (the caller knows instances; fleet does not):
    only a node with nothing reported and nothing committed has its idle footprint remembered.

    It never takes a node out of draining: a drain is an operator's decision, and a heartbeat only says the machine
    is reachable. A node that returns from offline/dead comes back as draining when it was drained before. A fenced
    node (declared dead by an operator) does not come back at all: its heartbeat is refused with `Fenced`.
    """
    if node.fenced_at is not None:
        refuse_fenced(node, now)
    instances = list(report.instances)
    fields = _health_fields(report, instances, now)
    # Seed 001: an idle node is the only time its own footprint is measured rather than inferred, so remember it.
    if not instances and not committed:
        fields["idle_baseline_mib"] = nodestate.remembered_baseline(
            node.idle_baseline_mib, report.mem_used_mib
        )
    every = settings.SLOTKEEPER["HEALTH_SAMPLE_EVERY_S"]
    sample = node.last_sample_at is None or (now - node.last_sample_at).total_seconds() >= every
    if sample:
        fields["last_sample_at"] = now
    with transaction.atomic():
        # The node row last: the caller ingested the instance reports first in the same transaction (the lock
        # order every writer shares: lease, then instances by id, then nodes by id).
        updated = Node.objects.filter(pk=node.pk, fenced_at=None).update(**fields)
        if not updated:
            # Declared dead (and fenced) between the read above and now: refuse like any fenced heartbeat.
            node.refresh_from_db()
            refuse_fenced(node, now)
        if sample:
            HealthSample.of(node.pk, now, report).save()
        if node.status in (NodeStatus.OFFLINE, NodeStatus.DEAD):
            _bring_back(node, now)
        for field, value in fields.items():
            setattr(node, field, value)
        events.send_on_commit("node-changed", node=node.pk)
    return node


class Stale(Exception):
    """The fast heartbeat's remembered token no longer matches the node row (another token, fenced, deleted, or
    its status changed): the caller rolls back and takes the full path."""


def do_heartbeat_known(
    token: NodeToken, report: HealthReport, *, now: datetime, committed: bool = False
) -> NodeToken:
    """`do_heartbeat` for a node whose token this process resolved recently, without reading the node row: one
    UPDATE guarded by what the full path would have checked (this token, not fenced, the status remembered:
    online or draining, so there is nothing to bring back), and a history sample at most every
    HEALTH_SAMPLE_EVERY_S, claimed with its own compare-and-swap so two processes never both take it. Raises
    `Stale` when the guard matches no row; call it inside the caller's transaction, which must then roll back."""
    if token.status not in (NodeStatus.ONLINE, NodeStatus.DRAINING):
        raise Stale(token.status)
    instances = list(report.instances)
    fields: dict = _health_fields(report, instances, now)
    if not instances and not committed:
        # nodestate.remembered_baseline, said in SQL so the row's own value decides (another process may have
        # moved it since this one read it): the reading, unless within BASELINE_STEP_MIB of what is remembered.
        used, step = report.mem_used_mib, nodestate.BASELINE_STEP_MIB
        fields["idle_baseline_mib"] = Case(
            When(
                Q(idle_baseline_mib=None)
                | Q(idle_baseline_mib__lte=used - step)
                | Q(idle_baseline_mib__gte=used + step),
                then=Value(used),
            ),
            default=F("idle_baseline_mib"),
            output_field=Node._meta.get_field("idle_baseline_mib"),
        )
    with transaction.atomic():
        updated = Node.objects.filter(
            pk=token.node_id, token_digest=token.digest, fenced_at=None, status=token.status
        ).update(**fields)
        if not updated:
            raise Stale("the node row changed")
        every = settings.SLOTKEEPER["HEALTH_SAMPLE_EVERY_S"]
        if token.last_sample_at is None or (now - token.last_sample_at).total_seconds() >= every:
            due = Q(last_sample_at=None) | Q(last_sample_at__lte=now - timedelta(seconds=every))
            if Node.objects.filter(due, pk=token.node_id).update(last_sample_at=now):
                HealthSample.of(token.node_id, now, report).save()
            # Taken here or by another process since: either way not due again before `every` from now.
            token = dataclasses.replace(token, last_sample_at=now)
        events.send_on_commit("node-changed", node=token.node_id)
    return token


def refuse_fenced(node: Node, now: datetime) -> None:
    # Remember that it still calls (the node page shows it), outside the refused work's transaction. Not for a
    # heartbeat sent before the fence and written after it (buffered, fleet/heartbeats.py): that is no call since.
    Node.objects.filter(pk=node.pk, fenced_at__lte=now).update(last_fenced_heartbeat_at=now)
    metrics.inc("slotkeeper_fenced_heartbeats_total")
    raise Fenced(
        f"node {node.name} was declared dead ({node.fence_reason or node.status_reason}) and is fenced: "
        "stop every instance and wait until an admin re-admits it",
        extra={"code": "fenced", "node": node.name},
    )


def _bring_back(node: Node, now: datetime) -> None:
    # Both the claim and the choice of status are made by the database in one statement: deciding "draining or
    # online" from the row read earlier raced with an undrain in between and produced a draining node without a
    # reason (the check constraint caught it under the concurrency test).
    claimed = Node.objects.filter(pk=node.pk, status=node.status).update(
        status=Case(When(drain_reason="", then=Value(NodeStatus.ONLINE)), default=Value(NodeStatus.DRAINING)),
        status_changed_at=now,
        status_reason="heartbeat received",
    )
    if claimed:
        returning_to = Node.objects.filter(pk=node.pk).values_list("status", flat=True).get()
        audit.record(
            at=now,
            actor=None,
            action="node.back",
            target=node,
            reason=f"heartbeat received; was {node.status}",
            details={"from": node.status, "to": returning_to},
        )
        log.info("node back", extra={"node": node.name, "from": node.status, "to": returning_to})
        _node_event(node.pk, returning_to, now, node.status, "heartbeat received")
        node.status = returning_to


# What a drain or an undrain changes on the node row; one list, so the two can never save different fields.
DRAIN_FIELDS = [
    "status",
    "status_changed_at",
    "status_reason",
    "drain_reason",
    "drained_by",
    "drained_at",
    "drain_deadline",
    "drain_max_parallel",
    "version",
]


def do_drain(
    actor,
    node_id: int,
    *,
    reason: str,
    now: datetime,
    deadline: datetime | None = None,
    max_parallel: int = 2,
) -> Node:
    """Stops new work landing on the node. With a deadline it is a process (the instances package proposes the
    node's instances for moves, applies at most `max_parallel` at a time, and stops what is left at the deadline);
    the drain fields recorded here are what it reads."""
    reason = (reason or "").strip()
    if deadline is not None and deadline <= now:
        raise DomainError("the drain deadline must be in the future")
    if not reason:
        raise DomainError("a drain needs a reason")
    with transaction.atomic():
        node = get_node(node_id, lock=True)
        if node.status == NodeStatus.DEAD:
            raise DomainError(f"node {node.name} is dead; there is nothing to drain")
        if node.status == NodeStatus.DRAINING:
            raise DomainError(f"node {node.name} is already draining ({node.drain_reason})")
        previous = node.status
        node.status = NodeStatus.DRAINING
        node.status_changed_at = now
        node.status_reason = reason
        node.drain_reason = reason
        node.drained_by = actor if getattr(actor, "pk", None) else None
        node.drained_at = now
        node.drain_deadline = deadline
        node.drain_max_parallel = max_parallel
        node.version += 1
        node.save(update_fields=DRAIN_FIELDS)
        _node_event(node.pk, NodeStatus.DRAINING, now, previous, reason)
        audit.record(
            at=now,
            actor=actor,
            action="node.drain",
            target=node,
            reason=reason,
            details={
                "from": previous,
                "deadline": deadline.isoformat() if deadline else None,
                "max_parallel": max_parallel,
            },
        )
        events.send_on_commit("node-changed", node=node.pk)
    return node


def do_undrain(actor, node_id: int, *, reason: str = "", now: datetime) -> Node:
    with transaction.atomic():
        node = get_node(node_id, lock=True)
        if node.status != NodeStatus.DRAINING and not node.drain_reason:
            raise DomainError(f"node {node.name} is not draining")
        fresh = node.last_heartbeat_at and (now - node.last_heartbeat_at).total_seconds() < _offline_after()
        if node.status == NodeStatus.DRAINING:
            node.status = NodeStatus.ONLINE if fresh else NodeStatus.OFFLINE
            node.status_changed_at = now
            node.status_reason = f"undrained: {reason}" if reason else "undrained"
        was = node.drain_reason
        _node_event(node.pk, node.status, now, NodeStatus.DRAINING, node.status_reason)
        node.drain_reason = ""
        node.drained_by = None
        node.drained_at = None
        node.drain_deadline = None
        node.version += 1
        node.save(update_fields=DRAIN_FIELDS)
        audit.record(
            at=now,
            actor=actor,
            action="node.undrain",
            target=node,
            reason=reason,
            details={"drain_reason": was},
        )
        events.send_on_commit("node-changed", node=node.pk)
    return node


def do_declare_dead(actor, node_id: int, *, reason: str, now: datetime) -> Node:
    """An operator's word that the machine is gone: it is dead and fenced until re-admitted. Its instances are lost
    by the caller, in the same transaction (leases/instances/actions/nodes.py).

    Under the plan lock, so an approval or a submission either committed before (and its instances on this node
    are lost with the rest) or plans after, and sees the node dead."""
    reason = (reason or "").strip()
    if not reason:
        raise DomainError("declaring a node dead needs a reason")
    with transaction.atomic():
        planlock.take()
        node = get_node(node_id, lock=True)
        if node.fenced_at is not None:
            raise DomainError(f"node {node.name} is already declared dead ({node.fence_reason})")
        was_dead = node.status == NodeStatus.DEAD
        node.fenced_at = now
        node.fence_reason = reason[:300]
        _forget_tokens(node.pk)
        if was_dead:
            # The sweep found it dead already (its instances are lost): fence it from now on.
            node.status_reason = reason[:300]
            node.version += 1
            node.save(update_fields=["fenced_at", "fence_reason", "status_reason", "version"])
            audit.record(
                at=now,
                actor=actor,
                action="node.declare_dead",
                target=node,
                reason=reason,
                details={"from": "dead"},
            )
            events.send_on_commit("node-changed", node=node.pk)
        else:
            _mark_dead(
                node,
                now,
                reason=reason,
                actor=actor,
                action="node.declare_dead",
                extra=["fenced_at", "fence_reason"],
            )
    return node


def do_readmit(actor, node_id: int, *, reason: str, now: datetime) -> Node:
    """An admin takes a fenced node back: it is offline until its next heartbeat brings it online (or draining)."""
    reason = (reason or "").strip()
    if not reason:
        raise DomainError("re-admitting a node needs a reason")
    with transaction.atomic():
        node = get_node(node_id, lock=True)
        if node.fenced_at is None:
            raise DomainError(
                f"node {node.name} is not fenced (it is {node.status}); there is nothing to re-admit"
            )
        fenced_for = node.fence_reason
        node.fenced_at = None
        node.fence_reason = ""
        node.status = NodeStatus.OFFLINE
        node.status_changed_at = now
        node.status_reason = f"re-admitted: {reason}"[:300]
        _node_event(node.pk, "readmitted", now, NodeStatus.DEAD, node.status_reason)
        # Silence is counted from here: the sweep must not find it dead again before its agent had a chance.
        node.last_heartbeat_at = None
        node.version += 1
        node.save(
            update_fields=[
                "fenced_at",
                "fence_reason",
                "status",
                "status_changed_at",
                "status_reason",
                "last_heartbeat_at",
                "version",
            ]
        )
        audit.record(
            at=now,
            actor=actor,
            action="node.readmit",
            target=node,
            reason=reason,
            details={"fenced_for": fenced_for},
        )
        events.send_on_commit("node-changed", node=node.pk)
    return node


def _mark_dead(
    node: Node, now: datetime, *, reason: str, actor, action: str, extra: list[str] | None = None
) -> None:
    previous = node.status
    node.status = NodeStatus.DEAD
    node.status_changed_at = now
    node.status_reason = reason[:300]
    node.version += 1
    node.save(update_fields=["status", "status_changed_at", "status_reason", "version", *(extra or [])])
    audit.record(at=now, actor=actor, action=action, target=node, reason=reason, details={"from": previous})
    _node_event(node.pk, NodeStatus.DEAD, now, previous, reason)
    events.send_on_commit("node-changed", node=node.pk)


def _node_event(node_id: int, to: str, now: datetime, was: str, reason: str) -> None:
    """The event feed's row for a node's change of status (slotkeeper/outbox.py), in the transaction making it."""
    outbox.append(
        f"node.{to}", now, node=node_id, data={"from": str(was), "to": str(to), "reason": reason[:300]}
    )


def _offline_after() -> float:
    return settings.SLOTKEEPER["OFFLINE_AFTER_S"]


def _dead_after() -> float:
    return settings.SLOTKEEPER["OFFLINE_AFTER_S"] + settings.SLOTKEEPER["DEAD_AFTER_S"]


@dataclass
class SweepResult:
    offline: list[str]
    dead: list[str]
    trimmed_samples: int
    # Set when this sweep began after a gap (its own outage): every node got a fresh grace.
    resumed_after_s: float | None = None
    # Set while more than DISRUPTION_SHARE of the fleet is silent at once: nobody is declared dead.
    disrupted: bool = False
    note: str = ""
    # Nodes silent since before this are dead; None while the fleet is disrupted or the grace still runs. The
    # caller declares them, one transaction each, with `declare_silent_dead` (and loses what ran on them).
    dead_cutoff: datetime | None = None


def _sweep_state(now: datetime) -> tuple[SweepState, float | None]:
    """Locks the sweep's row and says how long the sweep was away, if it was away long enough to matter."""
    SweepState.objects.get_or_create(pk=1)
    state = SweepState.objects.select_for_update().get(pk=1)
    gap = None if state.last_sweep_at is None else (now - state.last_sweep_at).total_seconds()
    away = settings.SLOTKEEPER["SWEEP_OUTAGE_GAP_S"]
    if state.last_sweep_at is None or (gap is not None and gap > away):
        # The first sweep of a fresh install, or one after the sweep (or the whole server) was not running:
        # silence before now says nothing about the nodes, so it is counted from now.
        state.grace_from = now
        return state, gap
    return state, None


def sweep(now: datetime) -> SweepResult:
    """Marks silent nodes offline (after OFFLINE_AFTER_S), says from when on a silent node is dead (after
    DEAD_AFTER_S more: `dead_cutoff`, declared by the caller with `silent_dead` and `declare_silent_dead`), and
    trims the health history.

    Two guards keep the sweep from mistaking its own trouble for the fleet's: silence is counted from the latest
    of a node's last heartbeat and `grace_from` (when the sweep came back after being away), and while more than
    DISRUPTION_SHARE of the fleet is silent at once nodes are marked offline but none is declared dead.

    Claims one node at a time with a conditional update, so two sweeps (two beats, or beat and an operator) never
    both act on the same node, and a heartbeat that lands between the read and the update wins.
    """
    result = SweepResult(offline=[], dead=[], trimmed_samples=0)
    offline_after = _offline_after()
    with transaction.atomic():
        state, result.resumed_after_s = _sweep_state(now)
        offline_cutoff = now - timedelta(seconds=offline_after)
        dead_cutoff = now - timedelta(seconds=_dead_after())
        disrupted = _disruption(state, now, offline_cutoff, result)
        grace_from = state.grace_from  # after _disruption, which starts a fresh grace when a disruption ends
        state.last_sweep_at = now
        state.save(update_fields=["last_sweep_at", "grace_from", "disrupted_since", "disruption_note"])
    silent = Q(last_heartbeat_at__lt=offline_cutoff) | Q(
        last_heartbeat_at=None, status_changed_at__lt=offline_cutoff
    )
    # Silence counts from the later of a node's last heartbeat and the grace's start: until the grace is as old
    # as the cutoff nobody can have been silent long enough; after that the cutoff alone decides.
    if _grace_over(grace_from, offline_cutoff):
        reason = f"no heartbeat for {offline_after:g} s"
        for node in Node.objects.filter(silent, status=NodeStatus.ONLINE).only("id", "name", "status"):
            with transaction.atomic():
                claimed = (
                    Node.objects.filter(pk=node.pk, status=NodeStatus.ONLINE)
                    .filter(silent)
                    .update(status=NodeStatus.OFFLINE, status_changed_at=now, status_reason=reason)
                )
                if claimed:
                    audit.record(
                        at=now, actor=None, action="node.offline", target=node, reason="no heartbeat"
                    )
                    _node_event(node.pk, NodeStatus.OFFLINE, now, NodeStatus.ONLINE, reason)
                    events.send_on_commit("node-changed", node=node.pk)
                    result.offline.append(node.name)
    if not disrupted and _grace_over(grace_from, dead_cutoff):
        result.dead_cutoff = dead_cutoff
    result.trimmed_samples = trim_health_history(now)
    return result


def _grace_over(grace_from: datetime | None, cutoff: datetime) -> bool:
    return grace_from is None or grace_from <= cutoff


def _disruption(state: SweepState, now: datetime, cutoff: datetime, result: SweepResult) -> bool:
    """Whether so much of the fleet is silent at once that the silence is more likely ours than theirs."""
    watched = Node.objects.exclude(status=NodeStatus.DEAD).exclude(last_heartbeat_at=None)
    total = watched.count()
    silent = (
        watched.filter(last_heartbeat_at__lt=cutoff).count() if _grace_over(state.grace_from, cutoff) else 0
    )
    share = settings.SLOTKEEPER["DISRUPTION_SHARE"]
    minimum = settings.SLOTKEEPER["DISRUPTION_MIN_NODES"]
    disrupted = total >= minimum and silent > share * total
    if disrupted:
        note = (
            f"{silent} of {total} nodes went silent at once (more than {share:.0%}): marked offline, none declared "
            "dead until the disruption ends; check the network and the web processes"
        )
        if state.disrupted_since is None:
            state.disrupted_since = now
            log.warning("fleet disruption", extra={"silent": silent, "total": total})
            audit.record(at=now, actor=None, action="fleet.disrupted", target=state, reason=note)
        state.disruption_note = note[:300]
        result.disrupted, result.note = True, note
    elif state.disrupted_since is not None:
        # Over: whoever is still silent gets a fresh grace from now, as after the sweep's own outage.
        ended = (
            f"disruption over after {int((now - state.disrupted_since).total_seconds())} s; "
            "silence counts again from now"
        )
        audit.record(at=now, actor=None, action="fleet.disruption_over", target=state, reason=ended)
        log.info("fleet disruption over", extra={"since": state.disrupted_since.isoformat()})
        state.disrupted_since = None
        state.disruption_note = ""
        state.grace_from = now
        result.note = ended
    return disrupted


def _gone(dead_cutoff: datetime) -> Q:
    return Q(last_heartbeat_at__lt=dead_cutoff) | Q(last_heartbeat_at=None, status_changed_at__lt=dead_cutoff)


def silent_dead(dead_cutoff: datetime) -> list[int]:
    """The nodes silent since before `dead_cutoff` and not dead yet (a node registered but never heard from stays
    offline: there is nothing on it to lose)."""
    candidates = (
        Node.objects.filter(_gone(dead_cutoff))
        .exclude(status=NodeStatus.DEAD)
        .exclude(last_heartbeat_at=None, status=NodeStatus.OFFLINE)
    )
    return list(candidates.order_by("id").values_list("id", flat=True))


def declare_silent_dead(node_id: int, now: datetime, dead_cutoff: datetime) -> Node | None:
    """Declares one silent node dead, or None when it spoke meanwhile (or is dead already). Runs inside the
    caller's transaction, which loses the node's instances in it too."""
    with transaction.atomic():
        # The plan lock first (every writer's order), then the node: an approval planning onto this node
        # either commits before (and its instance is lost with the rest) or plans after and sees it dead.
        planlock.take()
        locked = Node.objects.select_for_update().filter(pk=node_id).filter(_gone(dead_cutoff)).first()
        if locked is None or locked.status == NodeStatus.DEAD:
            return None
        silent_for = (
            int((now - locked.last_heartbeat_at).total_seconds()) if locked.last_heartbeat_at else None
        )
        _mark_dead(
            locked,
            now,
            reason=f"no heartbeat for {silent_for} s" if silent_for is not None else "never reported",
            actor=None,
            action="node.dead",
        )
    return locked


def trim_health_history(now: datetime) -> int:
    """Keeps the last hour (HEALTH_HISTORY_S) of samples: one DELETE, whatever the fleet's size."""
    cutoff = now - timedelta(seconds=settings.SLOTKEEPER["HEALTH_HISTORY_S"])
    return HealthSample.objects.filter(at__lt=cutoff).delete()[0]
