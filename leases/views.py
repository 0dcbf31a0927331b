"""Console pages of leases: the slot table (nodes × time, server-rendered SVG), the lease list and a lease's page.
Each URL also serves its live fragment to htmx, re-fetched on "slots-changed" / "lease-changed" events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.vary import vary_on_headers

from fleet.models import Node, PlacementReport
from leases.models import Allocation, Lease
from slotkeeper.decorators import role_required

ZOOMS = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
ROW_H = 18
LABEL_W = 150
WIDTH = 1200


@dataclass
class Bar:
    x: float
    y: float
    w: float
    kind: str
    lease_id: int
    lease_name: str
    lease_type: str
    status: str
    title: str


def window_from(request, now: datetime) -> tuple[str, datetime, datetime]:
    zoom = request.GET.get("zoom", "6h")
    span = ZOOMS.get(zoom, ZOOMS["6h"])
    start = parse_datetime(request.GET.get("from", "") or "") or (now - span / 6)
    if timezone.is_naive(start):
        start = start.replace(tzinfo=UTC)
    return (zoom if zoom in ZOOMS else "6h"), start, start + span


def slot_table_context(start: datetime, end: datetime, now: datetime, node_filter: str = "") -> dict:
    nodes = list(Node.objects.only("id", "name", "status", "drain_reason").order_by("name"))
    if node_filter:
        nodes = [n for n in nodes if node_filter.lower() in n.name.lower()]
    row_of = {n.pk: i for i, n in enumerate(nodes)}
    span = (end - start).total_seconds()
    plot_w = WIDTH - LABEL_W

    def x_of(t: datetime) -> float:
        return LABEL_W + plot_w * max(0.0, min(1.0, (t - start).total_seconds() / span))

    allocations = (
        Allocation.objects.filter(start__lt=end, end__gt=start, node_id__in=row_of)
        .select_related("reservation__lease")
        .only(
            "node_id",
            "start",
            "end",
            "live",
            "mem_mib",
            "cpu",
            "reservation__kind",
            "reservation__status",
            "reservation__lease__id",
            "reservation__lease__name",
            "reservation__lease__type",
        )
        .order_by("start")
    )
    bars = []
    for a in allocations:
        r = a.reservation
        x0, x1 = x_of(a.start), x_of(a.end)
        bars.append(
            Bar(
                x=round(x0, 1),
                y=row_of[a.node_id] * ROW_H + 2,
                w=round(max(1.0, x1 - x0), 1),
                kind=r.kind,
                lease_id=r.lease.pk,
                lease_name=r.lease.name,
                lease_type=r.lease.type,
                status=r.status,
                title=(
                    f"lease {r.lease.pk} {r.lease.name} ({r.lease.type.replace('_', ' ')}): {r.kind} "
                    f"{a.start:%Y-%m-%d %H:%M:%S}–{a.end:%H:%M:%S} UTC, {a.mem_mib} MiB, {a.cpu / 100:g} cores, {r.status}"
                ),
            )
        )
    ticks = []
    step = span / 6
    for i in range(7):
        t = start + timedelta(seconds=step * i)
        ticks.append(
            {"x": round(x_of(t), 1), "label": t.strftime("%H:%M" if span <= 86400 else "%m-%d %H:%M")}
        )
    now_x = round(x_of(now), 1) if start <= now <= end else None
    return {
        "nodes": [{"node": n, "y": i * ROW_H} for i, n in enumerate(nodes)],
        "bars": bars,
        "ticks": ticks,
        "now_x": now_x,
        "height": max(1, len(nodes)) * ROW_H + 24,
        "width": WIDTH,
        "label_w": LABEL_W,
        "row_h": ROW_H,
        "start": start,
        "end": end,
    }


@role_required("viewer")
@vary_on_headers("HX-Request")
def slot_table(request):
    now = timezone.now()
    zoom, start, end = window_from(request, now)
    node_filter = request.GET.get("q", "").strip()
    span = end - start
    context = {
        **slot_table_context(start, end, now, node_filter),
        "zoom": zoom,
        "zooms": list(ZOOMS),
        "q": node_filter,
        "earlier": (start - span / 2).isoformat(),
        "later": (start + span / 2).isoformat(),
        "following_now": "from" not in request.GET,
    }
    template = "leases/_slot_table.html" if request.htmx else "leases/slots.html"
    return render(request, template, context)


@role_required("viewer")
@vary_on_headers("HX-Request")
def lease_list(request):
    state = request.GET.get("state", "")
    leases = Lease.objects.all()
    if state:
        leases = leases.filter(state=state)
    states = ["queued", "scheduled", "active", "suspended_queued", "done", "rejected", "cancelled"]
    context = {"leases": leases[:200], "state": state, "states": states}
    template = "leases/_lease_table.html" if request.htmx else "leases/list.html"
    return render(request, template, context)


@role_required("viewer")
@vary_on_headers("HX-Request")
def lease_detail(request, lease_id: int):
    lease = get_object_or_404(Lease, pk=lease_id)
    reports = list(
        PlacementReport.objects.filter(subject=f"lease:{lease.pk}").order_by("-created_at", "-id")[:20]
    )
    context = {
        "lease": lease,
        "events": list(lease.events.all()),
        "reservations": list(lease.reservations.order_by("start", "rid")),
        "reports": reports,
    }
    template = "leases/_lease_body.html" if request.htmx else "leases/detail.html"
    return render(request, template, context)
