"""The slot table reads at any size (issue 13, item 1), through Django's test client: overlapping reservations on a
node take distinct lanes whose bars do not overlap and never cover the drain reason; axis ticks fall on round times
with the zone shown and the last label inside the chart; bars too thin to see fold into a utilisation strip that
still names them; the filters (node, capability, status, lease) are GET parameters; rows come in pages, each a
fragment; and the query count does not grow with nodes or reservations."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet.models import Node
from leases.models import Allocation, Lease, Reservation
from leases.slots import chart
from tests.console.conftest import heartbeat, register

WINDOW = datetime(2026, 12, 9, 8, 0, tzinfo=UTC)  # a fixed window (?from=), so times and ticks are exact


def place(
    node: Node, start: datetime, minutes: float, name: str, kind: str = "vm", type_="best_effort"
) -> int:
    """A lease with one reservation and its allocation on `node`, written directly: returns the allocation id."""
    end = start + timedelta(minutes=minutes)
    lease = Lease.objects.create(
        name=name,
        type=type_,
        state="scheduled",
        submitted_at=start - timedelta(hours=1),
        requested_start=start,
        duration_s=minutes * 60,
        vnodes=[{"cpu_cores": 1, "mem_mib": 512, "disk_gib": 0}],
    )
    rid = (Reservation.objects.order_by("-rid").values_list("rid", flat=True).first() or 0) + 1
    res = Reservation.objects.create(
        lease=lease, rid=rid, kind=kind, start=start, end=end, status="scheduled", nodes={"1": node.pk}
    )
    return Allocation.objects.create(
        reservation=res, node=node, start=start, end=end, cpu=100, mem_mib=512
    ).pk


def slots(client, htmx=False, url=None, expect=200, **params):
    """The table's page (or its htmx fragment); `expect` 400 for an address with a value it cannot read, shown
    without it."""
    params.setdefault("from", WINDOW.isoformat())
    response = client.get(
        url or reverse("slot-table"), params, headers={"HX-Request": "true"} if htmx else {}
    )
    assert response.status_code == expect
    return response.content.decode()


def bar(body: str, alloc_id: int) -> dict:
    """The bar of an allocation: its lane and its rect's x, y, width and height."""
    m = re.search(rf'id="alloc-{alloc_id}".*?data-lane="(\d+)".*?<rect x="([\d.]+)" y="(\d+)" width="([\d.]+)" '
                  rf'height="(\d+)"', body)  # fmt: skip
    assert m, f"no bar for allocation {alloc_id}"
    lane, x, y, w, h = m.groups()
    return {"lane": int(lane), "x": float(x), "y": int(y), "w": float(w), "h": int(h)}


def row_of(body: str, name: str) -> str:
    start = body.index(f'data-node="{name}"')
    return body[
        start : body.index('<g class="row', start + 1) if '<g class="row' in body[start + 1 :] else None
    ]


# Lanes ----------------------------------------------------------------------------------------------------------


def test_overlapping_reservations_on_a_node_take_distinct_lanes_whose_bars_do_not_overlap(vera, fleet):
    tank = fleet[0]
    ids = [
        place(tank, WINDOW + timedelta(minutes=30), 120, "render-a"),
        place(tank, WINDOW + timedelta(minutes=60), 60, "render-b"),
        place(tank, WINDOW + timedelta(minutes=90), 120, "render-c"),
        place(tank, WINDOW + timedelta(minutes=160), 60, "render-d"),  # after render-a ended: its lane again
    ]
    body = slots(vera, zoom="6h")
    bars = [bar(body, i) for i in ids]
    assert [b["lane"] for b in bars] == [0, 1, 2, 0]
    for i, a in enumerate(bars):
        for b in bars[i + 1 :]:
            overlap_in_x = a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            if overlap_in_x:
                assert a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"], (a, b)
    assert 'data-lanes="3"' in row_of(body, "tank")
    # The row grew to hold its lanes, and every bar is inside it.
    top, height = map(
        int,
        re.search(
            r'data-node="tank".*?<rect class="hover" x="0" y="(\d+)" width="\d+" height="(\d+)"', body, re.S
        ).groups(),
    )
    assert height >= 3 * 18
    assert all(top <= b["y"] and b["y"] + b["h"] <= top + height for b in bars)


def test_a_row_without_overlap_keeps_one_lane(vera, fleet):
    tank = fleet[0]
    ids = [place(tank, WINDOW + timedelta(minutes=30 * k), 30, f"job-{k}") for k in range(4)]
    body = slots(vera, zoom="6h")
    assert {bar(body, i)["lane"] for i in ids} == {0}
    assert 'data-lanes="1"' in row_of(body, "tank")


def test_a_drained_nodes_reason_has_its_own_band_above_its_bars(vera, otto, fleet):
    tank = fleet[0]
    ids = [place(tank, WINDOW + timedelta(minutes=20), 200, "under-reason")]
    otto.post(reverse("node-drain", args=[tank.pk]), {"reason": "fan noise", "confirm": "1"})
    body = slots(vera, zoom="6h")
    row = row_of(body, "tank")
    reason_y = int(
        re.search(r'<text class="reason" x="[\d.]+" y="(\d+)"[^>]*>draining: fan noise<', row).group(1)
    )
    assert bar(body, ids[0])["y"] > reason_y, "the bar sits below the reason's baseline, never over it"
    # The row label is in its own column, left of every bar.
    assert bar(body, ids[0])["x"] >= 190


# Axis -----------------------------------------------------------------------------------------------------------


def tick_labels(body: str) -> list[tuple[float, str, str]]:
    axis = body[body.index('class="slots axis"') : body.index("</svg>", body.index('class="slots axis"'))]
    return [
        (float(x), anchor, label)
        for x, anchor, label in re.findall(
            r'<text class="tick[^"]*" x="([\d.]+)" y="\d+" text-anchor="(\w+)">([^<]+)<', axis
        )
    ]


@pytest.mark.parametrize(
    ("zoom", "start", "expected"),
    [
        ("1h", "08:07", ["08:10", "08:20", "08:30", "08:40", "08:50", "09:00"]),
        ("6h", "08:07", ["09:00", "10:00", "11:00", "12:00", "13:00", "14:00"]),
        ("24h", "08:07", ["09:00", "12:00", "15:00", "18:00", "21:00", "Thu 10 Dec", "03:00", "06:00"]),
        (
            "7d",
            "08:07",
            [
                "Thu 10 Dec",
                "Fri 11 Dec",
                "Sat 12 Dec",
                "Sun 13 Dec",
                "Mon 14 Dec",
                "Tue 15 Dec",
                "Wed 16 Dec",
            ],
        ),
    ],
)
def test_axis_ticks_fall_on_round_times_and_say_the_zone(vera, fleet, zoom, start, expected):
    hh, mm = map(int, start.split(":"))
    body = slots(vera, zoom=zoom, **{"from": WINDOW.replace(hour=hh, minute=mm).isoformat()})
    assert [label for _, _, label in tick_labels(body)] == expected
    assert "times in UTC" in body


def test_the_last_tick_label_is_anchored_inside_the_chart(vera, fleet):
    # A window ending exactly on a tick: the last label would be cut in half if it were centred on the edge.
    body = slots(vera, zoom="1h", **{"from": WINDOW.isoformat()})
    ticks = tick_labels(body)
    assert ticks[0][2] == "08:00" and ticks[0][1] == "start"
    assert ticks[-1][2] == "09:00" and ticks[-1][1] == "end"
    assert all(anchor == "middle" for _, anchor, _ in ticks[1:-1])
    assert ticks[-1][0] <= 1200


def test_tick_steps_by_zoom():
    plot = 998
    assert chart.tick_step(3600, plot, 90) == 600
    assert chart.tick_step(6 * 3600, plot, 90) == 3600
    assert chart.tick_step(7 * 86400, plot, 90) == 86400


# Level of detail ------------------------------------------------------------------------------------------------


def test_bars_under_two_pixels_fold_into_a_strip_that_names_what_is_inside(vera, fleet):
    tank = fleet[0]
    # 7 days over ~1,000 px: about 10 minutes a pixel. 30 five-minute jobs an hour apart and one long one.
    tiny = [place(tank, WINDOW + timedelta(hours=k), 5, f"tiny-{k}", kind="suspend" if k % 3 else "vm")
            for k in range(30)]  # fmt: skip
    long_id = place(tank, WINDOW + timedelta(hours=40), 600, "long-one")
    body = slots(vera, zoom="7d")
    row = row_of(body, "tank")
    for i in tiny:
        assert f'id="alloc-{i}"' not in row, "a sub-pixel bar is not drawn on its own"
    assert bar(body, long_id)["w"] >= 2
    counts = [int(c) for c in re.findall(r'data-strip data-count="(\d+)"', row)]
    assert sum(counts) == 30 and len(counts) < 30
    titles = [html.unescape(t) for t in re.findall(r'<g class="strip"[^>]*><title>([^<]+)</title>', row)]
    lease_ids = {int(x) for t in re.findall(r'data-leases="([\d ]+)"', row) for x in t.split()}
    assert lease_ids == set(
        Allocation.objects.filter(pk__in=tiny).values_list("reservation__lease_id", flat=True)
    )
    assert any("short reservations on tank" in t and "suspend" in t and "vm" in t for t in titles), titles
    first = min(lease_ids)
    assert any(f"leases {first}," in t for t in titles), titles
    # A strip is a cell like a bar: reachable with the arrow keys, its accessible name says what is inside.
    assert re.search(
        r'class="bar-link strip-link"[^>]*data-roving data-bar tabindex="-1" aria-label="\d+ short', row
    )


def test_the_same_reservations_are_bars_when_zoomed_in(vera, fleet):
    tank = fleet[0]
    ids = [place(tank, WINDOW + timedelta(minutes=10 * k), 5, f"tiny-{k}") for k in range(5)]
    body = slots(vera, zoom="1h")
    assert "data-strip" not in body
    assert all(bar(body, i)["w"] > 50 for i in ids)


def test_fold_thin_merges_neighbours_and_shades_by_coverage():
    wide, strips = chart.fold_thin([(0, 0.5), (1, 1.5), (10, 30), (40, 40.2)])
    assert wide == [2]
    assert [s.members for s in strips] == [[0, 1], [3]]
    assert strips[0].x1 - strips[0].x0 == 2 and strips[0].fill == pytest.approx(0.5)
    assert strips[1].x1 - strips[1].x0 == 2  # widened to be seen


def test_assign_lanes_is_greedy_and_reuses_freed_lanes():
    assert chart.assign_lanes([(0, 10), (5, 15), (10, 20), (12, 14)]) == ([0, 1, 0, 2], 3)


# Filters --------------------------------------------------------------------------------------------------------


def nodes_in(body: str) -> list[str]:
    return re.findall(r'<g class="row [^"]*" role="row" aria-rowindex="\d+" data-node="([^"]+)"', body)


def test_filter_by_node_name_capability_status_and_lease(vera, otto, fleet):
    _tank, architect, morpheus = fleet
    lease_alloc = place(architect, WINDOW + timedelta(minutes=30), 60, "needle-render")
    place(morpheus, WINDOW + timedelta(minutes=30), 60, "hay")
    otto.post(reverse("node-drain", args=[morpheus.pk]), {"reason": "fan", "confirm": "1"})
    lease_id = Allocation.objects.get(pk=lease_alloc).reservation.lease_id

    assert nodes_in(slots(vera, q="ARCH")) == ["architect"]
    assert nodes_in(slots(vera, cap="gpu")) == ["tank"]
    assert nodes_in(slots(vera, status="draining")) == ["morpheus"]
    assert nodes_in(slots(vera, expect=400, status="bogus")) == ["architect", "morpheus", "tank"]
    by_id = slots(vera, zoom="6h", lease=str(lease_id))
    assert nodes_in(by_id) == ["architect"]
    assert 'class="bar vm best_effort scheduled match"' in by_id, "the lease's own bars are highlighted"
    assert nodes_in(slots(vera, zoom="6h", lease="needle")) == ["architect"]
    assert nodes_in(slots(vera, q="nothing-like-this")) == []
    assert "No node matches the filter" in slots(vera, q="nothing-like-this")
    # The page's links and the live refresh keep the filter.
    page = slots(vera, zoom="6h", cap="gpu", status="online")
    assert "cap=gpu&amp;status=online" in page
    assert re.search(r'id="slot-table"[^>]*\s+hx-get="/slots/\?[^"]*cap=gpu&amp;status=online', page)


# Row pages ------------------------------------------------------------------------------------------------------


@pytest.fixture
def many_nodes(db):
    now = timezone.now()
    Node.objects.bulk_create(
        Node(name=f"n-{i:03d}", cpu_cores=8, mem_total_mib=16384, disk_total_gib=100, token_digest=f"{i:064d}",
             last_heartbeat_at=now)
        for i in range(120)
    )  # fmt: skip
    return list(Node.objects.order_by("name"))


def test_rows_come_in_pages_each_a_fragment(vera, many_nodes):
    page = slots(vera)
    assert nodes_in(page) == [f"n-{i:03d}" for i in range(50)]
    loader = re.search(
        r'<div class="slot-more" role="row" id="slot-more-1" hx-get="([^"]+)" hx-trigger="intersect once"',
        page,
    )
    assert loader, "the next page loads as it scrolls into view"
    url = html.unescape(loader.group(1))
    assert url.startswith(reverse("slot-rows")) and "page=1" in url and "from=" in url

    fragment = vera.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in fragment and fragment.lstrip().startswith(
        '<svg class="slots rows" id="slot-page-1"'
    )
    assert nodes_in(fragment) == [f"n-{i:03d}" for i in range(50, 100)]
    assert 'aria-rowindex="51"' in fragment
    assert 'id="slot-more-2"' in fragment
    last = slots(vera, url=reverse("slot-rows"), page="2")
    assert nodes_in(last) == [f"n-{i:03d}" for i in range(100, 120)] and "slot-more" not in last
    assert nodes_in(slots(vera, url=reverse("slot-rows"), page="9")) == []


def test_a_live_refresh_re_renders_every_page_loaded(vera, many_nodes):
    body = slots(vera, htmx=True, pages="2")
    assert 'id="slot-page-0"' in body and 'id="slot-page-1"' in body and 'id="slot-more-2"' in body
    assert len(nodes_in(body)) == 100
    assert "Nodes 1–100 of 120 loaded" in body


# Queries --------------------------------------------------------------------------------------------------------


def grow(total: int) -> None:
    for i in range(Node.objects.count(), total):
        node = heartbeat(register(f"extra-{i:02d}"))
        for k in range(3):
            place(node, WINDOW + timedelta(minutes=20 * k + i % 7), 45, f"job-{i}-{k}")


@pytest.mark.parametrize("params", [{}, {"q": "extra", "status": "online", "lease": "job"}])
@pytest.mark.parametrize("htmx", [False, True])
def test_the_slot_table_costs_the_same_queries_at_5_nodes_as_at_50(vera, fleet, htmx, params):
    url = reverse("slot-table")
    query = {"from": WINDOW.isoformat(), "zoom": "6h", "pages": "2", **params}
    headers = {"HX-Request": "true"} if htmx else {}

    def count() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert vera.get(url, query, headers=headers).status_code == 200
        return len(captured)

    grow(5)
    vera.get(url, query, headers=headers)
    at_5 = count()
    grow(50)
    at_50 = count()
    assert at_50 == at_5, f"{at_5} queries at 5 nodes, {at_50} at 50"
    assert len(nodes_in(vera.get(url, query, headers=headers).content.decode())) == 50 - (3 if params else 0)
    with CaptureQueriesContext(connection) as captured:
        vera.get(reverse("slot-rows"), {**query, "page": "0"}, headers=headers)
    assert len(captured) <= at_50
