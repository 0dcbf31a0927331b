"""A node name of 100 characters in one word (the longest a name may be) in a real headless Chromium against a real
Daphne: on the board it wraps inside its column instead of pushing the figures off the screen, and in the slot table
its label stays left of the chart's axis instead of running across the bars. Both ran across before the fix (found
by registering a node as an outsider would, with a name from schemathesis).

Skipped only when Debian's chromium is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.console import live
from tests.console.test_browser_a11y import sign_in, wait_live

pytestmark = live.BROWSER_TEST

LONG = "a" + "0" * 99
# Everyday names, which must never break inside a word (they did once long names could break anywhere).
SHORT = ("edge-cam-01", "batch-runner-02")  # besides the live fleet's tank, architect and morpheus

ADD_NODE = """
from django.utils import timezone
from fleet import actions
actions.do_register_node(None, name=%r, cpu_cores=4, mem_total_mib=8192, disk_total_gib=50, capabilities=[],
                         now=timezone.now())
"""


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("long-names")
    server = live.start(workdir)
    for name in (LONG, *SHORT):
        live.shell(workdir, ADD_NODE % name)
    yield server
    live.stop(server.process)


@contextmanager
def opened(browser, console, path: str) -> Iterator:
    context = sign_in(browser, console)
    try:
        page = context.new_page()
        page.goto(console.url + path)
        wait_live(page)
        yield page
    finally:
        context.close()


def test_a_long_node_name_wraps_in_its_board_column(browser, console):
    with opened(browser, console, "/") as page:
        cell = page.locator(f'tr[data-node="{LONG}"] td.node-name').bounding_box()
        assert cell["width"] <= 16 * 16 + 2 * 8 + 1, cell  # 16rem and the cell's padding
        assert page.locator(f'tr[data-node="{LONG}"] td.node-name').inner_text().replace("\n", "") == LONG


def test_a_long_node_name_stays_left_of_the_slot_tables_axis(browser, console):
    with opened(browser, console, "/slots/?zoom=6h") as page:
        row = page.locator(f'#slot-table [role=row][data-node="{LONG}"]')
        label = row.locator("text.label").bounding_box()
        axis = page.locator("#slot-table svg.rows line.axis").first.bounding_box()
        assert label["x"] + label["width"] <= axis["x"], (label, axis)
        name = row.locator("a.node-link").get_attribute("aria-label")
        shown = row.locator("text.label").text_content()
        # The text minus its <title>: what is drawn, cut with an ellipsis, and the first words of the accessible name.
        drawn = shown[shown.index("…") - 23 : shown.index("…") + 1]
        assert drawn == LONG[:23] + "…"
        assert name.startswith(drawn), name
        assert LONG in name


def test_no_page_scrolls_sideways_for_a_long_node_name(browser, console):
    """Its own page's heading (a flex item, as wide as its longest word before) and a preview's verdict table, which
    lists every node: there the name breaks over lines instead of squeezing the reasons beside it."""
    with opened(browser, console, "/") as page:
        node_id = page.locator(f'tr[data-node="{LONG}"]').get_attribute("id").removeprefix("node-")
        for path in (f"/nodes/{node_id}/", "/placement/preview"):
            page.goto(console.url + path)
            if path == "/placement/preview":
                page.locator("form:has(input[name=cpu_cores]) button[type=submit]").click()
                page.wait_for_selector(f"text={LONG[:40]}")
                name = page.locator(f'table a:text-is("{LONG}")').bounding_box()
                short = page.locator('table a:text-is("tank")').bounding_box()
                assert name["height"] > 1.5 * short["height"], (name, short)
            wide, view = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
            assert wide <= view, (path, wide, view)


def test_everyday_names_in_a_crowded_table_stay_on_one_line(browser, console):
    """A name may break anywhere only when it is longer than its column can be: the name columns keep room for an
    everyday name (8rem), so "morpheus" is not drawn as "morpheu" over "s" when the figures beside it are wide."""
    with opened(browser, console, "/") as page:
        page.set_viewport_size({"width": 900, "height": 900})  # the figures take the room, as on a busy board
        for name in ("morpheus", *SHORT):
            link = page.locator(f'tr[data-node="{name}"] td.node-name a')
            lines = link.evaluate("a => a.getClientRects().length")
            box = link.bounding_box()
            assert lines == 1 and box["height"] < 25, (name, lines, box)
