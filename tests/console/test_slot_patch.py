"""A live slot table's patch (issue 46, item 2), through Django's test client: the table posts what it shows (its
window, node count, and the versions of its row pages, rows and sections) to /slots/patch/ and is sent only what
moved: the row that changed, the rows below a row that grew and their page's frame, a section whose version moved;
nothing when nothing did. A table that cannot be patched (its window moved on, a node came) is told so (409) and
fetches itself whole; what cannot be read is a 400 with a message, never a 500."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.urls import reverse
from django.utils import timezone

from leases import slotchart
from tests.console.conftest import register
from tests.console.test_slot_chart import WINDOW, place, slots
from tests.console.test_slot_rows import queue


def shown(body: str) -> dict[str, str]:
    """What console.js posts for the table in `body` (a full render): see slotsShown."""
    table = re.search(r'<div id="slot-table"[^>]*>', body, re.S).group(0)

    def attr(html: str, name: str) -> str:
        return re.search(rf'{name}="([^"]*)"', html).group(1)

    section = {
        name: re.search(rf'id="{id_}"[^>]*data-v="(\w*)"', body).group(1)
        for name, id_ in (
            ("summary", "slot-summary"),
            ("ending", "slot-ending"),
            ("forecast", "slot-estimates"),
        )
    }
    rows = re.findall(r'<g class="row [^"]*" role="row"[^>]*id="slot-row-(\d+)" data-v="(\w+)"', body)
    return {
        "at": attr(table, "data-window"),
        "nodes": attr(table, "data-nodes"),
        "now_line": "1" if '<line class="now"' in body else "0",
        "pages": ",".join(
            re.findall(r'<svg class="slots rows" id="slot-page-\d+" data-page="\d+" data-v="(\w+)"', body)
        ),
        "rows": ",".join(f"{node}.{version}" for node, version in rows),
        **section,
    }


def table(client, **params) -> str:
    params.setdefault("from", WINDOW.isoformat())
    return slots(client, htmx=True, **params)


def patch(client, have: dict[str, str], **params):
    params.setdefault("from", WINDOW.isoformat())
    return client.post(f"{reverse('slot-patch')}?{urlencode(params)}", have, headers={"HX-Request": "true"})


def sent(response) -> dict:
    """The rows (node ids), page frames (page numbers) and sections a patch carries."""
    assert response.status_code == 200, response.content
    assert response["X-Slot-Patch"] == "1"
    body = response.content.decode()
    return {
        "rows": [int(n) for n in re.findall(r'role="row"[^>]*id="slot-row-(\d+)"', body)],
        "frames": [int(n) for n in re.findall(r'<svg class="slots rows" id="slot-page-(\d+)"', body)],
        "sections": re.findall(r'id="(slot-summary|slot-ending|slot-estimates)"', body),
        "body": body,
    }


def row_markup(body: str, node_id: int) -> str:
    return re.search(rf'<g class="row [^"]*" role="row"[^>]*id="slot-row-{node_id}".*?(?=<g class="row |<line class="now"|</svg>)',
                     body, re.S).group(0).strip()  # fmt: skip


def by_name(fleet) -> dict:
    return {n.name: n for n in fleet}


def test_nothing_changed_sends_nothing(vera, fleet):
    got = sent(patch(vera, shown(table(vera))))
    assert (got["rows"], got["frames"], got["sections"]) == ([], [], [])


def test_a_new_bar_on_one_node_sends_that_row_and_nothing_else(vera, fleet):
    nodes = by_name(fleet)
    before = shown(table(vera))
    alloc = place(nodes["architect"], WINDOW + timedelta(hours=1), 60, "render-one")

    got = sent(patch(vera, before))
    assert got["rows"] == [nodes["architect"].pk]
    assert (got["frames"], got["sections"]) == ([], [])
    assert f'id="alloc-{alloc}"' in got["body"]
    # The row sent is the row a full render of the same window draws, to the byte.
    assert row_markup(got["body"], nodes["architect"].pk) == row_markup(table(vera), nodes["architect"].pk)


def test_a_row_that_grows_a_lane_sends_its_pages_frame_and_the_rows_it_pushed_down(vera, fleet):
    nodes = by_name(fleet)  # in the table by name: architect, morpheus, tank
    place(nodes["morpheus"], WINDOW + timedelta(hours=1), 60, "first")
    before = shown(table(vera))
    place(nodes["morpheus"], WINDOW + timedelta(hours=1, minutes=30), 60, "overlapping")

    got = sent(patch(vera, before))
    assert got["frames"] == [0]
    assert got["rows"] == [nodes["morpheus"].pk, nodes["tank"].pk], "architect, above it, did not move"
    now = table(vera)
    height = re.search(r'id="slot-page-0"[^>]*height="(\d+)"', now).group(1)
    assert re.search(rf'id="slot-page-0"[^>]*height="{height}"', got["body"])
    assert row_markup(got["body"], nodes["tank"].pk) == row_markup(now, nodes["tank"].pk)


def test_a_row_that_grows_on_the_second_page_leaves_the_first_alone(vera, fleet):
    extra = [register(f"node-{i:02d}") for i in range(slotchart.ROWS_PER_PAGE)]
    ordered = sorted([*fleet, *extra], key=lambda n: n.name)
    second = ordered[slotchart.ROWS_PER_PAGE]
    before = shown(table(vera, pages="2"))
    assert len(before["pages"].split(",")) == 2
    place(second, WINDOW + timedelta(hours=1), 60, "a")
    place(second, WINDOW + timedelta(hours=1, minutes=10), 60, "b")

    got = sent(patch(vera, before))
    assert got["frames"] == [1]
    assert got["rows"] == [n.pk for n in ordered[slotchart.ROWS_PER_PAGE :]]


def test_the_footer_is_sent_when_its_version_moves_and_then_not_again(vera, fleet):
    nodes = by_name(fleet)
    before = shown(table(vera))
    # Four overlapping bars: the row draws three lanes and "+1 more", which the footer counts.
    for i in range(4):
        place(nodes["tank"], WINDOW + timedelta(hours=1, minutes=i), 60, f"crowd-{i}")

    got = sent(patch(vera, before))
    assert got["sections"] == ["slot-summary"]
    assert "1 row with reservations behind" in got["body"]
    after = shown(table(vera))
    assert after["summary"] != before["summary"]
    assert sent(patch(vera, after))["sections"] == []


def test_a_lease_joining_the_queue_sends_the_queue_forecast(vera, fleet):
    before = shown(table(vera))
    queue(1, start=WINDOW + timedelta(hours=1))
    got = sent(patch(vera, before))
    assert got["sections"] == ["slot-estimates"]
    assert got["rows"] == []


def test_a_table_that_cannot_be_patched_is_told_to_fetch_itself(vera, fleet):
    before = shown(table(vera))
    register("neo")
    response = patch(vera, before)
    assert response.status_code == 409
    assert "nodes were added or removed" in response.content.decode()

    # The window it shows is not the one it asks for (a fixed window moves only by its URL).
    other = shown(table(vera))
    response = patch(vera, other, **{"from": (WINDOW + timedelta(hours=1)).isoformat()})
    assert response.status_code == 409


def test_a_window_following_now_is_patched_until_it_is_a_minute_behind(vera, fleet):
    def following() -> str:
        response = vera.get(reverse("slot-table"), {"zoom": "6h"}, headers={"HX-Request": "true"})
        return response.content.decode()

    have = shown(following())
    assert have["now_line"] == "1"
    got = sent(patch(vera, have, **{"from": "", "zoom": "6h"}))
    assert got["rows"] == [] and re.search(r'data-now-x="[\d.]+"', got["body"])

    stale = datetime.fromisoformat(have["at"]) - timedelta(seconds=61)
    assert patch(vera, {**have, "at": stale.isoformat()}, zoom="6h", **{"from": ""}).status_code == 409
    ahead = timezone.now() + timedelta(hours=1)
    assert patch(vera, {**have, "at": ahead.isoformat()}, zoom="6h", **{"from": ""}).status_code == 409


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("at", "", "is not the start of a window"),
        ("at", "2026-13-45T00:00:00+00:00", "is not the start of a window"),
        ("at", "2026-12-09T08:00:00", "is not the start of a window"),  # no zone
        ("nodes", "²", "is not a number of nodes"),
        ("nodes", "9" * 5000, "is not a number of nodes"),
        ("now_line", "yes", "does not say whether the now line"),
        ("pages", "zz", "is not a version of a row page"),
        ("pages", ",".join(["0"] * (slotchart.MAX_PAGES + 1)), "a live table loads at most"),
        ("rows", "x.1", "is not a row"),
        ("rows", "12", "is not a row"),
        ("rows", "12.<b>", "is not a version of a row"),
        ("summary", "9" * 9, "is not a version of the summary"),
    ],
)
def test_what_cannot_be_read_is_a_400_with_a_message(vera, fleet, field, value, said):
    have = shown(table(vera))
    response = patch(vera, {**have, field: value})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    assert said in response.content.decode()


def test_more_rows_than_the_pages_hold_is_a_400(vera, fleet):
    have = shown(table(vera))
    rows = ",".join(f"{i}.0" for i in range(1, slotchart.ROWS_PER_PAGE + 2))
    assert patch(vera, {**have, "rows": rows}).status_code == 400


def test_the_patch_is_a_post_and_needs_a_signed_in_viewer(vera, fleet, client):
    have = shown(table(vera))
    assert vera.get(reverse("slot-patch"), have).status_code == 405
    assert patch(client, have).status_code == 302  # to the sign-in page
