"""The slot table as a chart: which nodes it shows (the filters), how each node's row is laid out (lanes for
overlapping reservations, a band for the drain reason, a utilisation strip for reservations too thin to draw), and
the pages of rows it is sent in.

The page shows the first ROWS_PER_PAGE rows; the rows after them come one page at a time as they scroll into view
(leases.views.slot_rows), and a live refresh re-renders the pages already loaded in one response. Whatever the fleet,
a render costs the same handful of queries: every node's name, status and capabilities (for the filters and the
count), the page's nodes, committed-now figures for them, and their allocations in the window.

Pure arithmetic (lanes, ticks, folding) is in leases/slots/chart.py; the SVG of each kind of mark in
leases/slot_marks.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.db import connection
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from fleet.models import Node, NodeStatus
from fleet.views import Figures, figures
from leases.models import Allocation
from leases.reads import committed_now
from leases.slot_marks import Alloc, reservation_bar, row_backdrop, row_group, shorten, utilisation_strip
from leases.slots import chart
from slotkeeper.fields import is_id

ZOOMS = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
WIDTH = 1200
LABEL_W = 190
PAD_R = 12  # room on the right so the last tick's label is never clipped
PLOT_W = WIDTH - LABEL_W - PAD_R
AXIS_H = 30
LANE_H = 18
BAR_H = 14
REASON_H = 16  # an unavailable node's status and drain reason, on their own band above its bars
STRIP_H = 10
ROWS_PER_PAGE = 50
MAX_PAGES = 40  # a live refresh re-renders at most this many loaded pages (2,000 rows)
# Bars narrower than this (viewBox px) are folded into the row's utilisation strip.
LOD_MIN_W = 2.0


@dataclass(frozen=True)
class Filters:
    """The slot table's filters, as GET parameters: node name (substring), capability, status, and lease (an id,
    or part of a name: only the nodes holding it in the window, its bars highlighted)."""

    q: str = ""
    cap: str = ""
    status: str = ""
    lease: str = ""

    @classmethod
    def from_query(cls, params) -> Filters:
        status = params.get("status", "").strip()
        return cls(
            q=params.get("q", "").strip(),
            cap=params.get("cap", "").strip(),
            status=status if status in NodeStatus.values else "",
            lease=params.get("lease", "").strip(),
        )

    def params(self) -> dict[str, str]:
        return {
            k: v
            for k, v in (("q", self.q), ("cap", self.cap), ("status", self.status), ("lease", self.lease))
            if v
        }

    @property
    def active(self) -> bool:
        return bool(self.params())

    def matches_lease(self, a: Alloc) -> bool:
        if not self.lease:
            return False
        if is_id(self.lease):
            return a.lease_id == int(self.lease)
        return self.lease.lower() in a.lease_name.lower()


@dataclass(frozen=True)
class Window:
    zoom: str
    start: datetime
    end: datetime
    now: datetime
    following_now: bool

    @property
    def span_s(self) -> float:
        return (self.end - self.start).total_seconds()

    def x(self, t: datetime) -> float:
        return LABEL_W + PLOT_W * max(0.0, min(1.0, (t - self.start).total_seconds() / self.span_s))

    def params(self) -> dict[str, str]:
        out = {"zoom": self.zoom}
        if not self.following_now:
            out["from"] = self.start.isoformat()
        return out


def window_from(params, now: datetime) -> Window:
    from django.utils import timezone
    from django.utils.dateparse import parse_datetime

    zoom = params.get("zoom", "6h")
    zoom = zoom if zoom in ZOOMS else "6h"
    span = ZOOMS[zoom]
    raw = params.get("from", "") or ""
    try:
        start = parse_datetime(raw)
    except ValueError:
        start = None
    following = start is None
    start = start or (now - span / 6)
    if timezone.is_naive(start):
        start = start.replace(tzinfo=UTC)
    return Window(zoom, start, start + span, now, following)


@dataclass
class Row:
    node: Node
    index: int
    y: int
    height: int
    title: str
    figures: Figures
    label: str
    reason: str
    lanes: int
    marks: SafeString = field(default_factory=lambda: mark_safe(""))


@dataclass
class Page:
    index: int
    rows: list[Row]
    height: int
    first: int  # 1-based number of its first row, for "nodes 51–100"
    backdrop: SafeString = field(default_factory=lambda: mark_safe(""))
    markup: SafeString = field(default_factory=lambda: mark_safe(""))  # the row groups, in order


def matching_nodes(filters: Filters, window: Window) -> list[int]:
    """The ids of the nodes the filters keep, by name: one query on the nodes (and one on the window's allocations
    when filtering by lease). Capabilities are a JSON list, matched here (SQLite has no JSON containment)."""
    rows = Node.objects.order_by("name")
    if filters.q:
        rows = rows.filter(name__icontains=filters.q)
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.cap:
        cap = filters.cap.lower()
        found = rows.values_list("id", "capabilities")
        ids = [i for i, caps in found if any(cap in str(c).lower() for c in caps or ())]
    else:
        # Only the ids: decoding every node's capabilities (JSON) cost a row page 2 ms for nothing.
        ids = list(rows.values_list("id", flat=True))
    if filters.lease:
        allocs = Allocation.objects.filter(start__lt=window.end, end__gt=window.start)
        if is_id(filters.lease):
            allocs = allocs.filter(reservation__lease_id=int(filters.lease))
        else:
            allocs = allocs.filter(reservation__lease__name__icontains=filters.lease)
        hosts = set(allocs.values_list("node_id", flat=True))
        ids = [i for i in ids if i in hosts]
    return ids


def window_allocations(start: datetime, end: datetime, node_ids) -> list[Alloc]:
    """Every allocation overlapping the window on these nodes with its reservation and lease, in one query, as
    plain tuples (model objects cost seven times as much as the tuples at 10,000 bars, measured)."""
    rows = (
        Allocation.objects.filter(start__lt=end, end__gt=start, node_id__in=node_ids)
        .order_by("start", "id")
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
    # The ORM's query, run on a cursor: Django's SQLite converters (a regular expression and make_aware for each
    # start and end) were a fifth of a row page's CPU; fromisoformat reads the same text at a tenth of the cost.
    # PostgreSQL returns aware datetimes, kept as they are.
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    return [Alloc(r[0], r[1], _aware(r[2]), _aware(r[3]), *r[4:]) for r in found]


def _aware(value) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def row_label(node: Node, committed: dict[int, tuple[float, int, int]]) -> tuple[str, Figures, str]:
    """A node's row title (status, drain reason, capacity figures: the same the board and the node API show), its
    figures, and its name as the label column shows it."""
    title = f"{node.name}: {node.status}"
    if node.drain_reason:
        title += f", drained: {node.drain_reason}"
    shown = figures(node, committed)
    room = 19 if shown.over else 24
    label = shorten(node.name, room)
    if not label:
        # One word longer than the column (a name without spaces): cut inside it, or it runs across the chart. The
        # accessible name then starts with what is shown, so it still holds the visible words (axe's
        # label-content-name-mismatch), and the full name follows.
        label = node.name[: room - 1] + "…"
        title = f"{label} {title}"
    return f"{title}; {shown.summary}", shown, label


def reason_of(node: Node) -> str:
    if node.drain_reason:
        return f"{node.status}: {node.drain_reason}"
    return "" if node.status == NodeStatus.ONLINE else node.status


def zoom_link(window: Window, node: Node, start: datetime, end: datetime, filters: Filters) -> str:
    """Where a utilisation strip leads: the next closer zoom, around the strip, on that node alone."""
    names = list(ZOOMS)
    closer = names[max(0, names.index(window.zoom) - 1)]
    span = ZOOMS[closer]
    centre = start + (end - start) / 2
    params = {**filters.params(), "zoom": closer, "from": (centre - span / 2).isoformat(), "q": node.name}
    return f"{reverse('slot-table')}?{urlencode(params)}"


def layout_row(
    node: Node, allocs: list[Alloc], top: int, window: Window, filters: Filters, link: str
) -> tuple[int, int, str]:
    """One node's row from its allocations (in time order): its height, its lane count and its marks. Bars under
    LOD_MIN_W fold into a utilisation strip on a band of their own below the lanes; the others take lanes so that
    no two overlap; an unavailable node's reason takes a band above them, so no bar ever covers it."""
    t0, span = window.start.timestamp(), window.span_s

    def x(t: datetime) -> float:  # Window.x, inlined: two calls a bar
        return LABEL_W + PLOT_W * max(0.0, min(1.0, (t.timestamp() - t0) / span))

    spans = [(x(a.start), x(a.end)) for a in allocs]
    wide, strips = chart.fold_thin(spans, LOD_MIN_W)
    drawn = [(spans[i][0], spans[i][0] + max(1.0, spans[i][1] - spans[i][0])) for i in wide]
    lanes, count = chart.assign_lanes(drawn)
    reason_h = REASON_H if reason_of(node) else 0
    lanes_top = top + reason_h
    strip_top = lanes_top + count * LANE_H
    height = reason_h + max(LANE_H, count * LANE_H + (STRIP_H if strips else 0))
    marks: list[str] = []
    for i, lane, (x0, x1) in zip(wide, lanes, drawn, strict=True):
        a = allocs[i]
        y = lanes_top + lane * LANE_H + (LANE_H - BAR_H) // 2
        marks.append(
            reservation_bar(a, x0, x1 - x0, y, BAR_H, lane, node.name, link, filters.matches_lease(a))
        )
    for strip in strips:
        members = [allocs[i] for i in strip.members]
        target = zoom_link(window, node, members[0].start, max(m.end for m in members), filters)
        marks.append(
            utilisation_strip(
                members,
                strip.x0,
                strip.x1 - strip.x0,
                strip_top + 1,
                STRIP_H - 2,
                strip.fill,
                node.name,
                target,
            )
        )
    return height, count, "".join(marks)


NODE_FIELDS = ("id", "name", "status", "drain_reason", "cpu_cores", "mem_total_mib", "disk_total_gib")


def build_pages(ids: list[int], first_page: int, pages: int, window: Window, filters: Filters) -> list[Page]:
    """Pages first_page .. first_page + pages - 1 of the rows of `ids`, laid out: three queries for any number."""
    lo = first_page * ROWS_PER_PAGE
    wanted = ids[lo : lo + pages * ROWS_PER_PAGE]
    if not wanted:
        return []
    by_id = {n.pk: n for n in Node.objects.only(*NODE_FIELDS, "idle_baseline_mib").filter(pk__in=wanted)}
    committed = committed_now(window.now, wanted)
    allocs: dict[int, list[Alloc]] = {}
    for a in window_allocations(window.start, window.end, wanted):
        allocs.setdefault(a.node_id, []).append(a)
    link = reverse("lease-detail", args=[0])[:-2]  # "/leases/": the id and slash are appended per bar
    node_link = reverse("node-detail", args=[0])[:-2]  # "/nodes/"
    out: list[Page] = []
    for p in range(pages):
        chunk = wanted[p * ROWS_PER_PAGE : (p + 1) * ROWS_PER_PAGE]
        if not chunk:
            break
        y = 0
        rows: list[Row] = []
        for k, node_id in enumerate(chunk):
            node = by_id[node_id]
            title, shown, label = row_label(node, committed)
            height, lanes, marks = layout_row(node, allocs.get(node_id, []), y, window, filters, link)
            index = lo + p * ROWS_PER_PAGE + k
            # Every database text in `marks` went through escape() (leases/slot_marks.py).
            rows.append(
                Row(node, index, y, height, title, shown, label, reason_of(node), lanes, mark_safe(marks))  # noqa: S308
            )
            y += height
        page_index = first_page + p
        # Every database text in both went through escape() (leases/slot_marks.py).
        backdrop = mark_safe(row_backdrop(rows, WIDTH, LABEL_W))  # noqa: S308
        markup = mark_safe("".join(row_group(r, WIDTH, LABEL_W, node_link) for r in rows))  # noqa: S308
        out.append(Page(page_index, rows, y, page_index * ROWS_PER_PAGE + 1, backdrop, markup))
    return out


def axis(window: Window) -> list[dict]:
    """The axis ticks on round times, each with its x and its label's anchor (the first and last stay inside)."""
    half = (
        4 * 6.5
    )  # about half of a 7-character label ("Tue 09 Dec" is 10: those anchor by the edge test too)
    out = []
    for t in chart.ticks(window.start, window.end, PLOT_W):
        x = round(window.x(t.at), 1)
        width = len(t.label) * 3.4
        out.append(
            {
                "x": x,
                "label": t.label,
                "anchor": chart.anchor_for(x, LABEL_W, WIDTH - 2, max(half, width)),
                "day": t.label[:1].isalpha(),
            }
        )
    return out


def chart_context(window: Window, filters: Filters, pages: int = 1, first_page: int = 0) -> dict:
    ids = matching_nodes(filters, window)
    total_pages = max(1, -(-len(ids) // ROWS_PER_PAGE))
    pages = max(1, min(pages, MAX_PAGES, total_pages - first_page))
    built = build_pages(ids, first_page, pages, window, filters)
    next_page = first_page + len(built)
    shown = sum(len(p.rows) for p in built)
    query = {**window.params(), **filters.params()}
    now_x = round(window.x(window.now), 1) if window.start <= window.now <= window.end else None
    return {
        "pages": built,
        "ticks": axis(window),
        "now_x": now_x,
        "node_count": len(ids),
        "shown_rows": first_page * ROWS_PER_PAGE + shown,
        "next_page": next_page if next_page < total_pages else None,
        "next_first": next_page * ROWS_PER_PAGE + 1,
        "next_last": min(len(ids), (next_page + 1) * ROWS_PER_PAGE),
        "rows_url": f"{reverse('slot-rows')}?{urlencode(query)}",
        "width": WIDTH,
        "label_w": LABEL_W,
        "plot_right": WIDTH - PAD_R,
        "axis_h": AXIS_H,
        "start": window.start,
        "end": window.end,
        "window_date": window.start.strftime("%a %d %b %Y"),
        "filters": filters,
    }
