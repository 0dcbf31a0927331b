"""Slot table rows that stay readable (issue 46, item 3), through Django's test client: finished reservations (done,
cancelled) never take a lane of their own; a row draws at most three lanes and a "+N more" that expands it, in the
URL (`?expand=`) like everything else the table shows; the toolbar's links keep that state (a zoom keeps the window's
middle); the footer says which rows are loaded; the queue forecast folds and pages, in two queries as before.

After 20 minutes of the demo, rows had 10 to 18 lanes in the 1 h and 6 h views and the forecast 39 rows."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from leases import slotchart
from leases.models import Lease, Reservation
from leases.slots import chart
from leases.views import ESTIMATE_PAGE, estimate_context
from tests.console.test_slot_chart import WINDOW, bar, place, row_of, slots


def finish(alloc_id: int, status: str) -> None:
    Reservation.objects.filter(allocations__pk=alloc_id).update(status=status)


# Lanes, without a database ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spans", "finished", "max_lanes", "lanes", "count", "hidden"),
    [
        # No bar: no lane (the row keeps its least height); bars apart: one lane.
        ([], [], 3, [], 0, 0),
        ([(0, 10), (10, 20), (25, 30)], [True, False, True], 3, [0, 0, 0], 1, 0),
        # Three live bars overlapping: three lanes, as before.
        ([(0, 10), (2, 12), (4, 14)], [False] * 3, 3, [0, 1, 2], 3, 0),
        # A done bar under a live one: no lane of its own, so it is not drawn (one lane, one hidden).
        ([(0, 10), (2, 12)], [True, False], 3, [None, 0], 1, 1),
        # A done bar where a live lane has room: drawn there.
        ([(0, 10), (2, 12), (11, 20)], [False, False, True], 3, [0, 1, 0], 2, 0),
        # Only finished bars (a window in the past): one lane, the first that fits, the rest hidden.
        ([(0, 10), (2, 12), (11, 20)], [True, True, True], 3, [0, None, 0], 1, 1),
        # Five live lanes: three drawn, two bars behind "+2 more".
        ([(0, 10), (1, 10), (2, 10), (3, 10), (4, 10)], [False] * 5, 3, [0, 1, 2, None, None], 3, 2),
        # Expanded: every live lane, then the finished bars with no room stack below.
        ([(0, 10), (1, 10), (2, 10), (3, 10), (4, 10)], [False] * 5, None, [0, 1, 2, 3, 4], 5, 0),
        ([(0, 10), (2, 12), (3, 13)], [True, False, True], None, [1, 0, 2], 3, 0),
    ],
)
def test_finished_reservations_never_widen_a_row_and_at_most_three_lanes_are_drawn(
    spans, finished, max_lanes, lanes, count, hidden
):
    got = chart.stack_lanes(spans, finished, max_lanes)
    assert (got.lanes, got.count, got.hidden) == (lanes, count, hidden)


def test_a_finished_bar_fits_between_two_live_ones_of_a_lane():
    # Live: lane 0 holds [0, 5) and [20, 30); lane 1 holds [2, 25). The done [6, 19) fits in lane 0's gap.
    got = chart.stack_lanes([(0, 5), (2, 25), (6, 19), (20, 30)], [False, False, True, False], 3)
    assert got.lanes == [0, 1, 0, 0] and got.hidden == 0


# Rows -----------------------------------------------------------------------------------------------------------


def test_done_and_cancelled_reservations_never_take_a_lane_of_their_own(vera, fleet):
    tank = fleet[0]
    live = place(tank, WINDOW + timedelta(minutes=30), 120, "running")
    done = place(tank, WINDOW + timedelta(minutes=20), 60, "ran-before")
    superseded = place(tank, WINDOW + timedelta(minutes=40), 90, "re-planned")
    finish(done, "done")
    finish(superseded, "cancelled")
    body = slots(vera, zoom="6h")
    row = row_of(body, "tank")
    assert 'data-lanes="1"' in row, "two finished bars under a live one used to make three lanes"
    assert bar(body, live)["lane"] == 0
    assert f'id="alloc-{done}"' not in row and f'id="alloc-{superseded}"' not in row
    assert 'data-hidden="2"' in row and ">+2 more<" in row


def test_a_row_of_bars_too_thin_to_draw_is_as_tall_as_before(vera, fleet):
    tank = fleet[0]
    for k in range(12):
        place(tank, WINDOW + timedelta(hours=k), 5, f"tiny-{k}")
    row = row_of(slots(vera, zoom="7d"), "tank")
    assert "data-strip" in row and 'data-lanes="0"' in row
    height = int(re.search(r'<rect class="hover" x="0" y="\d+" width="\d+" height="(\d+)"', row).group(1))
    assert height == slotchart.LANE_H, "its strip in a row of one lane's height, no empty lane above it"


def test_a_row_draws_three_lanes_and_a_more_control_that_expands_it(vera, fleet):
    tank = fleet[0]
    ids = [place(tank, WINDOW + timedelta(minutes=10 * k), 180, f"render-{k}") for k in range(7)]
    body = slots(vera, zoom="6h")
    row = row_of(body, "tank")
    assert 'data-lanes="3"' in row and 'data-hidden="4"' in row
    assert sum(f'id="alloc-{i}"' in row for i in ids) == 3
    more = re.search(r'<a href="([^"]+)" class="more-link" id="more-(\d+)"([^>]*)>', row)
    assert more, "a '+4 more' control in the row"
    href, node_id, attrs = html.unescape(more.group(1)), int(more.group(2)), html.unescape(more.group(3))
    assert node_id == tank.pk and f"expand={tank.pk}" in href and href.endswith(f"#slot-row-{tank.pk}")
    assert (
        'aria-expanded="false"' in attrs and 'aria-label="+4 more: 4 reservations of tank not drawn' in attrs
    )
    assert 'hx-target="#slot-table"' in attrs and 'hx-swap="morph"' in attrs and "hx-replace-url=" in attrs
    assert ">+4 more</text>" in row
    # The row is tall enough for the control under the name, and the arrow keys reach it (a roving cell).
    assert re.search(r'class="more-link" id="more-\d+" data-roving data-expand tabindex="-1"', row)

    expanded = slots(vera, zoom="6h", expand=str(tank.pk))
    row = row_of(expanded, "tank")
    assert 'data-lanes="7"' in row and "data-hidden" not in row
    assert all(f'id="alloc-{i}"' in row for i in ids)
    assert 'aria-expanded="true"' in row and ">show fewer</text>" in row
    folded = html.unescape(re.search(r'<a href="([^"]+)" class="more-link"', row).group(1))
    assert "expand=" not in folded, "show fewer leads back to the folded row"


def test_a_row_without_overflow_has_no_control_even_when_asked_to_expand(vera, fleet):
    tank = fleet[0]
    place(tank, WINDOW + timedelta(minutes=10), 60, "alone")
    for params in ({}, {"expand": str(tank.pk)}):
        row = row_of(slots(vera, zoom="6h", **params), "tank")
        assert "more-link" not in row and 'data-lanes="1"' in row


def test_bad_expand_values_are_ignored(vera, fleet):
    for raw in ("x", "-1", "²", ",,,", "9" * 40, ",".join(["1"] * 500)):
        assert 'id="slot-table"' in slots(vera, expand=raw)
    assert slotchart.expanded_from("3, 12,x,,²,-4") == frozenset({3, 12})


# State in the URL -----------------------------------------------------------------------------------------------


def test_every_link_and_the_live_refresh_keep_the_tables_state(vera, fleet):
    tank = fleet[0]
    state = {
        "zoom": "6h",
        "from": WINDOW.isoformat(),
        "q": "ta",
        "expand": str(tank.pk),
        "forecast": "closed",
    }
    body = slots(vera, **state)
    live = html.unescape(re.search(r'id="slot-table"[^>]*\s+hx-get="([^"]+)"', body).group(1))
    for part in ("zoom=6h", "q=ta", f"expand={tank.pk}", "forecast=closed", "from="):
        assert part in live, (part, live)
    nav = body[body.index('id="slot-nav"') : body.index("</div>", body.index('id="slot-nav"'))]
    links = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', nav)]
    assert len(links) == 7  # four zooms, earlier, now, later
    assert all(f"expand={tank.pk}" in h and "q=ta" in h and "forecast=closed" in h for h in links), links
    # The filter form keeps what is not one of its fields.
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', body))
    assert hidden["expand"] == str(tank.pk) and hidden["forecast"] == "closed" and hidden["zoom"] == "6h"


def test_a_zoom_keeps_the_windows_middle_and_the_keys_mark_the_next_zooms(vera, fleet):
    body = slots(vera, zoom="6h")  # from WINDOW: 08:00-14:00, middle 11:00
    zooms = dict(re.findall(r'<a href="([^"]+)" class="badge[^"]*"[^>]*>(\w+)</a>', body))
    by_zoom = {z: html.unescape(u) for u, z in zooms.items()}
    assert "from=2026-12-09T10%3A30%3A00%2B00%3A00" in by_zoom["1h"]  # 10:30-11:30
    assert "from=2026-12-08T23%3A00%3A00%2B00%3A00" in by_zoom["24h"]  # 23:00-23:00
    assert re.search(r'class="badge "[^>]*data-key="\+"[^>]*>1h<', body)
    assert re.search(r'class="badge "[^>]*data-key="-"[^>]*>24h<', body)
    # Following now, a zoom follows now too.
    following = vera.get(reverse("slot-table"), {"zoom": "6h"}).content.decode()
    assert "from=" not in html.unescape(re.search(r'href="([^"]+)"[^>]*>24h<', following).group(1))


def test_an_htmx_render_sends_the_toolbar_and_the_filter_state_out_of_band(vera, fleet):
    page = slots(vera, zoom="6h")
    assert "hx-swap-oob" not in page
    fragment = slots(vera, htmx=True, zoom="6h", expand=str(fleet[0].pk))
    assert '<div id="slot-nav" class="slot-nav" hx-swap-oob="morph">' in fragment
    assert '<span id="slot-filter-state" hx-swap-oob="morph">' in fragment
    assert "<html" not in fragment


def test_the_footer_says_which_rows_are_loaded(vera, fleet):
    tank = fleet[0]
    for k in range(5):
        place(tank, WINDOW + timedelta(minutes=10 * k), 120, f"job-{k}")
    body = slots(vera, zoom="6h")
    summary = body[body.index('id="slot-summary"') :]
    assert "Nodes 1–3 of 3 loaded" in summary
    assert "1 row with reservations behind “+N more”" in summary
    assert 'data-total="3"' in summary


# The queue forecast ---------------------------------------------------------------------------------------------


def queue(count: int, start=None) -> list[int]:
    start = start or WINDOW + timedelta(hours=1)
    leases = Lease.objects.bulk_create(
        Lease(
            name=f"waiting-{i:02d}",
            type="best_effort",
            state="queued",
            submitted_at=WINDOW - timedelta(minutes=count - i),
            duration_s=600,
            vnodes=[{"cpu_cores": 1, "mem_mib": 512, "disk_gib": 0}],
            estimated_start=start + timedelta(minutes=5 * i),
            estimated_end=start + timedelta(minutes=5 * i + 10),
        )
        for i in range(count)
    )
    return [x.pk for x in leases]


def estimate_rows(body: str) -> list[int]:
    return [int(x) for x in re.findall(r'<g class="row estimate" data-lease="(\d+)"', body)]


def test_the_queue_forecast_pages_ten_leases_at_a_time_in_queue_order(vera, fleet):
    ids = queue(23)
    Lease.objects.create(name="no-estimate", type="best_effort", state="queued", submitted_at=WINDOW,
                         duration_s=60, vnodes=[{"cpu_cores": 1, "mem_mib": 512, "disk_gib": 0}])  # fmt: skip
    first = slots(vera, zoom="6h")
    assert estimate_rows(first) == ids[:ESTIMATE_PAGE]
    assert "23 queued leases estimated to run in this window" in first
    assert "1 queued without an estimate" in first
    assert "leases 1–10 of 23 · page 1 of 3" in first
    nxt = html.unescape(re.search(r'<a href="([^"]+)" id="forecast-next"', first).group(1))
    assert "fpage=2" in nxt and "zoom=6h" in nxt and 'id="forecast-prev"' not in first
    last = slots(vera, zoom="6h", fpage="3")
    assert estimate_rows(last) == ids[20:]
    assert "leases 21–23 of 23 · page 3 of 3" in last and 'id="forecast-next"' not in last
    prev = html.unescape(re.search(r'<a href="([^"]+)" id="forecast-prev"', last).group(1))
    assert "fpage=2" in prev
    # A page past the end shows the last; a bad one the first.
    assert estimate_rows(slots(vera, zoom="6h", fpage="99")) == ids[20:]
    assert estimate_rows(slots(vera, zoom="6h", fpage="x", expect=400)) == ids[:ESTIMATE_PAGE]
    # Zooming or panning starts the forecast at its first page again (its rows depend on the window).
    nav = last[last.index('id="slot-nav"') : last.index("</div>", last.index('id="slot-nav"'))]
    assert "fpage" not in nav


def test_the_queue_forecast_folds_and_says_so_in_its_url(vera, fleet):
    queue(3)
    opened = slots(vera, zoom="6h")
    # Its version (data-v, for the live patch) follows.
    assert re.search(
        r'<details class="slot-estimates" id="slot-estimates" data-forecast open data-v=', opened
    )
    closed = slots(vera, zoom="6h", forecast="closed")
    assert re.search(r'<details class="slot-estimates" id="slot-estimates" data-forecast data-v=', closed)
    assert "3 queued leases estimated" in closed  # the summary still counts them


@pytest.mark.parametrize("count", [3, 40])
def test_the_queue_forecast_costs_the_same_two_queries_however_long_the_queue(vera, fleet, count):
    queue(count)
    state = slotchart.State.from_query(
        {"zoom": "6h", "from": WINDOW.isoformat(), "fpage": "2"}, timezone.now()
    )
    with CaptureQueriesContext(connection) as captured:
        context = estimate_context(state)
    assert len(captured) == 2
    # Page 2 of 40 is leases 11-20; of 3, there is no page 2: the last page is shown.
    assert len(context["estimates"]) == (3 if count == 3 else ESTIMATE_PAGE)
