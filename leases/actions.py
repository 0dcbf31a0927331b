"""The only write paths of leases: submit, cancel, tick. Each runs inside the plan applier (store.planning): one
transaction, one lock, an audit row, events after commit."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from fleet.models import PlacementReport
from leases import store
from leases.lifecycle import IllegalTransition
from leases.models import Alert, Group, Lease, SchedulerState
from leases.scheduler import Decision
from slotkeeper import audit, events, metrics
from slotkeeper.audit import actor_label
from slotkeeper.domain import DomainError, NotFound

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


@dataclass
class Submitted:
    lease: Lease
    decision: Decision
    report: PlacementReport


def get_lease(lease_id: int) -> Lease:
    try:
        return Lease.objects.get(pk=lease_id)
    except Lease.DoesNotExist:
        raise NotFound(f"lease {lease_id} does not exist") from None


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
        excluded = {
            **plan.excluded,
            **_missing_capabilities(plan, spec.capabilities),
            **_group_exclusions(lease),
        }
        decision = plan.scheduler.submit(store.request_of(lease), plan.t, excluded)
        lease.message = decision.message
        lease.save(update_fields=["message"])
        report = _report(plan, lease, decision, actor)
        if not decision.accepted:
            from leases.recovery import raise_alert

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


def _group_exclusions(lease: Lease) -> dict[int, str]:
    """Nodes the lease's hard group rules forbid, with the rule's sentence (the scheduler maps around them)."""
    from leases.recovery import group_views

    out: dict[int, str] = {}
    for view in group_views(lease, exclude_instance=None):
        g = view.group
        if not g.hard or not view.members:
            continue
        if g.policy == "anti_affinity":
            for node_id, iids in view.members.items():
                if len(iids) >= g.max_per_node:
                    out[node_id] = (
                        f"anti_affinity: group {g.name} already has instance {', '.join(iids[:3])} here"
                    )
        else:
            from fleet.models import Node

            for node_id in Node.objects.exclude(pk__in=list(view.members)).values_list("id", flat=True):
                out[node_id] = f"affinity: group {g.name} keeps its members on the nodes where they run"
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
        lease = get_lease(lease_id)
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


def tick(now: datetime) -> None:
    """Starts and ends due reservations, processes the queue and re-evaluates (the periodic work).

    A tick that fails is recorded (SchedulerState, an alert on the first failure, /readyz, /metrics) and raised
    again for the caller's log; the next one that passes clears the record and resolves the alert."""
    started = timezone.now()
    try:
        _tick(now)
    except Exception as exc:
        _tick_failed(now, exc)
        raise
    took = (timezone.now() - started).total_seconds()
    failed_before = SchedulerState.objects.filter(pk=1, tick_failures__gt=0).exists()
    SchedulerState.objects.filter(pk=1).update(last_tick_at=now, last_tick_s=took, tick_failures=0)
    if failed_before:
        _resolve_alerts("tick_failed", now, "the tick passed again")
    _fleet_disruption_alert(now)
    metrics.inc("slotkeeper_ticks_total")


def _tick(now: datetime) -> None:
    with store.planning(now) as plan:
        plan.scheduler.advance(plan.t, plan.excluded)
        for lease_id, reason in plan.scheduler.replaced:
            lease = Lease.objects.get(pk=lease_id)
            lease.message = f"re-placed when its reservation came due: {reason}"
            lease.save(update_fields=["message"])
            audit.record(at=now, actor=None, action="lease.replace", target=lease, reason=reason)
    from leases.recovery import drive_drains, supervise

    supervise(now)
    drive_drains(now)


def _tick_failed(now: datetime, exc: Exception) -> None:
    from django.db import transaction
    from django.db.models import F

    from leases.recovery import raise_alert

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


def _resolve_alerts(kind: str, now: datetime, why: str) -> None:
    from slotkeeper import events

    for alert in Alert.objects.filter(kind=kind, resolved_at=None):
        alert.resolved_at = now
        alert.save(update_fields=["resolved_at"])
        audit.record(at=now, actor=None, action="alert.resolve", target=alert, reason=why)
        events.send_on_commit("alert-raised", alert=alert.pk)


def _fleet_disruption_alert(now: datetime) -> None:
    """An open alert while the sweep finds the fleet disrupted (and declares no node dead), resolved after."""
    from fleet.models import SweepState
    from leases.recovery import raise_alert

    state = SweepState.objects.filter(pk=1).first()
    open_alert = Alert.objects.filter(kind="fleet_disrupted", resolved_at=None).exists()
    if state is not None and state.disrupted_since is not None and not open_alert:
        raise_alert("fleet_disrupted", state.disruption_note or "much of the fleet went silent at once", now)
    elif (state is None or state.disrupted_since is None) and open_alert:
        _resolve_alerts("fleet_disrupted", now, "the fleet is heard from again")


def scheduler_health() -> str:
    """For /readyz: "ok", or how the tick is failing (counts and times only, no reasons: probes are public)."""
    state = SchedulerState.objects.filter(pk=1).first()
    if state is None or not state.tick_failures:
        return "ok"
    return f"tick failing: {state.tick_failures} in a row, last at {state.tick_failed_at:%Y-%m-%dT%H:%M:%SZ}"


def claims(now: datetime, node_ids) -> dict[int, tuple[tuple, tuple]]:
    """Commitments for the placer, by identity: an instance the agent runs is running; one placed but not yet
    started is pending (seed 001: the two are unioned by id, so a booted instance is never counted twice)."""
    from fleet.capacity import Claim
    from leases.models import Instance
    from leases.recovery import LIVE

    out: dict[int, tuple[list, list]] = {}
    rows = Instance.objects.filter(node_id__in=node_ids, state__in=LIVE).values_list(
        "iid", "node_id", "vnode", "state", "lease__vnodes"
    )
    for iid, node_id, vnode, state, vnodes in rows:
        v = vnodes[vnode - 1]
        claim = Claim(
            id=iid,
            mem_mib=int(v["mem_mib"]),
            disk_gib=int(v.get("disk_gib", 0)),
            cpu_cores=float(v.get("cpu_cores", 0)),
        )
        running, pending = out.setdefault(node_id, ([], []))
        (running if state == "running" else pending).append(claim)
    return {k: (tuple(r), tuple(p)) for k, (r, p) in out.items()}
