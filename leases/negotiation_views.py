"""What a lease page shows of issue 48: a rejected advance reservation's counter-offers (each taken in one click:
leases/views.py `lease_resubmit`), and a placed lease's end with its before-end notice (changed, previewed first, by
`lease_change_end`)."""

from __future__ import annotations

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from leases import negotiating
from leases.models import Lease, Reservation


def negotiation_context(lease: Lease) -> dict:
    """For the lease page: a rejected advance reservation's offers; a placed lease's end and its notice."""
    context: dict = {"offers": None, "plan_end": None, "notice_sent": False}
    if lease.state == "rejected" and lease.type == "advance_reservation":
        found = negotiating.counter_offers(lease, timezone.now())
        if found is not None:
            context["offers"] = [
                {**o, "start_at": parse_datetime(o["start"]), "end_at": parse_datetime(o["end"])}
                for o in found["alternatives"]
            ]
            context["blocking"] = found["blocking"]
    end = (
        Reservation.objects.filter(lease=lease, kind="vm", status__in=("scheduled", "active"))
        .order_by("-end")
        .values_list("end", flat=True)
        .first()
    )
    if end is not None:
        context["plan_end"] = end
        context["notice_sent"] = lease.ending_notified_for == end
        context["ends_in_s"] = max(0.0, (end - timezone.now()).total_seconds())
    return context
