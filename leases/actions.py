"""The only write paths of leases: submit, cancel, tick. Each runs inside the plan applier (store.planning): one
transaction, one lock, an audit row, events after commit."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from fleet.models import PlacementReport
from leases import store
from leases.lifecycle import IllegalTransition
from leases.models import Lease, LeaseType
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
        )
        excluded = {**plan.excluded, **_missing_capabilities(plan, spec.capabilities)}
        decision = plan.scheduler.submit(store.request_of(lease), plan.t, excluded)
        lease.message = decision.message
        lease.save(update_fields=["message"])
        report = _report(plan, lease, decision, actor)
        audit.record(
            at=now,
            actor=actor,
            action="lease.submit",
            target=lease,
            details={"type": spec.type, "accepted": decision.accepted, "message": decision.message},
        )
        events.send_on_commit("lease-changed", lease=lease.pk)
    metrics.inc("slotkeeper_lease_submissions_total", type=spec.type, accepted=str(decision.accepted).lower())
    lease.refresh_from_db()
    return Submitted(lease, decision, report)


def _missing_capabilities(plan: store.Planning, needed) -> dict[int, str]:
    if not needed:
        return {}
    need = set(needed)
    return {
        n.pk: f"missing_capability: lacks {', '.join(sorted(need - set(n.capabilities)))}"
        for n in plan.nodes
        if not need <= set(n.capabilities)
    }


def _report(plan: store.Planning, lease: Lease, decision: Decision, actor) -> PlacementReport:
    names = {n.pk: n.name for n in plan.nodes}
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
    """Starts and ends due reservations, processes the queue and re-evaluates (the periodic work)."""
    with store.planning(now) as plan:
        plan.scheduler.advance(plan.t, plan.excluded)


def claims(now: datetime, node_ids) -> dict[int, tuple[tuple, tuple]]:
    """Reservations in force count as commitments for the placer: running when active, pending when scheduled."""
    from fleet.capacity import Claim
    from leases.models import Allocation

    out: dict[int, tuple[list, list]] = {}
    rows = (
        Allocation.objects.filter(node_id__in=node_ids, live=True, start__lte=now, end__gt=now)
        .select_related("reservation")
        .only(
            "node_id",
            "mem_mib",
            "disk_gib",
            "cpu",
            "reservation__lease_id",
            "reservation__status",
            "reservation__kind",
        )
    )
    for a in rows:
        running, pending = out.setdefault(a.node_id, ([], []))
        claim = Claim(
            id=f"{a.reservation.lease_id}-{a.reservation.kind}-{a.reservation_id}",
            mem_mib=a.mem_mib,
            disk_gib=a.disk_gib,
            cpu_cores=a.cpu / 100,
        )
        (running if a.reservation.status == "active" else pending).append(claim)
    return {k: (tuple(r), tuple(p)) for k, (r, p) in out.items()}


LEASE_TYPES = [t.value for t in LeaseType]
