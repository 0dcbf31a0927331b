"""The fleet's console pages that show or change what runs on nodes: the board and a node's page (allocatable and
committed now, the figures of the node API; the reservations it holds), the drain (with a deadline, a process that
moves its instances), declare-dead (its instances are lost) and re-admit, and the "what if" placement preview
(which counts the instances' claims). Their forms are validated by the API's serializers (fleet/forms.py). Composed
here from fleet's pieces (fleet/views.py) and the reads and actions of this package and the lease core; each page
URL also serves its fragment to htmx (same URL, `HX-Request`), so a live "node-changed" event re-fetches just the
live region.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers

from fleet import actions as fleet_actions
from fleet import forms as fleet_forms
from fleet.api.serializers import MAX_PARALLEL_MOVES
from fleet.models import HealthSample, Node, NodeStatus, PlacementReport
from fleet.views import CapacityTotals, chart, matches, node_rows
from leases import reads as lease_reads
from leases.instances import placing
from leases.instances.actions import nodes
from leases.models import Allocation
from slotkeeper.decorators import role_required
from slotkeeper.domain import DomainError
from slotkeeper.forms import Checked


@role_required("viewer")
@vary_on_headers("HX-Request")
def board(request):
    now = timezone.now()
    status = request.GET.get("status", "")
    status = status if status in NodeStatus.values else ""
    q = request.GET.get("q", "").strip()
    # The whole fleet in one query: totals need every node anyway, and filtering 1,000 rows in Python is cheaper
    # than a second round trip per counter.
    # The capacity figures need what the slot table holds on every node now: one aggregate query, not one per node.
    nodes = list(Node.objects.select_related("drained_by").order_by("name"))
    every = node_rows(nodes, now, lease_reads.committed_now(now))
    totals = dict.fromkeys(NodeStatus.values, 0)
    capacity_totals = CapacityTotals()
    for row in every:
        totals[row.node.status] += 1
        capacity_totals.add(row)
    context = {
        "rows": [r for r in every if matches(r.node, status, q)],
        "totals": totals,
        "capacity": capacity_totals,
        "status": status,
        "q": q,
        "statuses": NodeStatus.values,
        "latest_report": PlacementReport.objects.only("id", "created_at", "outcome", "subject").first(),
    }
    template = "fleet/_board_table.html" if request.htmx and not request.htmx.boosted else "fleet/board.html"
    return render(request, template, context)


def holdings(node: Node, now: datetime) -> list[Allocation]:
    """What the node holds now or later: the reservations a drain would have to move or let finish."""
    return list(
        Allocation.objects.filter(node=node, live=True, end__gt=now)
        .select_related("reservation__lease")
        .order_by("start", "reservation__rid")
    )


def node_context(node: Node, now: datetime) -> dict:
    samples = list(
        HealthSample.objects.filter(node=node, at__gte=now - timedelta(hours=1)).order_by("at")[:2000]
    )
    return {
        "node": node,
        "row": node_rows([node], now, lease_reads.committed_now(now, [node.pk]))[0],
        "chart": chart(samples, now),
        "holdings": holdings(node, now),
    }


@role_required("viewer")
@vary_on_headers("HX-Request")
def node_detail(request, node_id: int):
    node = get_object_or_404(Node.objects.select_related("drained_by"), pk=node_id)
    template = "fleet/_node_status.html" if request.htmx else "fleet/node.html"
    return render(request, template, node_context(node, timezone.now()))


def refused(request, node_id: int, form: str, checked: Checked):
    """The node page again, with the form's field messages (400): nothing was changed."""
    node = get_object_or_404(Node.objects.select_related("drained_by"), pk=node_id)
    context = {**node_context(node, timezone.now()), form: checked}
    return render(request, "fleet/node.html", context, status=400)


@role_required("operator")
@vary_on_headers("HX-Request")
def drain_preview(request, node_id: int):
    """What a drain would touch, shown before it is confirmed: the reservations live on the node now or later."""
    node = get_object_or_404(Node.objects.select_related("drained_by"), pk=node_id)
    now = timezone.now()
    held = holdings(node, now)
    context = {
        "node": node,
        "reason": request.GET.get("reason", "").strip(),
        "holdings": held,
        "running": [a for a in held if a.start <= now],
        "lease_count": len({a.reservation.lease_id for a in held}),
        # Where each live instance would go: asked only once the drain has its reason (the form shows an error
        # otherwise), and only of a node that is not already dead.
        "targets": placing.drain_targets(node.pk, now)
        if request.GET.get("reason", "").strip() and node.status != NodeStatus.DEAD
        else [],
    }
    template = "fleet/_drain_preview.html" if request.htmx else "fleet/drain_preview.html"
    return render(request, template, context)


@role_required("operator")
@require_POST
def drain(request, node_id: int):
    reason = request.POST.get("reason", "").strip()
    undrain = bool(request.POST.get("undrain"))
    if not undrain and not request.POST.get("confirm"):
        # A drain posted without passing through its preview (an old form, a script) is shown the preview first:
        # draining a node that still runs leases must never be one stray click.
        return redirect(f"{reverse('node-drain-preview', args=[node_id])}?{urlencode({'reason': reason})}")
    try:
        if not reason:
            raise DomainError("an undrain needs a reason" if undrain else "a drain needs a reason")
        if undrain:
            fleet_actions.do_undrain(request.user, node_id, reason=reason, now=timezone.now())
            messages.success(request, "Node undrained.")
        else:
            now = timezone.now()
            minutes, parallel = (
                _positive_int(request.POST.get("deadline_min"), "the deadline", MAX_DEADLINE_MIN, "minutes"),
                _positive_int(
                    request.POST.get("max_parallel"), "moves at once", MAX_PARALLEL_MOVES, "instances"
                ),
            )
            deadline = now + timezone.timedelta(minutes=minutes) if minutes else None
            nodes.do_drain(
                request.user, node_id, reason=reason, now=now, deadline=deadline, max_parallel=parallel or 2
            )
            messages.success(
                request, "Node draining." + (f" Instances move off within {minutes} min." if minutes else "")
            )
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("node-detail", node_id=node_id)


# A year of minutes is far past any drain; the moves at once are the API's bound (DrainSerializer). Past them the
# form's figure was a 500 (timedelta or integer overflow).
MAX_DEADLINE_MIN = 525_600


def _positive_int(raw: str | None, what: str, most: int, unit: str) -> int | None:
    try:
        value = int(raw or "")
    except ValueError:
        return None
    if value > most:
        raise DomainError(f"{what} is at most {most:,} {unit}")
    return value if value > 0 else None


@role_required("admin")
@require_POST
def declare_dead(request, node_id: int):
    checked = fleet_forms.check_reason(request.POST)
    if not checked.ok:
        return refused(request, node_id, "declare_dead_form", checked)
    try:
        nodes.do_declare_dead(request.user, node_id, reason=checked.data["reason"], now=timezone.now())
        messages.success(request, "Node declared dead.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("node-detail", node_id=node_id)


@role_required("admin")
@require_POST
def readmit(request, node_id: int):
    checked = fleet_forms.check_reason(request.POST)
    if not checked.ok:
        return refused(request, node_id, "readmit_form", checked)
    try:
        fleet_actions.do_readmit(request.user, node_id, reason=checked.data["reason"], now=timezone.now())
        messages.success(request, "Node re-admitted: it comes back online with its next heartbeat.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("node-detail", node_id=node_id)


@role_required("operator")
def placement_preview(request):
    """ "What if": would this fit, and where? The same request, verdicts and stored report as the API's preview
    (POST, because the report is kept and audited)."""
    if request.method != "POST":
        context = {"values": dict(fleet_forms.PREVIEW_DEFAULTS), "errors": {}, "result": None}
        return render(request, "fleet/preview.html", context)
    checked = fleet_forms.check_preview(request.POST)
    if not checked.ok:
        context = {"values": checked.values, "errors": checked.errors, "result": None}
        return render(request, "fleet/preview.html", context, status=400)
    result = nodes.do_preview_placement(request.user, checked.data, now=timezone.now())
    context = {"values": checked.values, "errors": {}, "result": result, "verdicts": result["verdicts"]}
    return render(request, "fleet/preview.html", context)
