"""What a lease page shows of issue 48: a rejected advance reservation's counter-offers (each taken in one click:
leases/views.py `lease_resubmit`), and a placed lease's end with its before-end notice (changed, previewed first, by
`lease_change_end`)."""

from __future__ import annotations

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from leases import negotiating
from leases.models import Lease, Reservation


def negotiation_context(lease: Lease, reservations: list[Reservation], *, offers: bool = True) -> dict:
    """For the lease page: a rejected advance reservation's offers (not on a live refresh, which re-renders only the
    lease's body: asking for them is a search over the fleet); a placed lease's end, from the reservations the page
    already lists, and its notice."""
    context: dict = {"offers": None, "plan_end": None, "notice_sent": False}
    if offers and lease.state == "rejected" and lease.type == "advance_reservation":
        found = negotiating.counter_offers(lease, timezone.now())
        if found is not None:
            context["offers"] = [
                {**o, "start_at": parse_datetime(o["start"]), "end_at": parse_datetime(o["end"])}
                for o in found["alternatives"]
            ]
            context["blocking"] = found["blocking"]
    end = max(
        (r.end for r in reservations if r.kind == "vm" and r.status in ("scheduled", "active")), default=None
    )
    if end is not None:
        context["plan_end"] = end
        context["notice_sent"] = lease.ending_notified_for == end
        context["ends_in_s"] = max(0.0, (end - timezone.now()).total_seconds())
    return context
