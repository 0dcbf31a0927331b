"""The fleet's console pages that show or change what runs on nodes: the board and a node's page (allocatable and
committed now, the figures of the node API; the reservations it holds), the drain (with a deadline, a process that
moves its instances), declare-dead (its instances are lost) and re-admit, and the "what if" placement preview
(which counts the instances' claims). Their forms are validated by the API's serializers (fleet/forms.py). Composed
here from fleet's pieces (fleet/views.py) and the reads and actions of this package and the lease core; each page
URL also serves its fragment to htmx (same URL, `HX-Request`), so a live "node-changed" event re-fetches just the
live region. The board is the exception: it is paged, and a live update patches the rows of its page that changed
(`board_patch`, leases/instances/board.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers

from fleet import actions as fleet_actions
from fleet import forms as fleet_forms
from fleet.api.serializers import MAX_PARALLEL_MOVES
from fleet.filters import DEFAULT_SORT
from fleet.models import HealthSample, Node, NodeStatus, PlacementReport
from fleet.views import STALE_AFTER_S, chart, node_rows
from leases import reads as lease_reads
from leases.instances import board as board_reads
from leases.instances import placing
from leases.instances.actions import nodes
from leases.models import Allocation
from slotkeeper.decorators import role_required
from slotkeeper.domain import DomainError
from slotkeeper.forms import Checked

# The board's columns: sort key, header, what its small print says, its tooltip, and whether it holds figures.
COLUMNS = [
    ("name", "Node", "", "", False),
    ("status", "Status", "", "online, draining, offline, dead", False),
    ("age", "Health age", "", "since the node's last heartbeat", True),
    ("declared", "Declared", "cores · memory", "what the node declares", True),
    ("allocatable", "Allocatable", "cores · memory",
     "declared less the host reserve and the host's baseline: what the slot table plans with", True),
    ("committed", "Committed now", "/ allocatable",
     "what the slot table holds on the node now, of its allocatable capacity", False),
    ("observed", "Observed", "memory used · disk free · CPU", "from the last heartbeat", False),
    ("capabilities", "Capabilities", "", "", False),
    ("drain", "Drain", "", "why, by whom and since when the node was drained", False),
]  # fmt: skip


def link(state: board_reads.BoardState, **changes) -> str:
    """The board's URL with `changes` to its state: "/" for the plain board, never a bare "?"."""
    query = state.query(**changes)
    return reverse("fleet-board") + (f"?{query}" if query else "")


def columns(state: board_reads.BoardState) -> list[dict]:
    """Each column's header with the link that sorts by it: ascending first, the reverse when it is the sort."""
    current = state.sort or DEFAULT_SORT
    out = []
    for key, label, small, title, num in COLUMNS:
        on = current.removeprefix("-") == key
        descending = on and current.startswith("-")
        out.append({
            "key": key, "label": label, "small": small, "title": title, "num": num,
            "aria_sort": ("descending" if descending else "ascending") if on else None,
            "href": link(state, sort=key if descending or not on else f"-{key}", page=1),
            "next": "reverse order" if on and not descending else "sort by this column",
        })  # fmt: skip
    return out


def chips(state: board_reads.BoardState, counts: dict[str, int]) -> list[dict]:
    """The status chips: each links to the board with that status only (search, sort and page size kept)."""
    return [
        {"status": s, "count": n, "href": link(state, status=(s,), page=1), "on": state.status == (s,)}
        for s, n in counts.items()
    ]


def board_context(checked: board_reads.Checked, now: datetime) -> dict:
    state = checked.state
    page = board_reads.page_of(checked, now)
    counts, capacity = board_reads.totals(now)
    return {
        "state": state,
        "page": page,
        "counts": counts,
        "chips": chips(state, counts),
        "all_href": link(state, status=(), page=1),
        "over_href": link(state, sort="-committed", page=1),
        "capacity": capacity,
        "totals_version": board_reads.totals_version(counts, capacity, state),
        "pager_version": page.version(state),
        "empty_version": page.empty_version(state),
        "here_href": link(state),
        "last_href": link(state, page=page.pages),
        # Past the end, "previous" is the last page.
        "prev_href": link(state, page=min(page.number - 1, page.pages)) if page.number > 1 else None,
        "next_href": link(state, page=page.number + 1) if page.number < page.pages else None,
        "first_href": link(state, page=1),
        "columns": columns(state),
        "now_epoch": f"{now.timestamp():.1f}",
        "stale_after": STALE_AFTER_S,
    }


@role_required("viewer")
@vary_on_headers("HX-Request")
def board(request):
    """The fleet board: a page of nodes, filtered, sorted and paged as its URL says (search, status, sort, page,
    rows a page), with chips counting every status and the fleet's capacity totals. For htmx (the filter form, a
    column's sort, the pager) only the table and the totals. A URL with a value the board cannot read is answered
    400, with a message per bad value and the board without them."""
    now = timezone.now()
    checked = board_reads.read_state(request.GET, now)
    state = checked.state
    context = {
        **board_context(checked, now),
        "problems": checked.problems,
        "statuses": NodeStatus.values,
        "per_choices": sorted({*board_reads.PER_PAGE_CHOICES, state.per}),
    }
    if request.htmx and not request.htmx.boosted and not request.htmx.history_restore_request:
        template = "fleet/_board_table.html"
    else:
        template = "fleet/board.html"
        context["latest_report"] = PlacementReport.objects.only(
            "id", "created_at", "outcome", "subject"
        ).first()
    return render(request, template, context, status=400 if checked.problems else 200)


@role_required("viewer")
def board_patch(request):
    """What a live board must change to show the board now (leases/instances/board.py): the page's rows whose
    version moved (`have` lists the keys and versions the page shows, in its order), the page's order when it
    moved, and the totals (`sv`) and pager (`pv`) when their versions moved."""
    now = timezone.now()
    checked = board_reads.read_state(request.GET, now)
    if checked.problems:
        body = "; ".join(f"{name}: {message}" for name, message in checked.problems.items())
        return HttpResponseBadRequest(body, content_type="text/plain; charset=utf-8")
    context = board_context(checked, now)
    page = context["page"]
    context["patch"] = board_reads.patch(page, checked.state, board_reads.shown(request.GET.get("have", "")))
    context["send_totals"] = request.GET.get("sv") != context["totals_version"]
    context["send_pager"] = request.GET.get("pv") != context["pager_version"]
    response = render(request, "fleet/_board_patch.html", context)
    response["X-Board-Patch"] = "1"
    response["Cache-Control"] = "no-store"
    return response


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
    # The API's rule for a reason (300 characters at most), before anything else: a longer one was stored whole
    # (SQLite keeps what it is given; PostgreSQL refuses it, a 500) and carried into the preview's URL.
    checked = fleet_forms.check_reason(request.POST)
    if reason and not checked.ok:
        messages.error(request, "The reason: " + " ".join(checked.errors.get("reason", [])))
        return redirect("node-detail", node_id=node_id)
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
