"""Slot table rows that stay readable (issue 46, item 3) in a real headless Chromium against a real Daphne: six GPU
leases at once on tank (the only GPU node) draw three lanes and "+3 more"; the keyboard reaches it, Enter expands the
row in place (focus kept, the URL replaced, said to screen readers), a live refresh keeps it expanded, a reload of
the URL shows it expanded; the footer counts the rows the scroll box shows as it scrolls; the queue forecast folds
and pages, both in the URL; and axe finds nothing serious on the table with a row expanded and the forecast paged,
light and dark. Skipped only when Debian's chromium is not installed."""

from __future__ import annotations

import re

import pytest

from tests.console import live
from tests.console.test_browser_a11y import ARTIFACTS, axe_violations, sign_in, wait_live

pytestmark = live.BROWSER_TEST

EXTRA_NODES = 20
GPU_LEASES = 6
QUEUED = 16  # two run at once, fourteen queue: past one page of the forecast (ten)

ADD_NODES = """
from django.utils import timezone
from fleet import actions
for i in range(%d):
    actions.do_register_node(None, name=f"zz-extra-{i:02d}", cpu_cores=4, mem_total_mib=8192, disk_total_gib=50,
                             capabilities=[], now=timezone.now())
"""


def gpu_lease(server, k: int) -> dict:
    body = {
        "name": f"gpu-render-{k}",
        "type": "immediate",
        "duration_s": 1800 * (k + 1),
        "capabilities": ["gpu"],
        "nodes": [{"cpu_cores": 1, "mem_mib": 1024}],
    }
    return server.api("POST", "/api/leases", server.operator_token, body)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slot-rows")
    server = live.start(workdir)
    live.shell(workdir, ADD_NODES % EXTRA_NODES)
    for name in server.nodes:
        server.heartbeat(name, used_mib=2048)
    server.leases = [gpu_lease(server, k) for k in range(GPU_LEASES)]  # type: ignore[attr-defined]
    # Best-effort leases of a node's whole allocatable memory: architect and morpheus take one each (tank holds the
    # GPU leases; the extra nodes never heartbeat, so they take nothing), the rest queue, each with an estimate.
    whole = {"cpu_cores": 1, "mem_mib": 10240}
    server.queued = [  # type: ignore[attr-defined]
        server.api(
            "POST",
            "/api/leases",
            server.operator_token,
            {"name": f"waiting-{i:02d}", "type": "best_effort", "duration_s": 600, "nodes": [whole]},
        )
        for i in range(QUEUED)
    ]
    yield server
    live.stop(server.process)


@pytest.fixture(scope="module")
def operator(browser, console):
    context = sign_in(browser, console, color_scheme="light")
    yield context
    context.close()


@pytest.fixture
def page(operator, request):
    return live.new_page(operator, request)


def shown(control) -> str:
    """The words a "+N more" shows (its <text> without the <title> inside it)."""
    return control.evaluate("(a) => a.querySelector('text.more').lastChild.textContent")


def announced(page) -> str:
    page.wait_for_function("document.getElementById('announce').textContent !== ''")
    return page.locator("#announce").text_content() or ""


def test_a_row_of_many_overlapping_reservations_draws_three_lanes_and_expands_in_place(page, console):
    tank = console.nodes["tank"]["id"]
    assert all(lease["state"] == "active" for lease in console.leases), console.leases
    page.goto(console.url + "/slots/?zoom=6h")
    wait_live(page)
    row = page.locator('#slot-table [role=row][data-node="tank"]')
    assert row.get_attribute("data-lanes") == "3"
    drawn = [x for x in console.leases if row.locator(f'[data-lease="{x["id"]}"]').count()]
    assert len(drawn) == 3
    assert row.get_attribute("data-hidden") == str(GPU_LEASES - 3)
    more = page.locator(f"#more-{tank}")
    assert shown(more) == f"+{GPU_LEASES - 3} more"
    # The row holds three lanes, not six.
    assert row.locator("rect.hover").bounding_box()["height"] <= 3 * 18 + 10 + 1

    # The keyboard: the chart is one tab stop; the control is the cell after the node's name.
    page.locator('#slot-table [role=row][data-node="tank"] a.node-link').focus()
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == f"more-{tank}"
    page.evaluate("document.activeElement.__keep = true")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "document.querySelector('#slot-table [role=row][data-node=\"tank\"]').dataset.lanes === '6'"
    )
    assert all(row.locator(f'[data-lease="{x["id"]}"]').count() for x in console.leases)
    assert re.search(rf"[?&]expand={tank}(&|$)", page.url), page.url
    assert page.evaluate("document.activeElement.__keep === true"), (
        "focus stays on the control, morphed in place"
    )
    assert more.get_attribute("aria-expanded") == "true" and shown(more) == "show fewer"
    assert announced(page) == "tank: every reservation shown, 6 lanes"
    # The toolbar's links keep the expanded row (sent out of band with the table).
    assert f"expand={tank}" in page.locator('#slot-nav a[data-key="]"]').get_attribute("href")

    # A live refresh keeps it expanded: a seventh lease on tank arrives.
    extra = gpu_lease(console, 9)
    page.locator(f'#slot-table [data-lease="{extra["id"]}"]').wait_for()
    assert row.get_attribute("data-lanes") == "7"
    console.leases.append(extra)

    # A reload of the URL shows the same table.
    page.reload()
    wait_live(page)
    assert row.get_attribute("data-lanes") == "7" and shown(more) == "show fewer"

    more.focus()
    page.keyboard.press("Enter")
    page.wait_for_function(
        "document.querySelector('#slot-table [role=row][data-node=\"tank\"]').dataset.lanes === '3'"
    )
    assert "expand=" not in page.url
    assert shown(more) == "+4 more" and more.get_attribute("aria-expanded") == "false"


IN_VIEW = """() => {
  const box = document.querySelector('#slot-table .slot-scroll').getBoundingClientRect();
  const axis = document.querySelector('#slot-table svg.axis').getBoundingClientRect();
  const top = Math.max(box.top + axis.height, 0), bottom = Math.min(box.bottom, innerHeight);
  return Array.from(document.querySelectorAll('#slot-table [role=row][data-node]'))
    .filter((r) => { const b = r.getBoundingClientRect(); return b.bottom > top + 1 && b.top < bottom - 1; })
    .map((r) => Number(r.getAttribute('aria-rowindex')));
}"""


def in_view(page) -> list[int]:
    """The aria-rowindex of every row whose box meets the scroll box's (below its sticky axis) and the window."""
    return page.evaluate(IN_VIEW)


def footer_agrees(page, total: int) -> list[int]:
    """The rows in view once the footer names exactly them. Read in one frame of the page: the footer is counted in
    the animation frame after a scroll, and a live update can move the rows between two separate reads (the test
    read the rows, then the footer, and saw 1-12 against 1-13 under load)."""
    handle = page.wait_for_function(
        f"""() => {{
          const seen = ({IN_VIEW})();
          const said = document.querySelector('#slot-summary [data-in-view]').textContent;
          return seen.length && said === `Nodes ${{seen[0]}}–${{seen[seen.length - 1]}} of {total} in view; `
            + 'scroll the table for the rest' ? seen : null;
        }}"""
    )
    return handle.json_value()


def test_the_footer_counts_the_rows_the_table_shows_as_it_scrolls(browser, console):
    context = sign_in(browser, console, color_scheme="light")
    page = context.new_page()
    try:
        page.set_viewport_size({"width": 1280, "height": 700})
        page.goto(console.url + "/slots/?zoom=6h&forecast=closed")
        wait_live(page)
        page.locator("#slot-table .slot-scroll").scroll_into_view_if_needed()
        total = 3 + EXTRA_NODES
        seen = footer_agrees(page, total)
        assert seen[0] == 1 and len(seen) < total, "the box shows only some of the rows: the test needs that"
        page.locator("#slot-table .slot-scroll").evaluate("(box) => box.scrollBy(0, 200)")
        page.wait_for_function(
            f"!document.querySelector('#slot-summary [data-in-view]').textContent.startsWith('Nodes {seen[0]}–')"
        )
        after = footer_agrees(page, total)
        assert after[0] > seen[0]
    finally:
        context.close()


def test_the_queue_forecast_folds_and_pages_and_its_url_says_so(page, console):
    queued = [x for x in console.queued if x["state"] == "queued"]
    assert len(queued) > 10, [x["state"] for x in console.queued]
    page.goto(console.url + "/slots/?zoom=24h")
    wait_live(page)
    forecast = page.locator("#slot-estimates")
    rows = forecast.locator("g.row.estimate")
    assert forecast.get_attribute("open") is not None
    assert rows.count() == 10
    first = rows.first.get_attribute("data-lease")
    page.locator("#forecast-next").click()
    page.wait_for_function("/page 2 of/.test(document.getElementById('forecast-page').textContent)")
    assert "fpage=2" in page.url
    assert rows.first.get_attribute("data-lease") != first
    assert announced(page).startswith("Queue forecast, leases 11 to ")
    # No next page: focus is kept in the pager, not dropped on <body>.
    assert page.evaluate("document.activeElement.id") in {"forecast-page", "forecast-prev"}

    # The URL follows the fold in <details>' toggle event, which the browser fires a task after `open` changes:
    # wait for the URL, not for `open` (a read between the two saw the old URL).
    forecast.locator("summary").click()
    page.wait_for_function("/[?&]forecast=closed/.test(location.href)")
    assert forecast.get_attribute("open") is None and "fpage=2" in page.url
    assert "forecast=closed" in page.locator('#slot-nav a[data-key="n"]').get_attribute("href")
    page.reload()
    wait_live(page)
    assert forecast.get_attribute("open") is None
    assert "page 2 of" in page.locator("#forecast-page").text_content()
    forecast.locator("summary").click()
    page.wait_for_function("!/[?&]forecast=/.test(location.href)")
    assert forecast.get_attribute("open") is not None


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_axe_finds_nothing_serious_on_a_table_with_a_row_expanded_and_one_folded(browser, console, theme):
    context = sign_in(browser, console, color_scheme=theme)
    page = context.new_page()
    tank = console.nodes["tank"]["id"]
    try:
        for url in ("/slots/?zoom=6h", f"/slots/?zoom=6h&expand={tank}&fpage=2"):
            found = axe_violations(page, console.url + url)
            assert not found, (url, theme, found)
        ARTIFACTS.mkdir(exist_ok=True)
        page.goto(console.url + "/slots/?zoom=6h")
        page.screenshot(path=str(ARTIFACTS / f"slot-rows-{theme}.png"), full_page=True)
    finally:
        context.close()
