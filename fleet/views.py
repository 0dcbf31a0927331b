"""Console pages of the fleet: the board, a node, a stored placement report. Each page URL also serves its
fragment to htmx (same URL, `HX-Request`), so a live "node-changed" event re-fetches just the table."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers

from fleet import actions
from fleet.models import HealthSample, Node, NodeStatus, PlacementReport
from slotkeeper.decorators import role_required
from slotkeeper.domain import DomainError


def node_rows(nodes, now):
    rows = []
    for n in nodes:
        age = (now - n.last_heartbeat_at).total_seconds() if n.last_heartbeat_at else None
        total = n.mem_total_mib or 1
        observed = n.obs_mem_used_mib or 0
        rows.append(
            {
                "node": n,
                "age": age,
                "stale": age is None or age > 30,
                "observed_pct": min(100.0, 100.0 * observed / total),
                "baseline_pct": min(100.0, 100.0 * (n.idle_baseline_mib or 0) / total),
            }
        )
    return rows


@role_required("viewer")
@vary_on_headers("HX-Request")
def board(request):
    now = timezone.now()
    status = request.GET.get("status", "")
    q = request.GET.get("q", "").strip()
    nodes = Node.objects.select_related("drained_by").order_by("name")
    if status in NodeStatus.values:
        nodes = nodes.filter(status=status)
    if q:
        nodes = nodes.filter(name__icontains=q)
    totals = dict.fromkeys(NodeStatus.values, 0)
    for row in Node.objects.values("status").annotate(n=Count("id")):
        totals[row["status"]] = row["n"]
    latest_report = PlacementReport.objects.only("id", "created_at", "outcome", "subject").first()
    context = {
        "rows": node_rows(nodes, now),
        "totals": totals,
        "status": status,
        "q": q,
        "statuses": NodeStatus.values,
        "latest_report": latest_report,
        "now": now,
    }
    template = "fleet/_board_table.html" if request.htmx and not request.htmx.boosted else "fleet/board.html"
    return render(request, template, context)


@role_required("viewer")
@vary_on_headers("HX-Request")
def node_detail(request, node_id: int):
    node = get_object_or_404(Node.objects.select_related("drained_by"), pk=node_id)
    now = timezone.now()
    samples = list(
        HealthSample.objects.filter(node=node, at__gte=now - timezone.timedelta(hours=1)).order_by("at")[
            :2000
        ]
    )
    context = {
        "node": node,
        "row": node_rows([node], now)[0],
        "samples": samples,
        "chart": chart(samples, now),
    }
    template = "fleet/_node_status.html" if request.htmx else "fleet/node.html"
    return render(request, template, context)


def chart(samples, now, width=600, height=80):
    """Polylines (memory %, CPU %) over the last hour, as SVG points: drawn server-side, no chart library."""
    if not samples:
        return None
    start = now - timezone.timedelta(hours=1)

    def x(at):
        return round(width * max(0.0, (at - start).total_seconds()) / 3600, 1)

    def y(pct):
        return round(height - height * max(0.0, min(100.0, pct)) / 100, 1)

    mem = " ".join(f"{x(s.at)},{y(100 * s.mem_used_mib / max(s.mem_total_mib, 1))}" for s in samples)
    cpu = " ".join(f"{x(s.at)},{y(s.cpu_pct)}" for s in samples)
    return {"width": width, "height": height, "mem": mem, "cpu": cpu}


@role_required("viewer")
def report_detail(request, report_id: int):
    report = get_object_or_404(PlacementReport, pk=report_id)
    sort = request.GET.get("sort", "rank")
    verdicts = list(report.verdicts)
    if sort == "node":
        verdicts.sort(key=lambda v: v["node"])
    elif sort == "reason":
        verdicts.sort(key=lambda v: (v["fit"] is False, v.get("reason_code") or "", v["node"]))
    return render(request, "fleet/report.html", {"report": report, "verdicts": verdicts, "sort": sort})


@role_required("operator")
@require_POST
def drain(request, node_id: int):
    reason = request.POST.get("reason", "").strip()
    try:
        if request.POST.get("undrain"):
            actions.do_undrain(request.user, node_id, reason=reason, now=timezone.now())
            messages.success(request, "Node undrained.")
        else:
            actions.do_drain(request.user, node_id, reason=reason, now=timezone.now())
            messages.success(request, "Node draining.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("node-detail", node_id=node_id)
