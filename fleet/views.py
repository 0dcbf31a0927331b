"""Console pages of the fleet: the pieces of the board and the node page (rows with memory as observed and
committed, totals, the health chart) and a stored placement report. The board, the node page and its forms (drain,
declare-dead, re-admit) and the placement preview show or change what runs on nodes, so they are composed one
layer up (leases/instances/node_views.py) from these pieces."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.shortcuts import get_object_or_404, render

from fleet import capacity
from fleet.models import HealthSample, Node, NodeStatus, PlacementReport
from fleet.placement import Claims, snapshot
from slotkeeper.decorators import role_required

STALE_AFTER_S = 30


@dataclass
class NodeRow:
    """One node as the board shows it: the row, its health age, and memory as observed and as committed."""

    node: Node
    age: float | None
    use: capacity.MemoryUse | None

    @property
    def stale(self) -> bool:
        return self.age is None or self.age > STALE_AFTER_S

    def pct(self, mib: int | None) -> float:
        return min(100.0, 100.0 * (mib or 0) / max(self.node.mem_total_mib, 1))

    @property
    def observed_pct(self) -> float:
        return self.pct(self.use.observed_mib if self.use else None)

    @property
    def committed_pct(self) -> float:
        return self.pct(self.use.committed_mib if self.use else None)

    @property
    def overcommitted(self) -> bool:
        return self.use is not None and self.use.committed_mib > self.node.mem_total_mib


@dataclass
class CapacityTotals:
    """Sums over nodes that can take work (online), beside the whole fleet's declared size."""

    nodes: int = 0
    cores: int = 0
    mem_mib: int = 0
    online_cores: int = 0
    online_mem_mib: int = 0
    observed_mib: int = 0
    committed_mib: int = 0

    def gib(self) -> dict[str, float]:
        """The memory sums in GiB, which is how people talk about a fleet's memory."""
        names = ("mem_mib", "online_mem_mib", "observed_mib", "committed_mib")
        return {name.removesuffix("_mib"): round(getattr(self, name) / 1024, 1) for name in names}

    def add(self, row: NodeRow) -> None:
        n = row.node
        self.nodes += 1
        self.cores += n.cpu_cores
        self.mem_mib += n.mem_total_mib
        if n.status != NodeStatus.ONLINE:
            return
        self.online_cores += n.cpu_cores
        self.online_mem_mib += n.mem_total_mib
        if row.use is not None:
            self.observed_mib += row.use.observed_mib
            self.committed_mib += row.use.committed_mib


def node_rows(nodes: list[Node], now: datetime, claims: Claims | None = None) -> list[NodeRow]:
    """Rows with the placer's own view of memory, from the commitments the caller read (`claims`, one query for
    all nodes whatever their number; the instances package reads them)."""
    rows = []
    for node, state in zip(nodes, snapshot(now, nodes, claims=claims), strict=True):
        rows.append(NodeRow(node=node, age=state.health_age_s, use=capacity.effective_use(state)))
    return rows


def matches(node: Node, status: str, q: str) -> bool:
    if status and node.status != status:
        return False
    q = q.lower()
    return not q or q in node.name.lower() or any(q in c.lower() for c in node.capabilities or ())


def chart(samples: list[HealthSample], now: datetime, width: int = 600, height: int = 100) -> dict | None:
    """Polylines (memory %, CPU %) over the last hour, as SVG points: drawn server-side, no chart library."""
    if not samples:
        return None
    start = now - timedelta(hours=1)

    def x(at: datetime) -> float:
        return round(width * max(0.0, (at - start).total_seconds()) / 3600, 1)

    def y(pct: float) -> float:
        return round(height - height * max(0.0, min(100.0, pct)) / 100, 1)

    last = samples[-1]
    return {
        "width": width,
        "height": height,
        "mem": " ".join(f"{x(s.at)},{y(100 * s.mem_used_mib / max(s.mem_total_mib, 1))}" for s in samples),
        "cpu": " ".join(f"{x(s.at)},{y(s.cpu_pct)}" for s in samples),
        "grid": [{"y": y(p), "label": p} for p in (25, 50, 75)],
        "minutes": [{"x": round(width * m / 60, 1), "label": f"-{60 - m} min"} for m in (0, 15, 30, 45)],
        "last_mem_pct": round(100 * last.mem_used_mib / max(last.mem_total_mib, 1)),
        "last_cpu_pct": round(last.cpu_pct),
        "count": len(samples),
    }


SORTS = {
    "node": lambda v: v["node"],
    "fit": lambda v: (not v["fit"], v.get("reason_code") or ""),
    "reason": lambda v: (v.get("reason_code") or "", v["node"]),
    "slots": lambda v: v.get("slots") or 0,
    "headroom": lambda v: v.get("headroom") or 0.0,
}


def sort_verdicts(verdicts: list[dict], sort: str) -> list[dict]:
    """Verdicts in the asked order ("-headroom" reverses); anything unknown keeps the placer's rank order, which
    is the default because it lists capable nodes before incapable ones."""
    key = SORTS.get(sort.lstrip("-"))
    if key is None:
        return list(verdicts)
    return sorted(verdicts, key=key, reverse=sort.startswith("-"))


@role_required("viewer")
def report_detail(request, report_id: int):
    report = get_object_or_404(PlacementReport, pk=report_id)
    sort = request.GET.get("sort", "rank")
    context = {"report": report, "verdicts": sort_verdicts(report.verdicts, sort), "sort": sort}
    return render(request, "fleet/report.html", context)
