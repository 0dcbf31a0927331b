"""What a lease page shows of issue 48: a rejected advance reservation's counter-offers (each taken in one click:
leases/views.py `lease_resubmit`), and a placed lease's end with its before-end notice (changed, previewed first, by
`lease_change_end`)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from leases import forecasting, negotiating
from leases.lifecycle import TERMINAL_LEASE_STATES
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
    if lease.state in forecasting.QUEUED and lease.estimated_start is not None:
        context["likely"] = _likely(lease.estimated_start)
    end = max(
        (r.end for r in reservations if r.kind == "vm" and r.status in ("scheduled", "active")), default=None
    )
    if end is not None:
        context["plan_end"] = end
        context["notice_sent"] = lease.ending_notified_for == end
        context["ends_in_s"] = max(0.0, (end - timezone.now()).total_seconds())
    return context


def _likely(estimated: datetime) -> dict | None:
    """The range a queued lease's start likely falls in, shown beside the forecast's estimate (None: too few leases
    seen yet, or the estimate is due within a minute)."""
    found = forecasting.likely_start(estimated, timezone.now())
    if found is None:
        return None
    at = {k: datetime.fromtimestamp(getattr(found, k), UTC) for k in ("start", "low", "high")}
    return {**at, "samples": found.samples}


ENDING_ROWS = 20  # leases listed under "Ending soon" on the slot table; the rest are counted


def ending_context(now: datetime) -> dict:
    """The slot table's countdown: the leases whose before-end notice has gone out and whose end is still to
    come, soonest first, each with the end it was sent for (an extension gets a notice of its own)."""
    soon = (
        Lease.objects.filter(ending_notified_for__gt=now)
        .exclude(state__in=TERMINAL_LEASE_STATES)
        .order_by("ending_notified_for", "id")
    )
    rows = list(soon.only("id", "name", "ending_notified_for")[: ENDING_ROWS + 1])
    more = soon.count() - ENDING_ROWS if len(rows) > ENDING_ROWS else 0
    return {"ending": rows[:ENDING_ROWS], "ending_more": more}
