"""The write paths of the lease core: submit, cancel, and the lease part of the tick. Each runs inside the plan
applier (store.planning): one transaction, one lock, an audit row, events after commit. Reads are in
leases/reads.py; what happens to instances beyond their rows (restarts, loss, reschedules, drains) is the
instances package's (leases/instances/), which composes the whole periodic step around `recorded_tick`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleet import affinity
from fleet.models import PlacementReport, SweepState
from leases import reads, store
from leases.alerts import raise_alert, resolve_open
from leases.lifecycle import IllegalTransition
from leases.models import Alert, Group, Lease, SchedulerState
from leases.scheduler import Decision
from slotkeeper import audit, events, metrics
from slotkeeper.audit import actor_label
from slotkeeper.domain import DomainError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSpec:
    name: str
    type: str
    duration_s: float
    vnodes: list[dict]
    start: datetime | None = None
    capabilities: tuple[str, ...] = ()
    preemptible: bool = True
    real_duration_s: float | None = None
    groups: tuple[str, ...] = ()
    # Instance policy: migratable, restart_policy, max_reschedules, auto_approve_reschedules, driver, spec.
    policy: dict = field(default_factory=dict)

    @classmethod
    def from_request(cls, data: dict) -> LeaseSpec:
        """The spec of a validated lease request (leases/api/serializers.py's LeaseCreateSerializer), as the API
        and the console's form both submit it."""
        return cls(
            name=data["name"],
            type=data["type"],
            duration_s=data["duration_s"],
            vnodes=[dict(v) for v in data["nodes"]],
            start=data["start"],
            capabilities=tuple(data["capabilities"]),
            preemptible=data["preemptible"],
            real_duration_s=data["real_duration_s"],
            groups=tuple(data["groups"]),
            policy={
                "migratable": data["migratable"],
                "restart_policy": dict(data["restart_policy"]),
                "max_reschedules": data["max_reschedules"],
                "auto_approve_reschedules": data["auto_approve_reschedules"],
                "driver": data["driver"],
                "spec": dict(data["spec"]),
            },
        )


@dataclass
class Submitted:
    lease: Lease
    decision: Decision
    report: PlacementReport


def do_submit_lease(actor, spec: LeaseSpec, *, now: datetime) -> Submitted:
    """Stores the lease and schedules it at once: an AR gets its window or is rejected, an immediate lease runs now
    or is rejected, a best-effort lease is queued and started as soon as the queue allows."""
    with store.planning(now) as plan:
        lease = Lease.objects.create(
            name=spec.name,
            type=spec.type,
            submitted_at=now,
            requested_start=spec.start,
            duration_s=spec.duration_s,
            vnodes=spec.vnodes,
            capabilities=list(spec.capabilities),
            preemptible=spec.preemptible,
            real_duration_s=spec.real_duration_s,
            submitted_by=actor if getattr(actor, "pk", None) else None,
            **spec.policy,
        )
        if spec.groups:
            lease.groups.set(Group.objects.filter(name__in=spec.groups))
        groups = reads.lease_groups(lease) if spec.groups else []
        excluded = {
            **plan.excluded,
            **_missing_capabilities(plan, spec.capabilities),
            **_group_exclusions(plan, groups),
        }
        request = store.request_of(lease, groups, [n.id for n in plan.nodes])
        decision = plan.scheduler.submit(request, plan.t, excluded)
        lease.message = decision.message
        lease.save(update_fields=["message"])
        report = _report(plan, lease, decision, actor)
        if not decision.accepted:
            raise_alert(
                "failed_placement",
                f"lease {lease.pk} {lease.name} ({lease.type}) was rejected: {decision.message}",
                now,
                lease=lease,
            )
        audit.record(
            at=now,
            actor=actor,
            action="lease.submit",
            target=lease,
            details={"type": spec.type, "accepted": decision.accepted, "message": decision.message},
        )
        events.send_on_commit("lease-changed", lease=lease.pk)
    metrics.inc("slotkeeper_lease_submissions_total", type=spec.type, accepted=str(decision.accepted).lower())
    metrics.inc(
        "slotkeeper_placements_total", kind="lease", outcome="placed" if decision.accepted else "rejected"
    )
    lease.refresh_from_db()
    return Submitted(lease, decision, report)


def _missing_capabilities(plan: store.Planning, needed) -> dict[int, str]:
    if not needed:
        return {}
    need = set(needed)
    return {
        n.id: f"missing_capability: lacks {', '.join(sorted(need - set(n.capabilities)))}"
        for n in plan.nodes
        if not need <= set(n.capabilities)
    }


def _group_exclusions(plan: store.Planning, groups: list[affinity.GroupMembers]) -> dict[int, str]:
    """Nodes the lease's hard group rules forbid, with the rule's sentence (the scheduler maps around them)."""
    names = {n.id: n.name for n in plan.nodes}
    out: dict[int, str] = {}
    for group in groups:
        if not group.members:
            continue
        for node_id in names:
            unfit = affinity.unfit(group, node_id, names=names)
            if unfit is not None and node_id not in out:
                out[node_id] = f"{unfit.code}: {unfit.reason}"
    return out


def _report(plan: store.Planning, lease: Lease, decision: Decision, actor) -> PlacementReport:
    names = {n.id: n.name for n in plan.nodes}
    verdicts = []
    for node_id, name in names.items():
        why = decision.verdicts.get(node_id) if decision.verdicts else None
        code, _, sentence = (why or "").partition(": ") if why else (None, None, None)
        if why and not sentence:
            code, sentence = "reserved", why
        verdicts.append(
            {
                "node": name,
                "node_id": node_id,
                "fit": why is None,
                "reason_code": code,
                "reason": sentence,
                "slots": None,
                "headroom": None,
                "numbers": {},
            }
        )
    verdicts.sort(key=lambda v: (not v["fit"], v["node"]))
    return PlacementReport.objects.create(
        created_at=plan.now,
        subject=f"lease:{lease.pk}",
        request={"type": lease.type, "vnodes": lease.vnodes, "duration_s": lease.duration_s},
        outcome="placed" if decision.accepted else "rejected",
        message=decision.message,
        chosen=[],
        verdicts=verdicts,
        requested_by=actor_label(actor),
    )


def do_cancel_lease(actor, lease_id: int, *, now: datetime, reason: str = "") -> Lease:
    with store.planning(now) as plan:
        lease = reads.get_lease(lease_id)
        if lease.pk not in plan.scheduler.leases:
            raise DomainError(f"lease {lease_id} is {lease.state}; it cannot be cancelled")
        try:
            plan.scheduler.cancel(lease.pk, plan.t)
        except IllegalTransition as exc:
            raise DomainError(str(exc)) from None
        audit.record(at=now, actor=actor, action="lease.cancel", target=lease, reason=reason)
        events.send_on_commit("lease-changed", lease=lease.pk)
    lease.refresh_from_db()
    return lease


@contextmanager
def recorded_tick(now: datetime) -> Iterator[None]:
    """Records how the periodic step went, whatever it ran: a failure is recorded (SchedulerState, an alert on the
    first failure, /readyz, /metrics) and raised again for the caller's log; the next step that passes clears
    the record and resolves the alert."""
    started = timezone.now()
    try:
        yield
    except Exception as exc:
        _tick_failed(now, exc)
        raise
    took = (timezone.now() - started).total_seconds()
    failed_before = SchedulerState.objects.filter(pk=1, tick_failures__gt=0).exists()
    SchedulerState.objects.filter(pk=1).update(last_tick_at=now, last_tick_s=took, tick_failures=0)
    if failed_before:
        resolve_open("tick_failed", now, "the tick passed again")
    _fleet_disruption_alert(now)
    metrics.inc("slotkeeper_ticks_total")


def advance(now: datetime) -> None:
    """The lease part of the tick: starts and ends due reservations, processes the queue and re-evaluates."""
    with store.planning(now) as plan:
        plan.scheduler.advance(plan.t, plan.excluded)
        for lease_id, reason in plan.scheduler.replaced:
            lease = Lease.objects.get(pk=lease_id)
            lease.message = f"re-placed when its reservation came due: {reason}"
            lease.save(update_fields=["message"])
            audit.record(at=now, actor=None, action="lease.replace", target=lease, reason=reason)


def _tick_failed(now: datetime, exc: Exception) -> None:
    metrics.inc("slotkeeper_tick_failures_total")
    error = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        with transaction.atomic():
            SchedulerState.objects.get_or_create(pk=1)
            SchedulerState.objects.filter(pk=1).update(
                tick_failures=F("tick_failures") + 1, tick_failed_at=now, tick_error=error
            )
            if not Alert.objects.filter(kind="tick_failed", resolved_at=None).exists():
                raise_alert("tick_failed", f"the scheduler's tick failed: {error}", now)
    except Exception:
        # The database itself may be what failed; the log still says so.
        log.exception("could not record the failed tick")


def _fleet_disruption_alert(now: datetime) -> None:
    """An open alert while the sweep finds the fleet disrupted (and declares no node dead), resolved after."""
    state = SweepState.objects.filter(pk=1).first()
    open_alert = Alert.objects.filter(kind="fleet_disrupted", resolved_at=None).exists()
    if state is not None and state.disrupted_since is not None and not open_alert:
        raise_alert("fleet_disrupted", state.disruption_note or "much of the fleet went silent at once", now)
    elif (state is None or state.disrupted_since is None) and open_alert:
        resolve_open("fleet_disrupted", now, "the fleet is heard from again")
