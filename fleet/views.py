"""Console pages of the fleet: the pieces of the board and the node page (rows with observed memory and the capacity
figures, allocatable and committed now, in user units, and each row's version for the board's live patches; the
fleet's sums as one aggregate query; the health chart) and a stored placement report. The
board, the node page and its forms (drain, declare-dead, re-admit) and the placement preview show or change what
runs on nodes, so they are composed one layer up (leases/instances/node_views.py) from these pieces."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q, Sum
from django.shortcuts import get_object_or_404, render

from fleet import nodestate
from fleet.filters import allocatable_mem
from fleet.models import HealthSample, Node, NodeStatus, PlacementReport
from fleet.placement import snapshot
from slotkeeper.decorators import role_required

STALE_AFTER_S = 30

# Memory reads in MiB up to this much, in GiB above (both figures of a pair in the larger one's unit).
GIB_FROM_MIB = 10 * 1024


def memory(mib: int, unit: str | None = None) -> str:
    """Memory in user units: "2,048 MiB", "27.5 GiB"."""
    unit = unit or ("GiB" if abs(mib) >= GIB_FROM_MIB else "MiB")
    return f"{mib / 1024:,.1f} GiB" if unit == "GiB" else f"{mib:,} MiB"


def memory_pair(part: int, whole: int) -> str:
    """Part and whole in the unit of the larger: "1,024 / 2,048 MiB", "12.0 / 27.5 GiB"."""
    unit = "GiB" if max(abs(part), abs(whole)) >= GIB_FROM_MIB else "MiB"
    return f"{memory(part, unit).rsplit(' ', 1)[0]} / {memory(whole, unit)}"


def cores(value: float) -> str:
    return f"{value:g} core{'' if value == 1 else 's'}"


def age_words(seconds: float) -> str:
    """A health age as a person reads it: "12 s", "5 min", "3 h", "2 d" (console.js writes it the same way as it
    counts the age up between updates)."""
    s = int(max(0.0, seconds) + 0.5)  # half up, as Math.round in console.js
    if s < 120:
        return f"{s} s"
    if s < 120 * 60:
        return f"{s // 60} min"
    if s < 48 * 3600:
        return f"{s // 3600} h"
    return f"{s // 86400} d"


@dataclass(frozen=True)
class Figures:
    """A node's capacity figures (nodestate.capacity_figures, the same the node API shows) in user units, for the
    board, the node page and the slot table's row labels."""

    of: nodestate.CapacityFigures

    @property
    def mem(self) -> str:
        return memory_pair(self.of.committed.mem_mib, self.of.allocatable.mem_mib)

    @property
    def cpu(self) -> str:
        return f"{self.of.committed.cpu_cores:g} / {cores(self.of.allocatable.cpu_cores)}"

    @property
    def disk(self) -> str:
        return f"{self.of.committed.disk_gib:,} / {self.of.allocatable.disk_gib:,} GiB disk"

    @property
    def allocatable(self) -> str:
        return f"{cores(self.of.allocatable.cpu_cores)} · {memory(self.of.allocatable.mem_mib)}"

    @property
    def free(self) -> str:
        free = self.of.free
        return f"{cores(free.cpu_cores)} · {memory(free.mem_mib)} · {free.disk_gib:,} GiB disk"

    @property
    def reserve(self) -> str:
        return f"{memory(nodestate.HOST_RESERVE_MIB)}, {nodestate.DISK_RESERVE_GIB} GiB disk"

    @property
    def pct(self) -> float:
        """Committed memory in percent of allocatable, for the bar (full when over, or when nothing is
        allocatable and something is committed)."""
        committed, whole = self.of.committed.mem_mib, self.of.allocatable.mem_mib
        if whole <= 0:
            return 100.0 if committed > 0 else 0.0
        return min(100.0, 100.0 * committed / whole)

    @property
    def over(self) -> bool:
        return self.of.over_allocatable

    @property
    def over_by(self) -> str:
        """The overrun per dimension ("2,048 MiB memory and 1 core"); empty when within allocatable."""
        over = self.of.over
        parts = []
        if over.mem_mib:
            parts.append(f"{memory(over.mem_mib)} memory")
        if over.cpu_cores:
            parts.append(cores(over.cpu_cores))
        if over.disk_gib:
            parts.append(f"{over.disk_gib:,} GiB disk")
        return " and ".join(parts)

    @property
    def summary(self) -> str:
        """One line for a tooltip: committed now of allocatable, and the overrun when there is one."""
        text = f"committed now {self.mem}, {self.cpu} (of allocatable)"
        return f"{text}; over allocatable by {self.over_by}" if self.over else text


def figures(node: Node, committed: dict[int, tuple[float, int, int]]) -> Figures:
    """The node's figures, with `committed` as leases.reads.committed_now returned it (read once per page by the
    layer that knows leases; fleet does not import it)."""
    return Figures(
        nodestate.capacity_figures(
            node.cpu_cores,
            node.mem_total_mib,
            node.disk_total_gib,
            node.idle_baseline_mib,
            committed.get(node.pk),
        )
    )


@dataclass
class NodeRow:
    """One node as the board shows it: the row, its health age, observed memory use (heartbeat), and its capacity
    figures (allocatable, committed now)."""

    node: Node
    age: float | None
    observed_mib: int | None
    figures: Figures

    @property
    def stale(self) -> bool:
        return self.age is None or self.age > STALE_AFTER_S

    @property
    def declared(self) -> str:
        return f"{cores(self.node.cpu_cores)} · {memory(self.node.mem_total_mib)}"

    @property
    def observed_mem(self) -> str:
        return "memory unreadable" if self.observed_mib is None else memory(self.observed_mib)

    @property
    def baseline(self) -> str:
        """The host's remembered idle footprint, and whether the floor counts instead (nodestate.allocatable)."""
        floor = memory(nodestate.BASELINE_FLOOR_MIB)
        remembered = self.node.idle_baseline_mib
        if not remembered:
            return f"not yet observed idle: the {floor} floor counts"
        if remembered < nodestate.BASELINE_FLOOR_MIB:
            return f"{memory(remembered)} measured idle: the {floor} floor counts"
        return f"{memory(remembered)} measured idle"

    @property
    def observed_pct(self) -> float:
        """Observed used memory in percent of declared (the heartbeat counts the host's own use too)."""
        return min(100.0, 100.0 * (self.observed_mib or 0) / max(self.node.mem_total_mib, 1))

    @property
    def age_text(self) -> str:
        return "never" if self.age is None else age_words(self.age)

    @property
    def seen(self) -> float | None:
        """The last heartbeat in seconds since the epoch: the page counts the age up from it itself, so a row
        does not change (and is not sent again) every second only because time passed."""
        at = self.node.last_heartbeat_at
        return round(at.timestamp(), 1) if at else None

    @property
    def version(self) -> str:
        """A fingerprint of everything the row shows but its age: a live page sends the versions it shows and is
        sent only the rows whose version moved (leases/instances/board.py)."""
        n = self.node
        shown = (
            n.pk, n.name, n.status, n.status_reason, n.last_heartbeat_at,
            n.cpu_cores, n.mem_total_mib, n.disk_total_gib, n.idle_baseline_mib, self.figures.of,
            self.observed_mib, n.obs_disk_free_gib, n.obs_cpu_pct, n.capabilities,
            n.drain_reason, n.drained_by_id, n.drained_at,
        )  # fmt: skip
        return f"{zlib.crc32(repr(shown).encode()):08x}"


@dataclass
class CapacityTotals:
    """Sums over nodes that can take work (online), beside the whole fleet's declared size."""

    nodes: int = 0
    cores: int = 0
    mem_mib: int = 0
    online_cores: int = 0
    online_mem_mib: int = 0
    observed_mib: int = 0
    allocatable_cores: float = 0.0
    allocatable_mib: int = 0
    committed_cores: float = 0.0
    committed_mib: int = 0
    over: int = 0

    def gib(self) -> dict[str, float]:
        """The memory sums in GiB, which is how people talk about a fleet's memory."""
        names = ("mem_mib", "online_mem_mib", "observed_mib", "allocatable_mib", "committed_mib")
        return {name.removesuffix("_mib"): round(getattr(self, name) / 1024, 1) for name in names}


def fleet_sums() -> tuple[dict[str, int], CapacityTotals]:
    """Nodes per status and the fleet's declared, online, observed and allocatable sums: one aggregate query,
    whatever the fleet's size. What the slot table holds (committed, over allocatable) is added by the layer
    that knows leases (leases/instances/board.py)."""
    online = Q(status=NodeStatus.ONLINE)
    sums = Node.objects.aggregate(
        nodes=Count("id"),
        cores=Sum("cpu_cores"),
        mem_mib=Sum("mem_total_mib"),
        online_cores=Sum("cpu_cores", filter=online),
        online_mem_mib=Sum("mem_total_mib", filter=online),
        observed_mib=Sum("obs_mem_used_mib", filter=online),
        allocatable_mib=Sum(allocatable_mem(), filter=online),
        **{f"status_{s}": Count("id", filter=Q(status=s)) for s in NodeStatus.values},
    )
    counts = {s: sums.pop(f"status_{s}") or 0 for s in NodeStatus.values}
    totals = CapacityTotals(**{name: value or 0 for name, value in sums.items()})
    # Every core of an online node is allocatable (nodestate.allocatable reserves memory and disk only).
    totals.allocatable_cores = float(totals.online_cores)
    return counts, totals


def node_rows(
    nodes: list[Node], now: datetime, committed: dict[int, tuple[float, int, int]]
) -> list[NodeRow]:
    """Rows with health, observed memory and the capacity figures, from what the slot table holds on each node now
    (`committed`, leases.reads.committed_now: one query for all nodes whatever their number, read by the caller)."""
    return [
        NodeRow(
            node=node,
            age=state.health_age_s,
            observed_mib=state.observed_mem_used_mib,
            figures=figures(node, committed),
        )
        for node, state in zip(nodes, snapshot(now, nodes), strict=True)
    ]


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
    context = {"report": report, "verdicts": sort_verdicts(report.rows, sort), "sort": sort}
    return render(request, "fleet/report.html", context)
