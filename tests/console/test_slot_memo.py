"""Rows the slot table has drawn are remembered by everything they are drawn from (leases/slotchart.py, DrawnRows),
so a live table's patch and refresh lay out only the rows that changed. Nothing a row shows may come from the memo
once its inputs moved: after every kind of change a row can see, the table drawn with the memo warm (holding the
rows drawn before the change) is the table drawn with it empty, to the byte, and differs from the table before."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone
from django.utils.safestring import mark_safe

from fleet.models import Node
from leases import slotchart
from leases.models import Allocation, Lease, Reservation
from tests.console.conftest import register
from tests.console.test_slot_chart import WINDOW, place, slots

ROWS = re.compile(r'<svg class="slots rows".*?</svg>', re.S)


def rows(body: str) -> str:
    """The table's row pages: every row's markup, its place and its page's frame (not the sections around them)."""
    found = ROWS.findall(body)
    assert found, body[:500]
    return "".join(found)


@pytest.fixture
def table(vera):
    def draw(**params) -> str:
        return rows(slots(vera, htmx=True, **params))

    slotchart.DRAWN.clear()
    yield draw
    slotchart.DRAWN.clear()


@pytest.fixture
def drawn(monkeypatch):
    """How many rows were laid out and drawn (not taken from the memo)."""
    count = {"rows": 0}
    draw_row = slotchart.draw_row

    def counted(*args, **kwargs):
        count["rows"] += 1
        return draw_row(*args, **kwargs)

    monkeypatch.setattr(slotchart, "draw_row", counted)
    return count


def warm_is_cold(table, **params) -> str:
    warm = table(**params)
    slotchart.DRAWN.clear()
    cold = table(**params)
    assert warm == cold, "a row came from the memo after what it is drawn from had changed"
    return cold


def by_name(fleet) -> dict[str, Node]:
    return {n.name: n for n in fleet}


def test_an_unchanged_table_draws_no_row_again_and_one_changed_node_draws_one(table, drawn, fleet):
    nodes = by_name(fleet)
    place(nodes["tank"], WINDOW + timedelta(hours=1), 60, "one")
    first = table()
    assert drawn["rows"] == 3
    assert table() == first
    assert drawn["rows"] == 3, "nothing changed: every row from the memo"
    place(nodes["architect"], WINDOW + timedelta(hours=2), 60, "two")
    assert table() != first
    assert drawn["rows"] == 4, "only architect's row was drawn again"


# Each change moves something one row shows: its bars, their words or classes, its lanes, its label's figures, its
# status and drain reason, its place, or a link it carries.
def new_bar(nodes):
    place(nodes["tank"], WINDOW + timedelta(hours=1), 60, "new")


def bar_memory(nodes):
    Allocation.objects.filter(node=nodes["tank"]).update(mem_mib=F("mem_mib") + 1)


def reservation_done(nodes):
    Reservation.objects.filter(allocations__node=nodes["tank"]).update(status="done")


def lease_renamed(nodes):
    Lease.objects.filter(reservations__allocations__node=nodes["tank"]).update(name="renamed")


def bar_moved(nodes):
    Allocation.objects.filter(node=nodes["tank"]).update(start=F("start") + timedelta(minutes=7))


def node_drained(nodes):
    Node.objects.filter(pk=nodes["tank"].pk).update(status="draining", drain_reason="disk swap")


def node_capacity(nodes):
    Node.objects.filter(pk=nodes["tank"].pk).update(mem_total_mib=4096)


def node_baseline(nodes):
    Node.objects.filter(pk=nodes["tank"].pk).update(idle_baseline_mib=3000)


def committed_now(nodes):
    # Running now, long before the window: its bar is not drawn, the row's committed-now figures move.
    now = timezone.now()
    place(nodes["tank"], now - timedelta(minutes=5), 30, "running-now")


def node_above(nodes):
    register("aardvark")  # first by name: every row moves down one place


def node_renamed(nodes):
    Node.objects.filter(pk=nodes["tank"].pk).update(name="tank-renamed")


@pytest.mark.parametrize(
    "change",
    [
        new_bar,
        bar_memory,
        reservation_done,
        lease_renamed,
        bar_moved,
        node_drained,
        node_capacity,
        node_baseline,
        committed_now,
        node_above,
        node_renamed,
    ],
)
def test_after_each_change_a_row_can_see_the_warm_table_is_the_cold_one(table, fleet, change):
    nodes = by_name(fleet)
    for minutes in (0, 30, 45, 50):  # four overlapping bars: three lanes and a "+1 more"
        place(nodes["tank"], WINDOW + timedelta(hours=3, minutes=minutes), 60, f"busy-{minutes}")
    before = table()
    change(nodes)
    after = warm_is_cold(table)
    assert after != before, "the change is one the table shows"


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({}, {"from": (WINDOW + timedelta(minutes=30)).isoformat()}),  # another window
        ({}, {"zoom": "24h"}),
        ({"q": "tank"}, {"q": "tank", "lease": "busy-30"}),  # the same row, its lease's bars highlighted
        ({}, {"expand": "{tank}"}),  # the folded row expanded
        (
            {"expand": "{tank}"},
            {"expand": "{tank}", "fpage": "2"},
        ),  # "show fewer" links keep the forecast's page
        ({}, {"forecast": "closed"}),  # "+1 more" links keep the fold
    ],
    ids=["window", "zoom", "lease-filter", "expand", "forecast-page", "forecast-fold"],
)
def test_another_state_of_the_table_is_drawn_for_that_state(table, fleet, first, then):
    nodes = by_name(fleet)
    for minutes in (0, 30, 45, 50):
        place(nodes["tank"], WINDOW + timedelta(hours=3, minutes=minutes), 60, f"busy-{minutes}")
    tank = str(nodes["tank"].pk)
    first = {k: v.replace("{tank}", tank) for k, v in first.items()}
    then = {k: v.replace("{tank}", tank) for k, v in then.items()}
    before = table(**first)
    after = warm_is_cold(table, **then)
    assert after != before


def test_the_memo_is_bounded_by_the_bytes_it_holds_oldest_out_first():
    def row(size: int) -> slotchart.Row:
        return slotchart.Row(None, 0, 0, 18, "", None, "", "", 1, drawn=mark_safe("x" * size))  # type: ignore[arg-type]

    memo = slotchart.DrawnRows(budget_bytes=10_000)
    memo.put(("a",), row(4_000), allocs=0)
    memo.put(("b",), row(4_000), allocs=0)
    assert memo.held == 8_000
    memo.put(("c",), row(1_000), allocs=2)  # 1,000 B of markup and two allocations in its key: 2,200 B
    assert memo.get(("a",)) is None, "the oldest went to make room"
    assert memo.get(("b",)) and memo.get(("c",)) and memo.held == 4_000 + 1_000 + 2 * slotchart.ALLOC_BYTES
    memo.put(("b",), row(500), allocs=0)  # drawn again: its old weight is given back
    assert memo.held == 500 + 2_200
    memo.put(("huge",), row(20_000), allocs=0)  # larger than the whole budget: not kept, nothing pushed out
    assert (memo.get(("huge",)), memo.held, len(memo.rows)) == (None, 2_700, 2)
