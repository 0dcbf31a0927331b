"""Counter-offers (issue 48): when an advance reservation does not fit its window, when it could, and who is in the
way. A read: asked of the scheduler as the last pass left it (`reading.consulting`), never written.

`alternatives` are up to three earliest windows of the same duration, at or after the asked start, in which the
whole lease would be placed now, each decided by the step its submission takes (`Scheduler.decide`), so that
resubmitting one gets it while the fleet stays as it is. `blocking` names the leases whose reservations stand in the
asked window on the nodes that could take it and that the reservation may not preempt.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from leases import reads
from leases.models import Lease
from leases.planning.plan import Planning
from leases.planning.reading import consulting
from leases.planning.records import from_epoch, request_of
from leases.scheduler import LeaseRequest

# The probe's id: no lease's (the preview's).
PROBE_ID = -1
# The outcomes a counter-offer can answer: room, not capability (no_capable_node never fits, whenever it starts).
NEGOTIABLE = ("fleet_at_capacity", "fleet_unreadable")


def offers(plan: Planning, req: LeaseRequest) -> dict[str, Any]:
    """`alternatives` and `blocking` for `req` (an advance reservation) on the scheduler of `plan`."""
    sched = plan.scheduler
    names = plan.names
    found = sched.alternatives(req, plan.t, plan.excluded)
    assert req.start is not None
    blockers = sched.blocking(req, req.start, req.start + req.duration)
    labels = dict(Lease.objects.filter(pk__in=blockers).values_list("pk", "name")) if blockers else {}
    return {
        "alternatives": [
            {
                "start": _iso(from_epoch(t.start)),
                "end": _iso(from_epoch(t.end)),
                "nodes": [names.get(n, str(n)) for n in t.nodes],
            }
            for t in found
        ],
        "blocking": [{"id": lid, "name": labels.get(lid, "")} for lid in blockers],
    }


def counter_offers(lease: Lease, now: datetime) -> dict[str, Any] | None:
    """The counter-offers for a rejected advance reservation (its row as the pass left it), or None when none
    apply (another type, or no node could ever take it)."""
    return counter_offers_many([lease], now).get(lease.pk)


def counter_offers_many(leases: list[Lease], now: datetime) -> dict[int, dict[str, Any]]:
    """`counter_offers` of several rejected leases (a lease array's), asked of one plan: {lease id: offers} for
    those they apply to. Each is asked as if it arrived alone: one's offer may be another's too."""
    wanted = [x for x in leases if x.type == "advance_reservation" and x.requested_start is not None]
    if not wanted:
        return {}
    out = {}
    # The groups as a submission reads them (planning/intents.py), in one read for the whole array: room held for a
    # lost member counts as the member standing there, or an offer could name a node its resubmission is refused.
    groups = reads.groups_by_lease([x.pk for x in wanted])
    with consulting(now) as plan:
        for lease in wanted:
            # Asked as a new request (the rejected lease is no lease of the scheduler's), as if it arrived now.
            probe = replace(
                request_of(lease, groups.get(lease.pk, []), plan.nodes), id=PROBE_ID, submit=plan.t
            )
            if not plan.scheduler.hopeless(probe):
                out[lease.pk] = offers(plan, probe)
    return out


def _iso(at: datetime) -> str:
    """As the API writes every time (DRF's DateTimeField: UTC as Z)."""
    return at.isoformat().replace("+00:00", "Z")
