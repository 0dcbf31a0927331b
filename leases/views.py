"""Console pages of leases: the slot table (nodes × time, server-rendered SVG), the lease list and a lease's page,
and the forms that submit and cancel a lease. Each page URL also serves its live fragment to htmx, re-fetched on
"slots-changed" / "lease-changed" events. The forms are validated by the API's serializers (leases/forms.py) and
write only through leases/actions.py; the role is checked again here (a hidden button is not a permission)."""

from __future__ import annotations

from datetime import datetime

from django.contrib import messages
from django.db.models import Count, Min, Q
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers

from fleet.models import Node, NodeStatus, PlacementReport
from fleet.views import sort_verdicts
from leases import actions, forms, lease_pages, slot_patch, slotchart
from leases.lifecycle import TERMINAL_LEASE_STATES
from leases.models import Group, Lease, LeaseType, Reservation
from leases.negotiation_views import ending_context, negotiation_context
from leases.request_rules import MAX_START_AHEAD
from leases.slot_marks import fits, when
from slotkeeper.decorators import role_required
from slotkeeper.domain import DomainError
from slotkeeper.fields import whole_number

# A lease re-planned many times keeps every report; the newest few explain its present, older ones are in the API.
REPORTS = 20


def page_count(params) -> int:
    """How many row pages a live refresh re-renders: as many as the browser has loaded (console.js sends them)."""
    raw = params.get("pages", "1")
    pages = whole_number(raw)
    return max(1, min(slotchart.MAX_PAGES, pages)) if pages is not None else 1


@role_required("viewer")
@vary_on_headers("HX-Request")
def slot_table(request):
    """The slot table: the toolbar, the legend and the first page of rows; for htmx (the live refresh, a row's
    "+N more", the queue forecast's pages) only the table, with every row page the browser had loaded, and the
    toolbar's links out of band, so that they keep what the table now shows."""
    now = timezone.now()
    state = slotchart.State.from_query(request.GET, now)
    window = state.window
    context = {
        **slotchart.chart_context(state, page_count(request.GET)),
        **slotchart.links(state),
        "state": state,
        "zoom": window.zoom,
        "statuses": NodeStatus.values,
        "live_query": state.query(),
        "following_now": window.following_now,
        "oob": bool(request.htmx),
        **estimate_context(state),
        **ending_context(now),
    }
    context.update({f"{name}_section": markup for name, markup in slot_sections(context).items()})
    template = "leases/_slot_table.html" if request.htmx else "leases/slots.html"
    found = slotchart.problems(request.GET)
    context.update(problems=found, here_href=state.url())
    return render(request, template, context, status=400 if found else 200)


SECTIONS = {
    "summary": "leases/_slot_summary.html",
    "ending": "leases/_slot_ending.html",
    "forecast": "leases/_slot_estimates.html",
}


def slot_sections(context: dict) -> dict[str, str]:
    """The slot table's parts besides its rows (the footer, "ending soon", the queue forecast), each with its version,
    which a live patch compares (leases/slot_patch.py)."""
    return {name: slot_patch.versioned(render_to_string(t, context)) for name, t in SECTIONS.items()}


# A POST that changes nothing: the versions of up to 2,000 loaded rows (about 28 KB) do not fit the 16 KiB request
# line Daphne reads. The CSRF token comes with it like any console POST (base.html's hx-headers).
@role_required("viewer")
@require_POST
def slot_table_patch(request):
    """What a live slot table must change to show the table now (leases/slot_patch.py): the table's state is in the
    query, as the table's own URL has it; what it shows (window, rows, versions) in the body. 200 with the patch,
    409 when the table must be fetched whole instead, 400 when the body cannot be read."""
    now = timezone.now()
    try:
        shown = slot_patch.read_shown(request.POST)
        state = slot_patch.drawn_for(slotchart.State.from_query(request.GET, now), shown.start)
        context = {
            **slotchart.chart_context(state, len(shown.pages)),
            "state": state,
            **estimate_context(state),
            **ending_context(now),
        }
        patch = slot_patch.patch(context, shown, slot_sections(context))
    except slot_patch.BadPatchRequest as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    except slot_patch.Unpatchable as exc:
        return HttpResponse(
            f"No patch: {exc}. Fetch the table.", status=409, content_type="text/plain; charset=utf-8"
        )
    response = render(request, "leases/_slot_patch.html", {**context, "patch": patch})
    response["X-Slot-Patch"] = "1"
    response["Cache-Control"] = "no-store"
    return response


@role_required("viewer")
def slot_rows(request):
    """One page of rows (?page=N, from 0) as a fragment: an SVG row group and, when more follow, the placeholder
    that loads the next page once it scrolls into view."""
    state = slotchart.State.from_query(request.GET, timezone.now())
    raw = request.GET.get("page", "0")
    page = whole_number(raw) or 0
    context = slotchart.chart_context(state, 1, first_page=page)
    return render(request, "leases/_slot_rows.html", context)


@role_required("viewer")
@vary_on_headers("HX-Request")
def lease_list(request):
    """The lease list: a page of leases, newest first, in the state the URL asks for (leases/lease_pages.py), with
    "Leases a–b of N" and a pager. For htmx (the live refresh, the pager) only the table, which re-fetches the page
    it shows. A URL with a value the list cannot read is answered 400, with a message per bad value and the list
    without them."""
    checked = lease_pages.read_state(request.GET)
    context = lease_pages.list_context(checked)
    if request.htmx and not request.htmx.boosted and not request.htmx.history_restore_request:
        template = "leases/_lease_table.html"
    else:
        template = "leases/list.html"
    return render(request, template, context, status=400 if checked.problems else 200)


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
    # Run time counts the runs that ended (the scheduler adds a run when it ends); the one in force counts here too,
    # or a lease running for twelve minutes read "Run time 0 s".
    running_since = (
        lease.reservations.filter(kind="vm", status="active").aggregate(since=Min("start"))["since"]
        if lease.state == "active"
        else None
    )
    return {
        "lease": lease,
        "running_since": running_since,
        "run_time_s": lease.run_time_s
        + (max(0.0, (timezone.now() - running_since).total_seconds()) if running_since else 0.0),
        "events": list(lease.events.all()),
        # Superseded (cancelled before they started) reservations are not listed: the history step says it.
        "reservations": with_node_names(
            list(lease.reservations.exclude(status="cancelled").order_by("start", "rid"))
        ),
        "reports": [(r, sort_verdicts(r.rows, sort)) for r in reports],
        "sort": sort,
        # The form is offered until the lease ends; the action says why when it cannot be cancelled after all.
        "cancellable": lease.state not in TERMINAL_LEASE_STATES,
    }


def page_context(request, lease: Lease, *, offers: bool = True) -> dict:
    """A lease page's context: `lease_context` and what it shows of issue 48 (negotiation_views.py)."""
    context = lease_context(request, lease)
    reservations = [r for r, _ in context["reservations"]]
    return {**context, **negotiation_context(lease, reservations, offers=offers)}


@role_required("viewer")
@vary_on_headers("HX-Request")
def lease_detail(request, lease_id: int):
    lease = get_object_or_404(Lease, pk=lease_id)
    template = "leases/_lease_body.html" if request.htmx else "leases/detail.html"
    return render(request, template, page_context(request, lease, offers=not request.htmx))


@role_required("operator")
def lease_new(request):
    """The lease request form: its three types, several VMs of one size, capabilities, groups, preemptible. A
    submission lands on the lease's page with its decision and placement report, accepted or not."""
    if request.method == "POST":
        now = timezone.now()  # the request's arrival: validated against, and submitted with
        checked = forms.check_lease(request.POST, now=now)
        if checked.ok and checked.data.get("copies", 1) > 1:
            return _submit_copies(request, checked.data, now)
        if checked.ok:
            try:
                result = actions.do_submit_lease(
                    request.user, actions.LeaseSpec.from_request(checked.data), now=now
                )
            except DomainError as exc:
                checked.add("form", str(exc))
            else:
                lease = result.lease
                if result.decision.accepted:
                    messages.success(request, f"Lease {lease.pk} {lease.name}: {result.decision.message}")
                else:
                    messages.error(
                        request, f"Lease {lease.pk} {lease.name} {lease.state}: {result.decision.message}"
                    )
                return redirect("lease-detail", lease_id=lease.pk)
        return render(
            request, "leases/new.html", lease_form_context(checked.values, checked.errors), status=400
        )
    return render(request, "leases/new.html", lease_form_context(dict(forms.DEFAULTS), {}))


def _submit_copies(request, data: dict, now):
    """N copies of the form's lease, as one lease array (the API's `POST /api/leases/batch` path): named "name-1"
    .. "name-N", decided in one pass, in order; the lease list shows them, newest first, with what became of each."""
    copies = data["copies"]
    items = []
    for i in range(1, copies + 1):
        spec = actions.LeaseSpec.from_request({**data, "name": f"{data['name']}-{i}"[:200]})
        items.append(actions.BatchItem(spec))
    done = actions.do_submit_leases(request.user, items, now=now)
    placed = sum(1 for item in done if item.submitted and item.submitted.decision.accepted)
    text = f"{copies} copies of {data['name']} submitted: {placed} accepted, {copies - placed} refused."
    (messages.success if placed == copies else messages.warning)(request, text)
    return redirect("lease-list")


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
        context = {**page_context(request, lease), "cancel": checked}
        return render(request, "leases/detail.html", context, status=400)
    try:
        lease = actions.do_cancel_lease(
            request.user, lease.pk, now=timezone.now(), reason=checked.data["reason"]
        )
        messages.success(request, f"Lease {lease.pk} {lease.name} cancelled.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("lease-detail", lease_id=lease.pk)


# -- negotiating a lease (issue 48): a counter-offer taken, an end changed ------------------------------------------

# The largest change of an end the form takes, either way (the API takes up to a year).
MAX_CHANGE_MIN = 7 * 24 * 60


@role_required("operator")
@require_POST
def lease_resubmit(request, lease_id: int):
    """A counter-offer taken: the rejected lease's request again, from the offered start."""
    lease = get_object_or_404(Lease, pk=lease_id)
    now = timezone.now()
    try:
        start = parse_datetime(request.POST.get("start", ""))
    except ValueError:  # well-formed but not a date ("2030-02-30")
        start = None
    # As the API's start field reads it: a time with its zone, not in the past, not beyond how far ahead one books.
    if (
        start is None
        or start.tzinfo is None
        or not now <= start <= now + MAX_START_AHEAD
        or lease.type != "advance_reservation"
    ):
        messages.error(request, "That offer is not a time this lease can be asked for again.")
        return redirect("lease-detail", lease_id=lease.pk)
    try:
        result = actions.do_submit_lease(request.user, actions.spec_of(lease, start=start), now=now)
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("lease-detail", lease_id=lease.pk)
    new = result.lease
    if result.decision.accepted:
        messages.success(
            request, f"Lease {new.pk} {new.name} (for lease {lease.pk}): {result.decision.message}"
        )
    else:
        messages.error(request, f"Lease {new.pk} {new.name} {new.state}: {result.decision.message}")
    return redirect("lease-detail", lease_id=new.pk)


@role_required("operator")
@require_POST
def lease_change_end(request, lease_id: int):
    """Change the end by a number of minutes: "preview" answers on the page, "apply" does it."""
    lease = get_object_or_404(Lease, pk=lease_id)
    raw = request.POST.get("by_min", "").strip()
    errors = {}
    try:
        minutes = float(raw)
        if not raw or minutes != minutes or abs(minutes) > MAX_CHANGE_MIN or minutes == 0:
            raise ValueError
    except ValueError:
        errors["by_min"] = [f"A number of minutes, not 0, at most {MAX_CHANGE_MIN:,} either way."]
        minutes = 0.0
    reason = request.POST.get("reason", "").strip()[:300].replace("\x00", "")
    preview = request.POST.get("do") != "apply"
    done = None
    if not errors:
        try:
            done = actions.do_change_end(
                request.user, lease.pk, now=timezone.now(), by_s=minutes * 60, dry_run=preview, reason=reason
            )
        except DomainError as exc:
            errors["by_min"] = [str(exc)]
    if done is not None and not preview and done.change.ok:
        messages.success(request, f"Lease {lease.pk}: {done.change.message}")
        return redirect("lease-detail", lease_id=lease.pk)
    lease.refresh_from_db()
    context = {
        **page_context(request, lease),
        "change": {
            "answer": done.answer() if done is not None else None,
            "ok": done is not None and done.change.ok,
            "preview": preview,
            "errors": errors,
            "values": {"by_min": raw, "reason": reason},
        },
    }
    status = 400 if errors else 409 if (done is not None and not done.change.ok and not preview) else 200
    return render(request, "leases/detail.html", context, status=status)


# -- the queue forecast on the slot table ---------------------------------------------------------------------------

# Queued leases a page of the forecast draws: unpaged, it grew to 39 rows under the table in the demo.
ESTIMATE_PAGE = 10
WIDTH, LABEL_W, ROW_H = slotchart.WIDTH, slotchart.LABEL_W, slotchart.LANE_H


def estimate_context(state: slotchart.State) -> dict:
    """The queue forecast under the node rows, apart from real reservations: one row per queued lease estimated to
    run in the window, in queue order, ESTIMATE_PAGE to a page (`?fpage=`), its bar hatched and labelled
    "estimated". Not on a node's row: an estimate holds no node, and the scheduler may start the lease elsewhere.
    Two queries, as before it was paged: the counts in one, the page's leases in the other."""
    start, end = state.window.start, state.window.end
    queued = Lease.objects.filter(state__in=("queued", "suspended_queued"))
    in_window = Q(estimated_start__lt=end, estimated_end__gt=start)
    counts = queued.aggregate(
        shown=Count("id", filter=in_window), unestimated=Count("id", filter=Q(estimated_start__isnull=True))
    )
    total = counts["shown"] or 0
    pages = max(1, -(-total // ESTIMATE_PAGE))
    page = min(state.forecast_page, pages)
    lo = (page - 1) * ESTIMATE_PAGE
    shown = queued.filter(in_window).order_by("submitted_at", "id")
    leases = (
        list(shown.only("id", "name", "estimated_start", "estimated_end")[lo : lo + ESTIMATE_PAGE])
        if total
        else []
    )
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
        "estimates_total": total,
        "estimates_first": lo + 1,
        "estimates_last": lo + len(rows),
        "forecast_page": page,
        "forecast_pages": pages,
        "forecast_prev": state.url(fpage=str(page - 1) if page > 2 else None) if page > 1 else "",
        "forecast_next": state.url(fpage=str(page + 1)) if page < pages else "",
        # The fold is the operator's (console.js keeps it in the URL as they toggle it): a render only starts it.
        "forecast_open": state.forecast_open,
        "estimates_height": max(1, len(rows)) * ROW_H,
        "row_h": ROW_H,  # each row's stripe and bar (the template drew them with an empty height without it)
        "unestimated": counts["unestimated"] or 0,
    }
