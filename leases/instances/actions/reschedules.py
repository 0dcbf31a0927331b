"""Reschedules: a proposal (a dry-run placement kept with every node's verdict), its approval and its rejection.

Approvals run in one plan-applier transaction (store.planning), so a move counts every other move already
committed; two approvals that race (seed 002, Nova bug 1735407) are serialised and the second is re-planned
instead of violating the group. A bulk approval re-plans each proposal against the ones approved before it in the
same call, and writes them all at the end (`_Batch`). Each approval writes its audit row; events go after commit.

An approval is decided by the plan applier's scheduler (placing.decide_move): the pass's slot table is the one
capacity view, each move is written into it before the next approval is decided, and the stored report is the
scheduler's vectorised verdict the decision was made from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from fleet import capacity, placement
from leases import store
from leases.instance_rows import LIVE, placed_instance
from leases.instances.models import Reschedule, RescheduleStatus
from leases.instances.placing import FleetView, blocker, decide_move, move_request, plan_move
from leases.lifecycle import TERMINAL_LEASE_STATES, InstanceState, LeaseState, can_instance
from leases.models import Instance, InstanceEvent
from slotkeeper import audit, events, metrics
from slotkeeper.bulk import Row, insert_many, update_many
from slotkeeper.domain import DomainError, NotFound, StaleVersion

log = logging.getLogger(__name__)
_I = InstanceState


def propose(
    inst: Instance, now: datetime, *, cause: str, note: str = "", fleet: FleetView | None = None
) -> Reschedule | None:
    """A dry-run placement (target and every node's verdict) kept as a pending proposal. `fleet`, shared by the
    proposals of one loss or drain, counts each proposal made before this one (FleetView.for_proposals): pass
    the same view to every call of a round, so they spread over nodes that can hold them all."""
    fleet = fleet or FleetView.for_proposals(now)
    need, result, ids = plan_move(inst, now, fleet=fleet)
    report = placement.record(now, f"reschedule:{inst.iid}", need, result, ids_by_name=ids)
    target = result.nodes[0] if result.outcome == capacity.Outcome.PLACED else None
    try:
        with transaction.atomic():
            proposal = Reschedule.objects.create(
                instance=inst,
                lease=inst.lease,
                cause=cause,
                proposed_node_id=ids.get(target) if target else None,
                report=report,
                blocked_by="" if target else blocker(result),
                message=f"{note} {result.message}".strip(),
                created_at=now,
            )
    except IntegrityError:
        return None  # a pending proposal for this instance exists already
    if target:
        fleet.proposed(inst, need, target)
    events.send_on_commit("reschedule-changed", reschedule=proposal.pk)
    if inst.lease.auto_approve_reschedules and target:
        transaction.on_commit(lambda: _auto_approve(proposal.pk))
    return proposal


def _auto_approve(pk: int) -> None:
    try:
        do_approve(None, [pk], now=timezone.now())
    except DomainError:
        log.info("auto-approval left the proposal pending", extra={"reschedule": pk})


@dataclass
class ApprovalResult:
    id: int
    ok: bool
    status: str
    message: str
    node: str | None = None
    new_instance: str | None = None
    # What happened, for programs: applied | pending (re-planned, nothing fits) | stale (the version the caller saw
    # is old) | conflict (already applied or rejected, or nothing to move) | not_found.
    code: str = ""

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "ok": self.ok,
            "code": self.code,
            "status": self.status,
            "message": self.message,
            "node": self.node,
            "new_instance": self.new_instance,
        }


@dataclass
class _Batch:
    """The writes of a bulk approval, made once at the end: a burst of moves is a few statements, not a dozen each.
    Every check that can refuse an item runs before its writes are queued, so a refused item leaves nothing."""

    now: datetime
    actor: object
    reports: list = field(default_factory=list)  # (proposal, PlacementReport)
    proposals: list = field(default_factory=list)
    new_instances: list = field(default_factory=list)  # (proposal or None, Instance)
    old_instances: list = field(default_factory=list)
    history: list = field(default_factory=list)  # (instance, its InstanceEvent as a bulk.Row)
    audits: list = field(default_factory=list)
    generations: dict = field(default_factory=dict)  # (lease, vnode) -> highest generation so far

    def next_generation(self, lease_id: int, vnode: int) -> int:
        key = (lease_id, vnode)
        self.generations[key] = self.generations.get(key, -1) + 1
        return self.generations[key]

    def flush(self) -> None:
        # One INSERT per table for the whole batch (slotkeeper.bulk.insert_many): the reports' JSON columns made
        # bulk_create's client-side quoting most of the batch's write time.
        insert_many([report for _, report in self.reports])
        for proposal, report in self.reports:
            proposal.report = report
        insert_many([inst for _, inst in self.new_instances])
        for proposal, inst in self.new_instances:
            if proposal is not None:
                proposal.new_instance = inst
        for inst, event in self.history:
            event.instance_id = inst.pk
        insert_many([event for _, event in self.history], model=InstanceEvent)
        if self.old_instances:
            update_many(self.old_instances, ["state", "state_changed_at", "desired_state"])
        if self.proposals:
            fields = [
                "status",
                "version",
                "report",
                "blocked_by",
                "message",
                "decided_at",
                "decided_by",
                "new_instance",
            ]
            update_many(self.proposals, fields)
        insert_many(self.audits)
        for proposal in self.proposals:
            events.send_on_commit("reschedule-changed", reschedule=proposal.pk)
        for _, inst in self.new_instances:
            events.send_on_commit("instance-changed", instance=inst.iid, lease=inst.lease_id)

    def event(self, inst: Instance, target: InstanceState, reason: str) -> None:
        self.history.append(
            (inst, Row(at=self.now, from_state=str(inst.state), to_state=str(target), reason=reason))
        )
        inst.state = target
        inst.state_changed_at = self.now


def do_approve(
    actor, ids: Sequence[int], *, now: datetime, versions: dict[int, int] | None = None
) -> list[ApprovalResult]:
    """Approves proposals in one plan-applier transaction: each is re-planned by the scheduler against everything
    committed before it, including the moves approved earlier in this same call (each is in the slot table and the
    group members before the next is decided), so neither capacity nor a group can be broken by a burst."""
    results = []
    with store.planning(now) as plan:
        # Retire what is already over, so only live reservations are compared.
        plan.scheduler.advance(plan.t, plan.excluded)
        # The pass read the nodes already; the slot table is the capacity view, so nothing more is read for them.
        fleet = FleetView.read(now, plan.nodes)
        proposals = {
            p.pk: p
            for p in Reschedule.objects.select_for_update(of=("self",))
            .select_related("instance__lease")
            .prefetch_related("instance__lease__groups")
            .filter(pk__in=list(ids))
        }
        # The instances the approvals change, locked in id order like every other writer of instance rows.
        list(
            Instance.objects.select_for_update()
            .filter(pk__in=sorted({p.instance_id for p in proposals.values()}))
            .order_by("id")
            .values_list("id", flat=True)
        )
        fleet.read_groups([g for p in proposals.values() for g in p.instance.lease.groups.all()])
        lease_ids = {p.lease_id for p in proposals.values()}
        batch = _Batch(now=now, actor=actor)
        for lease_id, vnode, top in _generations(lease_ids):
            batch.generations[(lease_id, vnode)] = top
        for pk in ids:
            try:
                proposal = proposals.get(pk)
                if proposal is None:
                    raise NotFound(f"reschedule {pk} does not exist")
                results.append(_approve_one(proposal, plan, (versions or {}).get(pk), fleet, batch))
            except (DomainError, NotFound) as exc:
                status = proposals[pk].status if pk in proposals else "unknown"
                code = (
                    "not_found"
                    if isinstance(exc, NotFound)
                    else "stale"
                    if isinstance(exc, StaleVersion)
                    else "conflict"
                )
                results.append(ApprovalResult(pk, False, status, str(exc), code=code))
                if len(ids) == 1:
                    raise
        batch.flush()
    for result in results:
        metrics.inc(
            "slotkeeper_placements_total", kind="reschedule", outcome="placed" if result.ok else result.status
        )
    return results


def _generations(lease_ids: Iterable[int]) -> list[tuple[int, int, int]]:
    rows = (
        Instance.objects.filter(lease_id__in=list(lease_ids))
        .values("lease_id", "vnode")
        .annotate(top=Max("generation"))
        .values_list("lease_id", "vnode", "top")
    )
    return list(rows)


def _approve_one(proposal, plan, version: int | None, fleet: FleetView, batch: _Batch) -> ApprovalResult:
    pk, now = proposal.pk, batch.now
    if proposal.status != RescheduleStatus.PENDING:
        raise DomainError(f"reschedule {pk} is already {proposal.status}")
    if version is not None and version != proposal.version:
        raise StaleVersion(
            f"reschedule {pk} changed since you saw it (version {version}, now {proposal.version})"
        )
    inst = proposal.instance
    lease = inst.lease
    who = audit.actor_label(batch.actor)
    if lease.state != LeaseState.ACTIVE or inst.state not in (_I.LOST, *LIVE):
        # Closed by the system, not refused by the approver: the row must not read "rejected by <approver>".
        proposal.status = RescheduleStatus.REJECTED
        proposal.message = (
            f"withdrawn when {who} approved it, nothing to move: lease {lease.pk} is {lease.state}, "
            f"instance {inst.iid} is {inst.state}"
        )
        proposal.decided_at, proposal.decided_by = now, SYSTEM
        batch.proposals.append(proposal)
        return ApprovalResult(pk, False, proposal.status, proposal.message, code="conflict")
    req = move_request(plan, inst, fleet)
    if req is None:
        raise DomainError(f"the slot table holds no reservation of {inst.iid} to move any more")
    proposed = fleet.names.get(proposal.proposed_node_id) if proposal.proposed_node_id else None
    decision = decide_move(
        plan,
        req,
        preferred=proposal.proposed_node_id,
        subject=f"reschedule:{inst.iid}",
        requested_by=who,
    )
    report = decision.report
    if decision.target is None:
        batch.reports.append((proposal, report))
        batch.proposals.append(proposal)
        proposal.version += 1
        proposal.blocked_by = decision.blocked_by
        proposal.message = f"still pending: {report.message}"
        return ApprovalResult(pk, False, proposal.status, proposal.message, code="pending")
    target_id = decision.target
    target_name = fleet.names[target_id]
    if not store.move_vnode(plan, lease.pk, inst.vnode, inst.node_id, target_id):
        raise DomainError(f"the slot table has no room for {inst.iid} on {target_name} any more")
    generation = batch.next_generation(lease.pk, inst.vnode)
    new, first = placed_instance(lease.pk, inst.vnode, generation, target_id, now, replaces=inst)
    batch.new_instances.append((proposal, new))
    batch.history.append((new, first))
    fleet.moved(inst, new, None, target_name)
    if inst.state == _I.LOST:
        batch.event(inst, _I.RESCHEDULED, f"replaced by {new.iid} on {target_name}")
    else:
        # A drain moves a live instance: the old one is told to stop once its replacement is placed.
        inst.desired_state = "stopped"
        target = _I.STOPPING if inst.state in (_I.RUNNING, _I.UNHEALTHY, _I.RESTARTING) else _I.REVOKED
        if can_instance(inst.state, target):
            batch.event(inst, target, f"moved to {target_name} as {new.iid}")
    batch.old_instances.append(inst)
    changed = proposed and proposed != target_name
    message = (
        f"moved to {target_name} as {new.iid}; the proposed node {proposed} no longer fits "
        f"({decision.passed_over})"
        if changed
        else f"moved to {target_name} as {new.iid}"
    )
    report.message = message
    report.preferred_note = f"the proposed node {proposed} no longer fits" if changed else ""
    batch.reports.append((proposal, report))
    batch.proposals.append(proposal)
    proposal.status = RescheduleStatus.APPLIED
    proposal.message = message
    proposal.blocked_by = ""
    proposal.decided_at, proposal.decided_by = now, who
    proposal.version += 1
    batch.audits.append(
        audit.entry(
            at=now,
            actor=batch.actor,
            action="reschedule.approve",
            target=proposal,
            details={"node": target_name, "message": message},
        )
    )
    return ApprovalResult(pk, True, proposal.status, message, target_name, new.iid, code="applied")


# Who closed a proposal that no operator decided (`withdraw_moot`, or an approval that found nothing to move).
SYSTEM = "system"


def withdraw_moot(now: datetime) -> int:
    """Closes every pending proposal whose lease has ended (done, cancelled, failed...): nothing is left to move,
    and a proposal left pending would wait for an approval that can only fail. Run by the tick; each one closed is
    recorded (status rejected, decided by "system", the reason in its message, an audit row). Returns how many."""
    moot = list(
        Reschedule.objects.select_for_update(of=("self",))
        .filter(status=RescheduleStatus.PENDING, lease__state__in=TERMINAL_LEASE_STATES)
        .select_related("lease", "instance")
    )
    for proposal in moot:
        proposal.status = RescheduleStatus.REJECTED
        proposal.message = (
            f"withdrawn: lease {proposal.lease_id} is {proposal.lease.state}, nothing left to move"
        )
        proposal.decided_at, proposal.decided_by = now, SYSTEM
        proposal.version += 1
        audit.record(
            at=now, actor=None, action="reschedule.withdraw", target=proposal, reason=proposal.message
        )
        events.send_on_commit("reschedule-changed", reschedule=proposal.pk)
    update_many(moot, ["status", "message", "decided_at", "decided_by", "version"])
    if moot:
        log.info("reschedules withdrawn", extra={"count": len(moot)})
    return len(moot)


def do_reject(actor, pk: int, *, now: datetime, reason: str = "") -> Reschedule:
    with transaction.atomic():
        proposal = Reschedule.objects.select_for_update().filter(pk=pk).first()
        if proposal is None:
            raise NotFound(f"reschedule {pk} does not exist")
        if proposal.status != RescheduleStatus.PENDING:
            raise DomainError(f"reschedule {pk} is already {proposal.status}")
        proposal.status = RescheduleStatus.REJECTED
        proposal.decided_at, proposal.decided_by = now, audit.actor_label(actor)
        proposal.message = reason or "rejected by an operator"
        proposal.version += 1
        proposal.save(update_fields=["status", "decided_at", "decided_by", "message", "version"])
        audit.record(at=now, actor=actor, action="reschedule.reject", target=proposal, reason=reason)
        events.send_on_commit("reschedule-changed", reschedule=pk)
    return proposal
