"""Reschedules: a proposal (a dry-run placement kept with every node's verdict), its approval and its rejection.

Approvals run in one plan-applier transaction (leases/planning/, `passes.planning`), so a move counts every other
move already committed; two approvals that race (seed 002, Nova bug 1735407) are serialised and the second is
re-planned instead of violating the group. A bulk approval re-plans each proposal against the ones approved before
it in the same call, and writes them all at the end (`_Batch`). Each approval writes its audit row; events go
after commit.

An approval is decided by the plan applier's scheduler (placing.decide_move): the pass's slot table is the one
capacity view, each move is written into it before the next approval is decided, and the stored report is the
scheduler's vectorised verdict the decision was made from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from leases.instance_rows import LIVE, placed_event, placed_instance
from leases.instances.models import Reschedule, RescheduleStatus
from leases.instances.placing import BLOCKERS, FleetView, decide_move, move_request, vnode_need
from leases.lifecycle import TERMINAL_LEASE_STATES, InstanceState, LeaseState, can_instance
from leases.models import Instance, InstanceEvent, Reservation
from leases.planning.passes import planning
from leases.planning.plan import Planning, move_vnode
from leases.planning.records import from_epoch, to_epoch
from leases.planning.reporting import report_row
from slotkeeper import audit, events, metrics, outbox
from slotkeeper.bulk import Row, insert_many, update_many
from slotkeeper.domain import DomainError, NotFound, StaleVersion

log = logging.getLogger(__name__)
_I = InstanceState


def propose(
    plan: Planning, inst: Instance, now: datetime, *, cause: str, note: str = "", fleet: FleetView
) -> Reschedule | None:
    """A pending proposal to move `inst`, decided as an approval would decide it (Scheduler.decide) and holding its
    room: the target's capacity for the lost VM is kept in the slot table (a `hold` reservation of the lease) until
    the proposal is approved, rejected, withdrawn or its hold expires, so new work cannot take it and the approval
    lands. A lost instance's vnode first leaves its dead node's reservations (its room there is freed: a node
    re-admitted later does not count it). Where nothing fits now the proposal says so, and the tick tries again as
    room frees, in lease order (`refresh`). Runs inside a planning pass (`plan`), whose journal writes the holds.
    `fleet`, shared by the proposals of one loss or drain, counts each earlier one as a member of its groups."""
    if Reschedule.objects.filter(instance=inst, status=RescheduleStatus.PENDING).exists():
        return None  # one open proposal per instance (one_pending_reschedule_per_instance)
    if inst.state == _I.LOST:
        plan.scheduler.detach(inst.lease_id, inst.vnode, inst.node_id, plan.t)
    proposal = Reschedule(instance=inst, lease=inst.lease, cause=cause, created_at=now)
    target = _decide_and_hold(plan, proposal, inst, now, fleet, note)
    try:
        with transaction.atomic():
            proposal.save()
    except IntegrityError:
        if proposal.hold_rid:
            plan.scheduler.release(proposal.hold_rid, plan.t)
        return None  # a pending proposal for this instance exists already
    events.send_on_commit("reschedule-changed", reschedule=proposal.pk)
    held = plan.scheduler.held(proposal.hold_rid) if proposal.hold_rid else None
    if inst.lease.auto_approve_reschedules and target and held is not None and held.start <= plan.t:
        transaction.on_commit(lambda: _auto_approve(proposal.pk))
    return proposal


def _decide_and_hold(
    plan: Planning, proposal: Reschedule, inst: Instance, now: datetime, fleet: FleetView, note: str
) -> str | None:
    """Decides where the instance would go now and holds that room; fills the proposal's target, hold, report,
    blocked_by and message (unsaved). Returns the target's name, or None when nothing fits now."""
    sched = plan.scheduler
    req = move_request(plan, inst, fleet)
    proposal.hold_rid, proposal.held_until, proposal.proposed_node_id = None, None, None
    if req is None:
        proposal.blocked_by = "nothing_to_move"
        proposal.message = (
            f"{note} nothing left to move: lease {inst.lease_id} holds no reservation for it".strip()
        )
        return None
    trial = sched.decide(req, plan.t, plan.excluded)
    report = report_row(
        plan, req, trial.start, trial.end, outcome=trial.outcome, message="", subject=f"reschedule:{inst.iid}",
        requested_by="scheduler", proposed=trial.nodes[:1] if trial.placed else [],
    )  # fmt: skip
    # Where and from when its room can be held: now, or from the first instant it frees (newer best-effort
    # leases' future reservations making way: the lost instance's lease held capacity before they came).
    room = sched.find_room(req, to_epoch(inst.lease.submitted_at), plan.t, plan.excluded)
    held = None
    if room is not None:
        start, target_id, in_way = room
        if in_way:
            sched.make_way(
                in_way, plan.t, f"made way for lease {inst.lease_id}, whose instance {inst.iid} lost its node"
            )
            plan.make_way = True  # the caller runs the queue: they are planned again after the hold
        held = sched.hold(inst.lease_id, inst.vnode, target_id, start, plan.t + req.duration, plan.t)
    if held is not None:
        name = plan.names.get(target_id, f"node {target_id}")
        until = now + timedelta(seconds=settings.SLOTKEEPER["RESCHEDULE_HOLD_S"])
        if held.start > plan.t:
            # Held from when the room frees: the hold lasts from then.
            until = from_epoch(held.start) + timedelta(seconds=settings.SLOTKEEPER["RESCHEDULE_HOLD_S"])
        proposal.proposed_node_id, proposal.hold_rid, proposal.held_until = target_id, held.rid, until
        proposal.blocked_by = ""
        when = "" if held.start <= plan.t else f" from {sched.label(held.start)}, when it frees"
        report.message = f"would move to {name}; its room there is held{when} until {until:%H:%M:%S} UTC"
        proposal.message = _after(note, report.message)
        if held.start > plan.t:
            report.outcome, report.code = trial.outcome, trial.outcome
    else:
        outcome = trial.outcome if not trial.placed else "fleet_at_capacity"
        report.outcome = report.code = outcome
        # The most telling reason code of the verdicts, as an approval left pending says it (BLOCKERS).
        proposal.blocked_by = next((code for code in BLOCKERS if report.counts.get(code)), outcome)
        report.message = f"no room now ({outcome.replace('_', ' ')}): {report.summary}"
        proposal.message = _after(note, f"{report.message}; tried again as room frees, in lease order")
    report.save()
    proposal.report = report
    if held is not None:
        fleet.proposed(inst, vnode_need(inst), plan.names[target_id])
    return plan.names.get(target_id) if held is not None else None


def refresh(now: datetime) -> int:
    """The tick's part: every pending proposal whose hold expired (RESCHEDULE_HOLD_S) gives its room back and is
    proposed again against the fleet as it is, and every one that found no room is tried again, oldest lease first
    (in lease order), each counting the holds of the ones before it. Returns how many got a target."""
    pending = Reschedule.objects.filter(status=RescheduleStatus.PENDING, lease__state=LeaseState.ACTIVE)
    due = list(
        pending.filter(Q(hold_rid__isnull=True) | Q(held_until__lte=now))
        .exclude(blocked_by="nothing_to_move")
        .values_list("pk", flat=True)
    )
    # Auto-approved moves whose room was held from a later instant land once it has come.
    waiting = pending.filter(lease__auto_approve_reschedules=True, hold_rid__isnull=False).exclude(pk__in=due)
    held_from = dict(
        Reservation.objects.filter(rid__in=list(waiting.values_list("hold_rid", flat=True))).values_list(
            "rid", "start"
        )
    )
    for pk, rid in waiting.values_list("pk", "hold_rid"):
        if rid in held_from and held_from[rid] <= now:
            transaction.on_commit(lambda pk=pk: _auto_approve(pk))
    if not due:
        return 0
    found = 0
    with planning(now) as plan:
        # What a submission does before it plans: the reservations due by now start and end (not the queue: a
        # lost instance's lease holds capacity, and goes before newcomers).
        plan.scheduler.catch_up(plan.t)
        fleet = FleetView.for_proposals(now, plan.nodes)
        proposals = (
            Reschedule.objects.select_for_update(of=("self",))
            .filter(pk__in=due, status=RescheduleStatus.PENDING)
            .select_related("instance__lease", "lease")
            .prefetch_related("instance__lease__groups")
            .order_by("lease__submitted_at", "lease_id", "pk")
        )
        for proposal in proposals:
            inst = proposal.instance
            expired = proposal.hold_rid is not None
            if expired:
                plan.scheduler.release(proposal.hold_rid, plan.t)
            elif not _room_for(plan, inst, fleet):
                # Still no room: the proposal stays as it is (no new version, which would make an operator's
                # approval of the page they see stale, and no new report every tick).
                continue
            target = _decide_and_hold(plan, proposal, inst, now, fleet, _note(proposal, expired))
            proposal.version += 1
            proposal.save(
                update_fields=[
                    "proposed_node", "hold_rid", "held_until", "blocked_by", "message", "report", "version",
                ]
            )  # fmt: skip
            events.send_on_commit("reschedule-changed", reschedule=proposal.pk)
            held = plan.scheduler.held(proposal.hold_rid) if proposal.hold_rid else None
            if target:
                found += 1
                audit.record(
                    at=now, actor=None, action="reschedule.hold", target=proposal,
                    reason=proposal.message[:500], details={"node": target},
                )  # fmt: skip
                if proposal.lease.auto_approve_reschedules and held is not None and held.start <= plan.t:
                    pk = proposal.pk
                    transaction.on_commit(lambda pk=pk: _auto_approve(pk))
        if plan.make_way:
            plan.scheduler.run_queue(plan.t)  # the leases that made way, planned again after the holds
    return found


def _after(note: str, text: str) -> str:
    """`text` after the policy's note, as a sentence of its own when the note ends one."""
    if note.endswith("."):
        text = text[:1].upper() + text[1:]
    return f"{note} {text}".strip()


def _room_for(plan: Planning, inst: Instance, fleet: FleetView) -> bool:
    req = move_request(plan, inst, fleet)
    if req is None:
        return False
    return plan.scheduler.find_room(req, to_epoch(inst.lease.submitted_at), plan.t, plan.excluded) is not None


def _note(proposal: Reschedule, expired: bool) -> str:
    if expired:
        return "its earlier hold expired;"
    return "room found as it freed:" if proposal.blocked_by else ""


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
        # The feed's rows for the same steps: each new instance placed, each old one rescheduled or stopping.
        outbox.append_many(
            placed_event(inst, self.now)
            if event.to_state == InstanceState.PLACED
            else outbox.event(
                f"instance.{event.to_state}", self.now, lease=inst.lease_id, instance=inst.iid, node=inst.node_id,
                data={"from": event.from_state, "to": event.to_state, "reason": event.reason},
            )
            for inst, event in self.history
        )  # fmt: skip
        for proposal, inst in self.new_instances:
            if proposal is not None:
                old = proposal.instance
                outbox.append(
                    "lease.moved", self.now, lease=inst.lease_id, instance=inst.iid, node=inst.node_id,
                    data={"from_instance": old.iid, "from_node": old.node_id, "reason": proposal.cause,
                          "message": proposal.message},
                )  # fmt: skip
        if self.old_instances:
            update_many(self.old_instances, ["state", "state_changed_at", "desired_state"])
        if self.proposals:
            fields = [
                "status",
                "version",
                "hold_rid",
                "held_until",
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
    with planning(now) as plan:
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
    sched = plan.scheduler
    held = sched.held(proposal.hold_rid) if proposal.hold_rid is not None else None
    if held is not None and held.start > plan.t and lease.state == LeaseState.ACTIVE:
        # Its room is held from when it frees: the move can land from then, not before (the hold stays).
        when = sched.label(held.start)
        raise DomainError(f"reschedule {pk}: its room on {fleet.names.get(proposal.proposed_node_id)} is held "
                          f"from {when}, when it frees; approve it then")  # fmt: skip
    if proposal.hold_rid is not None:
        # The room held for this move is given back first: the move is decided again with it free, and takes it
        # unless something has changed there since (the target died, a group member moved in).
        sched.release(proposal.hold_rid, plan.t)
        proposal.hold_rid, proposal.held_until = None, None
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
    if inst.vnode in sched.detached(lease.pk):
        moved = sched.attach(
            lease.pk, inst.vnode, target_id, plan.t
        )  # lost: its dead node's room went already
    else:
        moved = move_vnode(plan, lease.pk, inst.vnode, inst.node_id, target_id)
    if not moved:
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
    """Rejects a pending proposal: the room held for it is given back, in a planning pass."""
    with planning(now) as plan:
        proposal = Reschedule.objects.select_for_update().filter(pk=pk).first()
        if proposal is None:
            raise NotFound(f"reschedule {pk} does not exist")
        if proposal.status != RescheduleStatus.PENDING:
            raise DomainError(f"reschedule {pk} is already {proposal.status}")
        proposal.status = RescheduleStatus.REJECTED
        proposal.decided_at, proposal.decided_by = now, audit.actor_label(actor)
        proposal.message = reason or "rejected by an operator"
        proposal.version += 1
        if proposal.hold_rid is not None:
            plan.scheduler.release(proposal.hold_rid, plan.t)
            proposal.hold_rid, proposal.held_until = None, None
        proposal.save(
            update_fields=[
                "status",
                "decided_at",
                "decided_by",
                "message",
                "version",
                "hold_rid",
                "held_until",
            ]
        )
        audit.record(at=now, actor=actor, action="reschedule.reject", target=proposal, reason=reason)
        events.send_on_commit("reschedule-changed", reschedule=pk)
    return proposal
