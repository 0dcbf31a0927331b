"""The slot table as a chart: which nodes it shows (the filters), how each node's row is laid out (lanes for
overlapping reservations, a band for the drain reason, a utilisation strip for reservations too thin to draw), and
the pages of rows it is sent in.

A row draws at most MAX_LANES lanes, and its finished reservations (done, cancelled) never widen it; what does not fit
waits behind the row's "+N more", which expands the row (`?expand=`, node ids). Everything a person chose (window,
filters, rows expanded, the queue forecast's page and fold) is in the URL (`State`), so a reload or a link shows the
same table.

The page shows the first ROWS_PER_PAGE rows; the rows after them come one page at a time as they scroll into view
(leases.views.slot_rows), and a live refresh re-renders the pages already loaded in one response. Whatever the fleet,
a render costs the same handful of queries: every node's name, status and capabilities (for the filters and the
count), the page's nodes, committed-now figures for them, and their allocations in the window.

Pure arithmetic (lanes, ticks, folding) is in leases/slots/chart.py; the SVG of each kind of mark in
leases/slot_marks.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.db import connection
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import get_language

from fleet.models import Node, NodeStatus
from fleet.views import Figures, figures
from leases.models import Allocation
from leases.reads import committed_now
from leases.slot_marks import (
    Alloc,
    fingerprint,
    more_control,
    reservation_bar,
    row_backdrop,
    row_group,
    shorten,
    utilisation_strip,
)
from leases.slots import chart
from slotkeeper.fields import EARLIEST_TIME, LATEST_TIME, is_id, whole_number

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
# Lanes a row draws until it is expanded: a fourth overlapping reservation waits behind "+N more". Three keep a row
# of the 1 h and 6 h views readable at a glance; rows of 10 to 18 lanes hid all but three nodes of the demo.
MAX_LANES = 3
MORE_H = 2 * LANE_H  # a row with a "+N more" is at least this tall: the control sits under the node's name
FINISHED = frozenset({"done", "cancelled"})
MAX_EXPANDED = 100  # node ids kept from ?expand=; a longer list is cut, not refused
MAX_FORECAST_PAGE = 10_000
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


def start_from(raw: str) -> tuple[datetime | None, str]:
    """`?from=`: the window's start, or None and why not. A start the API would refuse is no window either: near the
    calendar's ends the window's own arithmetic (its end, a pan, a zoom's centre) ran past year 9999 or before year
    1 and the page answered 500."""
    from django.utils.dateparse import parse_datetime

    if not raw:
        return None, ""
    try:
        start = parse_datetime(raw)
    except ValueError:  # shaped like a date, not a real one ("2026-02-30")
        start = None
    if start is None:
        return None, f'"{raw[:40]}" is not a date and time (for example 2026-12-06T12:00:00Z).'
    start = start if start.tzinfo else start.replace(tzinfo=UTC)
    if not EARLIEST_TIME <= start <= LATEST_TIME:
        return None, "The window must start between 2000-01-01 and 9000-01-01 (UTC)."
    return start, ""


def window_from(params, now: datetime) -> Window:
    zoom = params.get("zoom", "6h")
    zoom = zoom if zoom in ZOOMS else "6h"
    span = ZOOMS[zoom]
    start, _ = start_from(params.get("from", "") or "")
    following = start is None
    start = start or (now - span / 6)
    return Window(zoom, start, start + span, now, following)


def problems(params) -> dict[str, str]:
    """The values of the table's address it cannot read, one message each; the table is shown without them (its
    default zoom, following now, any status, the forecast's first page), as the board and the lease list do. It
    showed its default view for `zoom=13h` or `from=yesterday` and said nothing."""
    found = {}
    zoom = params.get("zoom", "")
    if zoom and zoom not in ZOOMS:
        found["zoom"] = f'"{zoom[:40]}" is not a zoom; one of {", ".join(ZOOMS)}.'
    _, why = start_from(params.get("from", "") or "")
    if why:
        found["from"] = why
    status = params.get("status", "").strip()
    if status and status not in NodeStatus.values:
        found["status"] = f'"{status[:40]}" is not a node status; one of {", ".join(NodeStatus.values)}.'
    fpage = params.get("fpage", "")
    if fpage and not (whole_number(fpage) or 0) >= 1:
        found["fpage"] = f'"{fpage[:40]}" is not a page of the queue forecast (1 or more).'
    return found


def expanded_from(raw: str) -> frozenset[int]:
    """`?expand=3,12`: the node ids whose rows show every lane. Anything else in the list is ignored."""
    ids = (part.strip() for part in raw.split(",")[:MAX_EXPANDED])
    return frozenset(int(part) for part in ids if is_id(part))


@dataclass(frozen=True)
class State:
    """Everything the slot table shows that a person chose, as its URL says it: the window (`zoom`, `from`), the
    filters, the rows expanded (`expand`), the queue forecast's page (`fpage`) and whether it is folded
    (`forecast=closed`). Every link of the page and the live refresh are built from it, so that a reload, a link
    sent to a colleague, a zoom or a pan keeps what the rest of the table shows."""

    window: Window
    filters: Filters
    expanded: frozenset[int] = frozenset()
    forecast_page: int = 1
    forecast_open: bool = True

    @classmethod
    def from_query(cls, params, now: datetime) -> State:
        page = whole_number(params.get("fpage", "1")) or 1
        return cls(
            window_from(params, now),
            Filters.from_query(params),
            expanded_from(params.get("expand", "")),
            max(1, min(MAX_FORECAST_PAGE, page)),
            params.get("forecast", "") != "closed",
        )

    def params(self) -> dict[str, str]:
        out = {**self.window.params(), **self.filters.params()}
        if self.expanded:
            out["expand"] = ",".join(map(str, sorted(self.expanded)))
        if self.forecast_page > 1:
            out["fpage"] = str(self.forecast_page)
        if not self.forecast_open:
            out["forecast"] = "closed"
        return out

    def query(self, **changes: str | None) -> str:
        """The query string of this state with some parameters changed (None or "" drops one)."""
        params = self.params()
        for name, value in changes.items():
            if value:
                params[name] = value
            else:
                params.pop(name, None)
        return urlencode(params)

    def url(self, **changes: str | None) -> str:
        return f"{reverse('slot-table')}?{self.query(**changes)}"

    def toggled(self, node_id: int) -> str:
        """The `expand` value with this node's row expanded or, when it is, folded again."""
        return ",".join(map(str, sorted(self.expanded ^ {node_id})))


def zoom_in_out(zoom: str) -> dict[str, str]:
    """The zoom a key moves to from this one: "+" the next closer preset, "-" the next wider."""
    names = list(ZOOMS)
    i = names.index(zoom)
    keys = {}
    if i > 0:
        keys[names[i - 1]] = "+"
    if i < len(names) - 1:
        keys[names[i + 1]] = "-"
    return keys


def links(state: State) -> dict:
    """The toolbar's links, each keeping the rest of the state: a zoom keeps the window's centre (or keeps following
    now), a pan moves by half a window, "now" follows now again; all of them start the queue forecast at its first
    page, whose rows depend on the window."""
    window = state.window
    span = window.end - window.start
    centre = window.start + span / 2
    keys = zoom_in_out(window.zoom)
    zooms = []
    for name, width in ZOOMS.items():
        start = None if window.following_now else (centre - width / 2).isoformat()
        zooms.append(
            {
                "zoom": name,
                "url": state.url(zoom=name, **{"from": start}, fpage=None),
                "key": keys.get(name, ""),
                "selected": name == window.zoom,
            }
        )
    return {
        "zooms": zooms,
        "earlier_url": state.url(**{"from": (window.start - span / 2).isoformat()}, fpage=None),
        "later_url": state.url(**{"from": (window.start + span / 2).isoformat()}, fpage=None),
        "now_url": state.url(**{"from": None}, fpage=None),
        "clear_url": state.url(q=None, cap=None, status=None, lease=None),
    }


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
    hidden: int = 0  # reservations not drawn (behind "+N more")
    drawn: SafeString = field(
        default_factory=lambda: mark_safe("")
    )  # the whole row group, its marks included
    version: str = ""  # the fingerprint of `drawn`


@dataclass
class Page:
    index: int
    rows: list[Row]
    height: int
    first: int  # 1-based number of its first row, for "nodes 51–100"
    backdrop: SafeString = field(default_factory=lambda: mark_safe(""))
    markup: SafeString = field(default_factory=lambda: mark_safe(""))  # the row groups, in order
    # The fingerprint of its stripes, which hold every row's y and height: it moves when a row's height does.
    version: str = ""


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


@dataclass
class Laid:
    """One row laid out: its height, the lanes drawn, its marks, the reservations not drawn (behind "+N more"), and
    how many the folded row hides (0: nothing to expand or fold, so no control)."""

    height: int
    lanes: int
    marks: str
    hidden: list[Alloc]
    folded: int


def layout_row(
    node: Node,
    allocs: list[Alloc],
    top: int,
    window: Window,
    filters: Filters,
    link: str,
    expanded: bool = False,
) -> Laid:
    """One node's row from its allocations (in time order). Bars under LOD_MIN_W fold into a utilisation strip on a
    band of their own below the lanes; the others take lanes so that no two overlap, the live ones first, the
    finished ones only where a live lane has room (chart.stack_lanes), at most MAX_LANES of them unless the row is
    expanded; an unavailable node's reason takes a band above them, so no bar ever covers it."""
    t0, span = window.start.timestamp(), window.span_s

    def x(t: datetime) -> float:  # Window.x, inlined: two calls a bar
        return LABEL_W + PLOT_W * max(0.0, min(1.0, (t.timestamp() - t0) / span))

    spans = [(x(a.start), x(a.end)) for a in allocs]
    wide, strips = chart.fold_thin(spans, LOD_MIN_W)
    drawn = [(spans[i][0], spans[i][0] + max(1.0, spans[i][1] - spans[i][0])) for i in wide]
    stack, folded = _stack(allocs, wide, drawn, expanded)
    count = stack.count
    reason_h = REASON_H if reason_of(node) else 0
    lanes_top = top + reason_h
    strip_top = lanes_top + count * LANE_H
    height = reason_h + max(LANE_H, count * LANE_H + (STRIP_H if strips else 0))
    if folded:
        height = max(height, MORE_H)
    marks: list[str] = []
    hidden: list[Alloc] = []
    for i, lane, (x0, x1) in zip(wide, stack.lanes, drawn, strict=True):
        a = allocs[i]
        if lane is None:
            hidden.append(a)
            continue
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
    return Laid(height, count, "".join(marks), hidden, folded)


def _stack(
    allocs: list[Alloc], wide: list[int], drawn: list[tuple[float, float]], expanded: bool
) -> tuple[chart.Stack, int]:
    """The row's lanes, and how many reservations its folded form hides (which an expanded row draws)."""
    if chart.disjoint(drawn):  # most rows: one lane, nothing to fold, no status to read
        return chart.Stack([0] * len(drawn), 1 if drawn else 0, 0), 0
    finished = [allocs[i].status in FINISHED for i in wide]
    stack = chart.stack_lanes(drawn, finished, MAX_LANES)
    if expanded and stack.hidden:
        return chart.stack_lanes(drawn, finished, None), stack.hidden
    return stack, stack.hidden


def more_link(state: State, node: Node, index: int, laid: Laid, expanded: bool, y: int) -> str:
    """A row's "+N more" (folded) or "show fewer" (expanded): a link to the same table with the row's `expand`
    toggled, which htmx follows in place (the table is morphed, the URL replaced, focus kept on the control)."""
    url = state.url(expand=state.toggled(node.pk))
    # Without JavaScript the link loads the page: as many row pages as reach this row, scrolled to it.
    pages = index // ROWS_PER_PAGE + 1
    href = f"{url}&pages={pages}#slot-row-{node.pk}" if pages > 1 else f"{url}#slot-row-{node.pk}"
    return more_control(
        node.pk, node.name, laid.hidden, laid.folded, laid.lanes, expanded, href, url, y, MAX_LANES
    )


class DrawnRows:
    """Rows already drawn, by everything their markup is drawn from: the node's fields as read, its committed-now
    figures, its allocations in the window, its place (index, y), whether it is expanded, the window and the table's
    state (which every "+N more" link carries) and the language. A live table's patch lays out every loaded row to
    compare versions (leases/slot_patch.py); most have not changed since the last request, and their layout and
    markup were about half of its time (bench/bench_slot_patch.py). Same inputs, same markup:
    tests/console/test_slot_memo.py draws the table with the memo warm and cold after every kind of change and finds
    them byte-identical. Per process, bounded by the bytes it holds (oldest out first), not by rows: a week's window
    on a busy node draws a hundred bars to a row; a lock, as Daphne's threads may share it."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.held = 0
        self.rows: dict[tuple, tuple[Row, int]] = {}
        self.lock = threading.Lock()

    def get(self, key: tuple) -> Row | None:
        found = self.rows.get(key)
        return found[0] if found else None

    def put(self, key: tuple, row: Row, allocs: int) -> None:
        # The markup, and the key's allocations (a tuple of eleven values each, about as large as a bar's markup).
        weight = len(row.drawn) + ALLOC_BYTES * allocs
        if weight > self.budget:
            return
        with self.lock:
            old = self.rows.pop(key, None)
            if old:
                self.held -= old[1]
            self.rows[key] = (row, weight)
            self.held += weight
            while self.held > self.budget and self.rows:
                _, gone = self.rows.pop(next(iter(self.rows)))
                self.held -= gone

    def clear(self) -> None:
        with self.lock:
            self.rows.clear()
            self.held = 0


ALLOC_BYTES = 600
# 32 MiB a process: a 1,000-node table with every page loaded at ten bars a row holds about 12 MiB.
DRAWN = DrawnRows(32 * 2**20)

NODE_FIELDS = ("id", "name", "status", "drain_reason", "cpu_cores", "mem_total_mib", "disk_total_gib")
ROW_NODE_FIELDS = (*NODE_FIELDS, "idle_baseline_mib")  # what a row reads of its node


def build_pages(ids: list[int], first_page: int, pages: int, state: State) -> list[Page]:
    """Pages first_page .. first_page + pages - 1 of the rows of `ids`, laid out: three queries for any number."""
    window = state.window
    lo = first_page * ROWS_PER_PAGE
    wanted = ids[lo : lo + pages * ROWS_PER_PAGE]
    if not wanted:
        return []
    by_id = {n.pk: n for n in Node.objects.only(*ROW_NODE_FIELDS).filter(pk__in=wanted)}
    committed = committed_now(window.now, wanted)
    allocs: dict[int, list[Alloc]] = {}
    for a in window_allocations(window.start, window.end, wanted):
        allocs.setdefault(a.node_id, []).append(a)
    link = reverse("lease-detail", args=[0])[:-2]  # "/leases/": the id and slash are appended per bar
    node_link = reverse("node-detail", args=[0])[:-2]  # "/nodes/"
    # Everything a row is drawn from that is the same for every row (the window's `now` is not: no row reads it).
    table = (state.query(), window.start, window.end, get_language(), link, node_link)
    out: list[Page] = []
    for p in range(pages):
        chunk = wanted[p * ROWS_PER_PAGE : (p + 1) * ROWS_PER_PAGE]
        if not chunk:
            break
        y = 0
        rows: list[Row] = []
        for k, node_id in enumerate(chunk):
            node = by_id[node_id]
            index = lo + p * ROWS_PER_PAGE + k
            mine = allocs.get(node_id, [])
            fields = tuple(getattr(node, name) for name in ROW_NODE_FIELDS)
            key = (table, index, y, node_id in state.expanded, fields, committed.get(node_id), tuple(mine))
            row = DRAWN.get(key)
            if row is None:
                row = draw_row(node, mine, index, y, state, committed, link, node_link)
                DRAWN.put(key, row, len(mine))
            rows.append(row)
            y += row.height
        page_index = first_page + p
        # Every database text in both went through escape() (leases/slot_marks.py).
        backdrop = mark_safe(row_backdrop(rows, WIDTH, LABEL_W))  # noqa: S308
        markup = mark_safe("".join(r.drawn for r in rows))  # noqa: S308
        page = Page(page_index, rows, y, page_index * ROWS_PER_PAGE + 1, backdrop, markup)
        page.version = fingerprint(f"{y}:{backdrop}")
        out.append(page)
    return out


def draw_row(
    node: Node,
    allocs: list[Alloc],
    index: int,
    y: int,
    state: State,
    committed: dict[int, tuple[float, int, int]],
    link: str,
    node_link: str,
) -> Row:
    """One node's row, laid out and drawn, with its version."""
    title, shown, label = row_label(node, committed)
    expanded = node.pk in state.expanded
    laid = layout_row(node, allocs, y, state.window, state.filters, link, expanded)
    # Every database text in `more` went through escape() (leases/slot_marks.py).
    more = more_link(state, node, index, laid, expanded, y) if laid.folded else ""
    row = Row(node, index, y, laid.height, title, shown, label, reason_of(node), laid.lanes, len(laid.hidden))
    # Every database text in the marks and the row went through escape() (leases/slot_marks.py).
    drawn, row.version = row_group(row, WIDTH, LABEL_W, node_link, more, laid.marks)
    row.drawn = mark_safe(drawn)  # noqa: S308
    return row


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


def chart_context(state: State, pages: int = 1, first_page: int = 0) -> dict:
    window, filters = state.window, state.filters
    ids = matching_nodes(filters, window)
    total_pages = max(1, -(-len(ids) // ROWS_PER_PAGE))
    pages = max(1, min(pages, MAX_PAGES, total_pages - first_page))
    built = build_pages(ids, first_page, pages, state)
    next_page = first_page + len(built)
    shown = sum(len(p.rows) for p in built)
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
        "rows_url": f"{reverse('slot-rows')}?{state.query()}",
        "hidden_rows": sum(1 for p in built for r in p.rows if r.hidden),
        "width": WIDTH,
        "label_w": LABEL_W,
        "plot_right": WIDTH - PAD_R,
        "axis_h": AXIS_H,
        "start": window.start,
        "end": window.end,
        "window_date": window.start.strftime("%a %d %b %Y"),
        "filters": filters,
    }
