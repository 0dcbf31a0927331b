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
from fleet.views import sort_verdicts
from leases.models import Allocation, Lease, Reservation
from slotkeeper.decorators import role_required

ZOOMS = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
ROW_H = 18
AXIS_H = 22  # the time axis sits on top, so it stays in view above the first rows of a 200-node table
LABEL_W = 190
WIDTH = 1200
# A lease re-planned many times keeps every report; the newest few explain its present, older ones are in the API.
REPORTS = 20
# Roughly one character of the 11 px label font in viewBox units: bars narrower than a few characters get no label.
CHAR_W = 6.2


@dataclass
class Bar:
    x: float
    y: float
    w: float
    kind: str
    lease_id: int
    lease_type: str
    status: str
    title: str
    label: str


@dataclass
class Row:
    node: Node
    y: int
    title: str


def window_from(request, now: datetime) -> tuple[str, datetime, datetime]:
    zoom = request.GET.get("zoom", "6h")
    span = ZOOMS.get(zoom, ZOOMS["6h"])
    start = parse_datetime(request.GET.get("from", "") or "") or (now - span / 6)
    if timezone.is_naive(start):
        start = start.replace(tzinfo=UTC)
    return (zoom if zoom in ZOOMS else "6h"), start, start + span


def fits(text: str, width: float) -> str:
    """The text cut to what a bar of this width can show, or nothing when not even a short name fits."""
    room = int((width - 6) / CHAR_W)
    if room < 3:
        return ""
    return text if len(text) <= room else text[: room - 1] + "…"


def node_row(node: Node, i: int) -> Row:
    title = f"{node.name}: {node.status}"
    if node.drain_reason:
        title += f", drained: {node.drain_reason}"
    return Row(node=node, y=AXIS_H + i * ROW_H, title=title)


def bar_of(a: Allocation, x0: float, x1: float, y: int) -> Bar:
    r, lease = a.reservation, a.reservation.lease
    w = max(1.0, x1 - x0)
    return Bar(
        x=round(x0, 1),
        y=y + 2,
        w=round(w, 1),
        kind=r.kind,
        lease_id=lease.pk,
        lease_type=lease.type,
        status=r.status,
        title=(
            f"lease {lease.pk} {lease.name} ({lease.type.replace('_', ' ')}): {r.kind} "
            f"{a.start:%Y-%m-%d %H:%M:%S}–{a.end:%H:%M:%S} UTC, {a.mem_mib} MiB, {a.cpu / 100:g} cores, {r.status}"
        ),
        label=fits(f"{lease.pk} {lease.name}", w),
    )


def window_allocations(start: datetime, end: datetime, node_ids) -> list[Allocation]:
    """Every allocation overlapping the window, with its reservation and lease, in one query."""
    return list(
        Allocation.objects.filter(start__lt=end, end__gt=start, node_id__in=node_ids)
        .select_related("reservation__lease")
        .only(
            "node_id",
            "start",
            "end",
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


def slot_table_context(start: datetime, end: datetime, now: datetime, node_filter: str = "") -> dict:
    nodes = list(Node.objects.only("id", "name", "status", "drain_reason").order_by("name"))
    if node_filter:
        nodes = [n for n in nodes if node_filter.lower() in n.name.lower()]
    rows = [node_row(n, i) for i, n in enumerate(nodes)]
    y_of = {row.node.pk: row.y for row in rows}
    span = (end - start).total_seconds()
    plot_w = WIDTH - LABEL_W

    def x_of(t: datetime) -> float:
        return LABEL_W + plot_w * max(0.0, min(1.0, (t - start).total_seconds() / span))

    allocations = window_allocations(start, end, list(y_of)) if y_of else []
    bars = [bar_of(a, x_of(a.start), x_of(a.end), y_of[a.node_id]) for a in allocations]
    fmt = "%H:%M" if span <= 86400 else "%a %d %H:%M"
    ticks = [start + timedelta(seconds=span * i / 6) for i in range(7)]
    height = AXIS_H + max(1, len(rows)) * ROW_H
    return {
        "rows": rows,
        "bars": bars,
        "ticks": [{"x": round(x_of(t), 1), "label": t.strftime(fmt)} for t in ticks],
        "now_x": round(x_of(now), 1) if start <= now <= end else None,
        "height": height,
        "width": WIDTH,
        "label_w": LABEL_W,
        "row_h": ROW_H,
        "axis_h": AXIS_H,
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


def with_node_names(reservations: list[Reservation]) -> list[tuple[Reservation, list[tuple[str, int, str]]]]:
    """Each reservation with its (vnode, node id, node name) triples: the table names hosts, not ids."""
    ids = {int(n) for r in reservations for n in r.nodes.values()}
    names = dict(Node.objects.filter(pk__in=ids).values_list("pk", "name"))
    return [
        (r, [(v, int(n), names.get(int(n), f"node {n}")) for v, n in r.nodes.items()]) for r in reservations
    ]


@role_required("viewer")
@vary_on_headers("HX-Request")
def lease_detail(request, lease_id: int):
    lease = get_object_or_404(Lease, pk=lease_id)
    sort = request.GET.get("sort", "rank")
    reports = list(
        PlacementReport.objects.filter(subject=f"lease:{lease.pk}").order_by("-created_at", "-id")[:REPORTS]
    )
    context = {
        "lease": lease,
        "events": list(lease.events.all()),
        "reservations": with_node_names(list(lease.reservations.order_by("start", "rid"))),
        "reports": [(r, sort_verdicts(r.verdicts, sort)) for r in reports],
        "sort": sort,
    }
    template = "leases/_lease_body.html" if request.htmx else "leases/detail.html"
    return render(request, template, context)
