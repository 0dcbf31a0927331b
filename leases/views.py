"""Console pages of leases: the slot table (nodes × time, server-rendered SVG), the lease list and a lease's page,
and the forms that submit and cancel a lease. Each page URL also serves its live fragment to htmx, re-fetched on
"slots-changed" / "lease-changed" events. The forms are validated by the API's serializers (leases/forms.py) and
write only through leases/actions.py; the role is checked again here (a hidden button is not a permission)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import escape
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers

from fleet.models import Node, PlacementReport
from fleet.views import sort_verdicts
from leases import actions, forms
from leases.lifecycle import TERMINAL_LEASE_STATES
from leases.models import Allocation, Group, Lease, LeaseType, Reservation
from slotkeeper.decorators import role_required
from slotkeeper.domain import DomainError

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
class Row:
    node: Node
    y: int
    title: str
    label: str = ""
    # The row's bars as SVG markup, in time order (bars_by_node): a bar belongs to its node's row, so the chart
    # reads and is walked with the keyboard row by row.
    bars: str = ""


def window_from(request, now: datetime) -> tuple[str, datetime, datetime]:
    zoom = request.GET.get("zoom", "6h")
    span = ZOOMS.get(zoom, ZOOMS["6h"])
    start = parse_datetime(request.GET.get("from", "") or "") or (now - span / 6)
    if timezone.is_naive(start):
        start = start.replace(tzinfo=UTC)
    return (zoom if zoom in ZOOMS else "6h"), start, start + span


def shorten(text: str, room: int) -> str:
    """The text cut to `room` characters at a word boundary, with "…" when cut, or nothing when not even the
    first word fits. Whole words only: a link's accessible name must contain the words it shows (a voice-control
    user says what they see, and axe's label-content-name-mismatch fails "render-fa…" inside "render-farm")."""
    if len(text) <= room:
        return text
    cut = text[: max(0, room - 1)]
    if text[len(cut)].isalnum():
        cut = re.sub(r"[^\W_]+$", "", cut)
    cut = cut.rstrip(" -_.,:")
    return cut + "…" if cut else ""


def fits(text: str, width: float) -> str:
    """The text cut to what a bar of this width can show, or nothing when not even a short name fits."""
    room = int((width - 6) / CHAR_W)
    return shorten(text, room) if room >= 3 else ""


def node_row(node: Node, i: int) -> Row:
    title = f"{node.name}: {node.status}"
    if node.drain_reason:
        title += f", drained: {node.drain_reason}"
    return Row(node=node, y=AXIS_H + i * ROW_H, title=title, label=shorten(node.name, 24) or node.name)


def window_allocations(start: datetime, end: datetime, node_ids) -> list[tuple]:
    """Every allocation overlapping the window with its reservation and lease, as plain tuples, in one query
    (model objects cost seven times as much as the tuples at 10,000 bars, measured)."""
    return list(
        Allocation.objects.filter(start__lt=end, end__gt=start, node_id__in=node_ids)
        .order_by("start")
        .values_list(
            "id",
            "node_id",
            "start",
            "end",
            "mem_mib",
            "cpu",
            "reservation__kind",
            "reservation__status",
            "reservation__lease_id",
            "reservation__lease__name",
            "reservation__lease__type",
        )
    )


def when(start: datetime, end: datetime) -> str:
    """A bar's times as a person reads them: the end's date only when it differs from the start's."""
    end_fmt = "%H:%M" if start.date() == end.date() else "%Y-%m-%d %H:%M"
    return f"{start:%Y-%m-%d %H:%M} to {end:{end_fmt}} UTC"


def bars_by_node(
    allocations: list[tuple], x_of, y_of: dict[int, int], row_h: int, names: dict[int, str]
) -> dict:
    """Each node's bars as SVG markup, built here rather than in a template loop: the loop's per-value formatting
    was 80 % of a 10,000-bar render. Every text from the database is escaped.

    A bar is a grid cell holding a link whose accessible name says lease, kind, node and times; it is not in the
    tab order (tabindex -1): the chart is one tab stop, and the arrow keys move between bars (console.js). Its id
    (the allocation's) lets a live morph keep each bar the same element, so a focused bar stays the bar it was
    rather than being morphed into a new neighbour that took its place in the row."""
    link = reverse("lease-detail", args=[0])[:-2]  # "/leases/" : the id and slash are appended per bar
    height = row_h - 4
    parts: dict[int, list[str]] = {}
    for alloc_id, node_id, start, end, mem, cpu, kind, status, lease_id, name, lease_type in allocations:
        x0, x1 = x_of(start), x_of(end)
        w = max(1.0, x1 - x0)
        y = y_of[node_id] + 2
        kind_of_lease = lease_type.replace("_", " ")
        title = escape(
            f"lease {lease_id} {name} ({kind_of_lease}): {kind} "
            f"{start:%Y-%m-%d %H:%M:%S}–{end:%H:%M:%S} UTC, {mem} MiB, {cpu / 100:g} cores, {status}"
        )
        label = escape(
            f"lease {lease_id} {name}, {kind_of_lease}, {kind} on {names[node_id]}, {when(start, end)}, {status}"
        )
        short = fits(f"{lease_id} {name}", w)
        text = f'<text x="{x0 + 3:.1f}" y="{y + 11}">{escape(short)}</text>' if short else ""
        parts.setdefault(node_id, []).append(
            f'<g role="gridcell"><a href="{link}{lease_id}/" class="bar-link" id="alloc-{alloc_id}" data-roving data-bar '
            f'tabindex="-1" '
            f'aria-label="{label}"><g class="bar {kind} {lease_type} {status}" data-lease="{lease_id}">'
            f'<title>{title}</title><rect x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{height}" rx="2"></rect>'
            f"{text}</g></a></g>"
        )
    # Every database text above went through escape().
    return {node_id: mark_safe("".join(bars)) for node_id, bars in parts.items()}  # noqa: S308


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
    bars = bars_by_node(allocations, x_of, y_of, ROW_H, {row.node.pk: row.node.name for row in rows})
    for row in rows:
        row.bars = bars.get(row.node.pk, "")
    fmt = "%H:%M" if span <= 86400 else "%a %d %H:%M"
    ticks = [start + timedelta(seconds=span * i / 6) for i in range(7)]
    height = AXIS_H + max(1, len(rows)) * ROW_H
    return {
        "rows": rows,
        "bar_count": len(allocations),
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
        **estimate_context(start, end),
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


def lease_context(request, lease: Lease) -> dict:
    sort = request.GET.get("sort", "rank")
    reports = list(
        PlacementReport.objects.filter(subject=f"lease:{lease.pk}").order_by("-created_at", "-id")[:REPORTS]
    )
    return {
        "lease": lease,
        "events": list(lease.events.all()),
        "reservations": with_node_names(list(lease.reservations.order_by("start", "rid"))),
        "reports": [(r, sort_verdicts(r.rows, sort)) for r in reports],
        "sort": sort,
        # The form is offered until the lease ends; the action says why when it cannot be cancelled after all.
        "cancellable": lease.state not in TERMINAL_LEASE_STATES,
    }


@role_required("viewer")
@vary_on_headers("HX-Request")
def lease_detail(request, lease_id: int):
    lease = get_object_or_404(Lease, pk=lease_id)
    template = "leases/_lease_body.html" if request.htmx else "leases/detail.html"
    return render(request, template, lease_context(request, lease))


@role_required("operator")
def lease_new(request):
    """The lease request form: its three types, several VMs of one size, capabilities, groups, preemptible. A
    submission lands on the lease's page with its decision and placement report, accepted or not."""
    if request.method == "POST":
        checked = forms.check_lease(request.POST)
        if checked.ok:
            try:
                result = actions.do_submit_lease(
                    request.user, actions.LeaseSpec.from_request(checked.data), now=timezone.now()
                )
            except DomainError as exc:
                checked.add("form", str(exc))
            else:
                lease = result.lease
                if result.decision.accepted:
                    messages.success(request, f"Lease {lease.pk} {lease.name}: {result.decision.message}")
                else:
                    messages.error(
                        request, f"Lease {lease.pk} {lease.name} rejected: {result.decision.message}"
                    )
                return redirect("lease-detail", lease_id=lease.pk)
        return render(
            request, "leases/new.html", lease_form_context(checked.values, checked.errors), status=400
        )
    return render(request, "leases/new.html", lease_form_context(dict(forms.DEFAULTS), {}))


def lease_form_context(values: dict, errors: dict) -> dict:
    return {
        "values": values,
        "errors": errors,
        "types": LeaseType.choices,
        "groups": list(Group.objects.order_by("name").values_list("name", flat=True)),
    }


@role_required("operator")
@require_POST
def lease_cancel(request, lease_id: int):
    lease = get_object_or_404(Lease, pk=lease_id)
    checked = forms.check_cancel(request.POST)
    if not checked.ok:
        context = {**lease_context(request, lease), "cancel": checked}
        return render(request, "leases/detail.html", context, status=400)
    try:
        lease = actions.do_cancel_lease(
            request.user, lease.pk, now=timezone.now(), reason=checked.data["reason"]
        )
        messages.success(request, f"Lease {lease.pk} {lease.name} cancelled.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("lease-detail", lease_id=lease.pk)


# -- the queue forecast on the slot table ---------------------------------------------------------------------------

ESTIMATE_ROWS = 100  # queued leases drawn at most; the rest are counted


def estimate_context(start: datetime, end: datetime) -> dict:
    """The queue forecast under the node rows, apart from real reservations: one row per queued lease estimated to
    run in the window, in queue order, its bar hatched and labelled "estimated". Not on a node's row: an estimate
    holds no node, and the scheduler may start the lease elsewhere."""
    queued = Lease.objects.filter(state__in=("queued", "suspended_queued"))
    shown = queued.filter(estimated_start__lt=end, estimated_end__gt=start).order_by("submitted_at", "id")
    leases = list(shown.only("id", "name", "estimated_start", "estimated_end")[: ESTIMATE_ROWS + 1])
    more = shown.count() - ESTIMATE_ROWS if len(leases) > ESTIMATE_ROWS else 0
    leases = leases[:ESTIMATE_ROWS]
    span = (end - start).total_seconds()
    plot_w = WIDTH - LABEL_W

    def x_of(t: datetime) -> float:
        return LABEL_W + plot_w * max(0.0, min(1.0, (t - start).total_seconds() / span))

    rows = []
    for i, lease in enumerate(leases):
        x0, x1 = x_of(lease.estimated_start), x_of(lease.estimated_end)
        w = max(1.0, x1 - x0)
        rows.append(
            {
                "lease": lease,
                "y": i * ROW_H,
                "x": round(x0, 1),
                "w": round(w, 1),
                "text": fits("estimated", w),
                "when": when(lease.estimated_start, lease.estimated_end),
            }
        )
    return {
        "estimates": rows,
        "estimates_more": more,
        "estimates_height": max(1, len(rows)) * ROW_H,
        "unestimated": queued.filter(estimated_start__isnull=True).count(),
    }
