"""The fleet board's reads: one page of nodes, filtered, sorted and paged in the database with the node list's own
FilterSet (leases/instances/filters.py, the API's too); the fleet's totals as aggregates; and the patch a live
board asks for.

Before (issue 46) the board was every node on one page, rendered whole on every live update: 1.1 MB at 1,000 nodes,
and each open console re-downloaded it about every 3 s. Now a page is `per` rows (100 unless the URL says
otherwise), its totals are three aggregate queries whatever the fleet's size, and a live update is a patch: the
page says which rows it shows and their versions (fleet.views.NodeRow.version), and is sent only the rows whose
version moved, the page's order when it moved, and the totals and pager when they moved. So the bytes of an update
grow with the rows that changed on screen, not with the fleet (bench/bench_board.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from urllib.parse import urlencode

from django.db import connections
from django.db.models import Case, F, Max, Q, Sum, Value, When

from fleet.filters import DEFAULT_SORT, allocatable_disk, allocatable_mem
from fleet.models import Node, NodeStatus
from fleet.views import CapacityTotals, NodeRow, fleet_sums, node_rows
from leases import reads as lease_reads
from leases.instances.filters import NodeFilterSet
from leases.models import Allocation
from slotkeeper.fields import is_id, whole_number
from slotkeeper.pagination import PageNumbers, page_number

PER_PAGE = 100
PER_PAGE_CHOICES = (25, 50, 100, 200)
MAX_PER_PAGE = max(PER_PAGE_CHOICES)
# What each parameter is called where a message names it.
WORDS = {"q": "Search", "status": "Status", "sort": "Sort", "page": "Page", "per": "Nodes a page"}
# The key of the row that says the page is empty (it is keyed like a node's row, so a patch can add or drop it).
EMPTY = "none"


@dataclass(frozen=True)
class BoardState:
    """Everything a board shows that the URL says: its filters, sort, page and page size."""

    q: str = ""
    status: tuple[str, ...] = ()
    sort: str = ""
    page: int = 1
    per: int = PER_PAGE

    def params(self, **changes) -> dict[str, str]:
        """The URL's parameters, defaults left out (so the plain board is `/`)."""
        state = replace(self, **changes)
        out = {}
        if state.q:
            out["q"] = state.q
        if state.status:
            out["status"] = ",".join(state.status)
        if state.sort and state.sort != DEFAULT_SORT:
            out["sort"] = state.sort
        if state.page != 1:
            out["page"] = str(state.page)
        if state.per != PER_PAGE:
            out["per"] = str(state.per)
        return out

    def query(self, **changes) -> str:
        return urlencode(self.params(**changes))

    @property
    def one_status(self) -> str:
        return self.status[0] if len(self.status) == 1 else ""


@dataclass
class Checked:
    """A board's state read from its URL: the good values, and a message per bad one (each left at its default)."""

    state: BoardState
    filterset: NodeFilterSet
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def without_problems(self) -> str:
        """The URL's query with the bad parameters left out."""
        return self.state.query()


def read_state(params: Mapping[str, str], now: datetime) -> Checked:
    filters = {name: params[name] for name in ("q", "status", "sort") if name in params}
    filterset = NodeFilterSet(filters, Node.objects.all(), now=now)
    problems = {WORDS[name]: message for name, message in filterset.messages().items()}
    good = filterset.form.cleaned_data
    page, per = 1, PER_PAGE
    if "page" in params:
        page, why = page_number(params["page"])
        if why:
            problems[WORDS["page"]] = why
    if "per" in params:
        number = whole_number(params["per"].strip())
        if number is None or not 1 <= number <= MAX_PER_PAGE:
            problems[WORDS["per"]] = (
                f'"{params["per"][:40]}" is not a page size; a whole number of nodes from 1 to {MAX_PER_PAGE}.'
            )
        else:
            per = number
    state = BoardState(
        q=good.get("q", ""),
        status=tuple(good.get("status", ())),
        sort=good.get("sort", ""),
        page=page,
        per=per,
    )
    return Checked(state, filterset, problems)


@dataclass
class Page(PageNumbers):
    rows: list[NodeRow]
    matching: int  # nodes that match the filters
    number: int
    per: int

    @property
    def keys(self) -> list[str]:
        return [str(r.node.pk) for r in self.rows] or [EMPTY]

    def version(self, state: BoardState) -> str:
        """The pager's version: what it says depends on nothing else."""
        return fingerprint((self.matching, self.number, self.per, state))

    def empty_version(self, state: BoardState) -> str:
        """The version of the row that says why the page is empty (no node matches, or the page is past the end)."""
        return fingerprint((EMPTY, self.matching, self.number, self.per, bool(state.q or state.status)))


def page_of(checked: Checked, now: datetime) -> Page:
    """One page of rows: the matching nodes counted, then `per` of them read in the asked order (three queries:
    the count, the page's nodes, what the slot table holds on them now)."""
    state, filterset = checked.state, checked.filterset
    matching = filterset.qs
    count = matching.count()
    page = Page([], count, state.page, state.per)
    if count and not page.past_end:
        ordered = filterset.sorted(matching.select_related("drained_by"), state.sort)
        nodes = list(ordered[page.first - 1 : page.last])
        committed = lease_reads.committed_now(now, [n.pk for n in nodes])
        page.rows = node_rows(nodes, now, committed)
    return page


def totals(now: datetime) -> tuple[dict[str, int], CapacityTotals]:
    """Nodes per status and the capacity sums, for the whole fleet whatever the page shows: two aggregate queries,
    fleet's sums, then one pass over what the slot table holds now, grouped by node, for the online nodes'
    committed sums and the number of nodes over allocatable (two passes were the bulk of a live update's cost at
    10,000 nodes: bench/bench_board.py)."""
    counts, capacity = fleet_sums()
    room = Q(mem__gt=Max(allocatable_mem("node__")))
    room |= Q(cpu__gt=Max(F("node__cpu_cores") * 100))
    room |= Q(disk__gt=Max(allocatable_disk("node__")))
    per_node = (
        Allocation.objects.filter(live=True, start__lte=now, end__gt=now)
        .order_by()
        .values("node")
        .annotate(mem=Sum("mem_mib"), cpu=Sum("cpu"), disk=Sum("disk_gib"))
        .annotate(
            is_online=Max(Case(When(node__status=NodeStatus.ONLINE, then=Value(1)), default=Value(0))),
            is_over=Case(When(room, then=Value(1)), default=Value(0)),
        )
        .values("cpu", "mem", "is_online", "is_over")
    )
    # Django aggregates no aggregate: the per-node sums are summed over in SQL of its own, around the compiled query
    # (its values travel as parameters).
    inner, params = per_node.query.sql_with_params()
    sums = (
        "SUM(CASE WHEN is_online = 1 THEN cpu ELSE 0 END), SUM(CASE WHEN is_online = 1 THEN mem ELSE 0 END),"
        " SUM(is_over)"
    )
    sql = f"SELECT {sums} FROM ({inner}) per_node"  # noqa: S608
    with connections[per_node.db].cursor() as cursor:
        cursor.execute(sql, params)
        cpu, mem, over = cursor.fetchone()
    capacity.committed_cores = (cpu or 0) / 100
    capacity.committed_mib = mem or 0
    capacity.over = over or 0
    return counts, capacity


def totals_version(counts: dict[str, int], capacity: CapacityTotals, state: BoardState) -> str:
    # The chips' links carry the search, so the state is part of what they show.
    return fingerprint((counts, asdict(capacity), state))


def fingerprint(value: object) -> str:
    return f"{zlib.crc32(repr(value).encode()):08x}"


def shown(raw: str) -> dict[str, str]:
    """What a live page says it shows ("3.1a2b3c4d,8.00ff00ff,..."): row key -> version, in the page's order. At
    most a page's worth; anything malformed is left out (the row is then sent again, never a 500)."""
    out: dict[str, str] = {}
    for item in raw.split(",")[:MAX_PER_PAGE]:
        key, _, version = item.partition(".")
        if (is_id(key) or key == EMPTY) and len(version) <= 8:
            out[key] = version
    return out


@dataclass
class Patch:
    """What a live page needs to look like the board now: the rows that are new or moved, the page's order when it
    is not the one the page has, the totals and the pager when they changed."""

    rows: list[NodeRow]
    order: list[str] | None
    empty: bool  # the row that says why the page is empty is to be shown anew


def patch(page: Page, state: BoardState, have: dict[str, str]) -> Patch:
    rows = [r for r in page.rows if have.get(str(r.node.pk)) != r.version]
    order = page.keys if page.keys != list(have) else None
    empty = not page.rows and have.get(EMPTY) != page.empty_version(state)
    return Patch(rows, order, empty)
