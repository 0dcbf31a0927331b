"""The console keeps the operator's place and passes axe (issue 15), in a real headless Chromium against a real
Daphne: a focused node link on the fleet board and a focused bar of the slot table are still the focused elements
after 10 s of live updates while every node heartbeats new figures; the slot table is reached and walked with the
keyboard; the skip link works; and axe-core finds no serious or critical violation on any console page, light or
dark.

Screenshots of failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.console import live

ARTIFACTS = live.ARTIFACTS
AXE = Path(__file__).parent / "vendor" / "axe-4.14.1.min.js"
LIVE_S = 10

pytestmark = live.BROWSER_TEST


def submit(console, name: str, cores: int = 1) -> dict:
    body = {
        "name": name,
        "type": "immediate",
        "duration_s": 3600,
        "nodes": [{"cpu_cores": cores, "mem_mib": 2048}],
    }
    return console.api("POST", "/api/leases", console.operator_token, body)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with live.running(tmp_path_factory.mktemp("a11y")) as server:
        server.leases = [submit(server, "render-a", 2), submit(server, "render-b")]  # type: ignore[attr-defined]
        yield server


sign_in = live.sign_in


@pytest.fixture(scope="module")
def light(browser, console):
    context = sign_in(browser, console, color_scheme="light")
    yield context
    context.close()


@pytest.fixture(scope="module")
def dark(browser, console):
    context = sign_in(browser, console, color_scheme="dark")
    yield context
    context.close()


@pytest.fixture
def page(light, request):
    page = light.new_page()
    yield page
    live.screenshot_on_failure(page, request)


def wait_live(page) -> None:
    page.wait_for_selector("#live-state.ok")


def count_swaps(page) -> None:
    # A live update of the fleet board or the slot table is a patch of its changed rows, not an htmx swap
    # (console.js): all count.
    page.evaluate(
        """() => { window.swaps = 0;
          document.body.addEventListener("htmx:afterSwap", () => window.swaps++);
          document.body.addEventListener("board-patched", (e) => { if (e.detail.rows) window.swaps++; });
          document.body.addEventListener("slots-patched", (e) => { if (e.detail.rows) window.swaps++; }); }"""
    )


def heartbeats_for(console, seconds: float, *, halfway=None) -> int:
    """Every node heartbeats new memory figures twice a second for `seconds`; `halfway` runs once in the middle.
    Returns the last used_mib sent."""
    deadline = time.monotonic() + seconds
    used = 2048
    halfway_done = halfway is None
    while time.monotonic() < deadline:
        used += 256
        for name in console.nodes:
            console.heartbeat(name, used_mib=used)
        if not halfway_done and deadline - time.monotonic() < seconds / 2:
            halfway()
            halfway_done = True
        time.sleep(0.5)
    return used


def keep_marked(page) -> str:
    """Tags the focused element itself (a JS property, not an attribute a morph would sync away) and returns its
    text, so "still focused" below means the same element, not a look-alike put in its place."""
    return page.evaluate(
        "() => { document.activeElement.__keep = true; return document.activeElement.textContent; }"
    )


def still_marked(page) -> bool:
    return page.evaluate("() => document.activeElement && document.activeElement.__keep === true")


def test_a_focused_node_link_on_the_fleet_board_stays_focused_through_10_s_of_live_updates(page, console):
    page.goto(console.url + "/")
    wait_live(page)
    page.locator('tr[data-node="architect"] td a').first.focus()
    assert keep_marked(page) == "architect"
    count_swaps(page)

    used = heartbeats_for(console, LIVE_S)

    pct = f"{100 * used / 16384:.1f}"
    page.wait_for_selector(f'tr[data-node="morpheus"] [data-observed-pct="{pct}"]')
    assert page.evaluate("window.swaps") >= 3, "live updates must really have run"
    assert still_marked(page), "focus left the node link during live updates"
    assert page.evaluate("document.activeElement.textContent") == "architect"


def test_a_bar_reached_with_the_keyboard_stays_focused_through_10_s_of_live_updates(page, console):
    lease = console.leases[0]
    page.goto(console.url + "/slots/?zoom=6h")
    wait_live(page)
    # The chart is one tab stop; the arrow keys walk its rows and bars.
    rows = page.locator("#slot-table [role=row]")
    target = next(
        i for i in range(rows.count()) if rows.nth(i).locator(f'[data-lease="{lease["id"]}"]').count()
    )
    page.locator('#slot-table [data-roving][tabindex="0"]').focus()
    for _ in range(target):
        page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    for _ in range(5):
        if page.evaluate(f"!!document.activeElement.querySelector('[data-lease=\"{lease['id']}\"]')"):
            break
        page.keyboard.press("ArrowRight")
    name = page.evaluate("document.activeElement.getAttribute('aria-label')")
    node = rows.nth(target).get_attribute("data-node")
    assert name.startswith(f"lease {lease['id']} render-a, immediate, vm on {node}, "), name
    assert " UTC" in name
    assert page.evaluate("document.activeElement.getAttribute('tabindex')") == "0"
    keep_marked(page)
    count_swaps(page)

    extra: dict = {}
    heartbeats_for(console, LIVE_S, halfway=lambda: extra.update(submit(console, "render-c")))

    page.locator(f'#slot-table [data-lease="{extra["id"]}"]').wait_for()
    assert page.evaluate("window.swaps") >= 1, "the slot table must really have been re-rendered"
    assert still_marked(page), "focus left the bar during live updates"
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == name
    # Still walkable after the morphs: one tab stop, and the keys still move.
    assert page.locator('#slot-table [data-roving][tabindex="0"]').count() == 1
    page.keyboard.press("Home")
    assert page.evaluate("document.activeElement.classList.contains('node-link')")


def test_a_fragment_that_renders_the_same_bytes_is_not_swapped(page, console):
    page.goto(console.url + "/leases/")
    wait_live(page)
    # The resync on connect fetched the table once (the first fingerprint); nothing changed since.
    page.wait_for_load_state("networkidle")
    page.evaluate(
        """() => { window.tableSwaps = 0;
          document.body.addEventListener("htmx:afterSwap", (e) => { if (e.detail.target.id === "lease-table") window.tableSwaps++; });
          document.getElementById("lease-table").__keep = true; }"""
    )
    skips = page.evaluate("Number(document.body.dataset.unchangedSkips || 0)")
    page.evaluate("document.body.dispatchEvent(new CustomEvent('lease-changed'))")
    page.wait_for_function(f"Number(document.body.dataset.unchangedSkips || 0) > {skips}")
    assert page.evaluate("window.tableSwaps") == 0
    assert page.evaluate("document.getElementById('lease-table').__keep") is True


def test_the_skip_link_is_the_first_tab_stop_and_lands_in_main(page, console):
    page.goto(console.url + "/slots/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"


def test_every_page_says_whether_it_is_live_within_seconds(page, console):
    """A page with live parts says "live" once its socket is up; one with none (a placement report) says it is not
    live, where it used to say "connecting…" for as long as it stayed open (found looking at the demo)."""
    for path in console_pages(console, page):
        page.goto(console.url + path)
        page.wait_for_function(
            "() => document.getElementById('live-state').textContent !== 'connecting…'", timeout=5_000
        )
        state = page.locator("#live-state").inner_text()
        live_parts = page.locator("[data-live]").count()
        assert state == ("live" if live_parts else "not live on this page"), (path, state)
        assert page.locator("#live-toggle").is_visible() == bool(live_parts), path


# -- axe ---------------------------------------------------------------------------------------------------------


def console_pages(console, page) -> list[str]:
    lease = console.leases[0]
    page.goto(f"{console.url}/leases/{lease['id']}/")
    report = page.locator('a[href^="/placement/"]').first.get_attribute("href")
    [inst] = console.api("GET", f"/api/instances/?lease={lease['id']}", console.operator_token)["results"]
    node = console.nodes["tank"]["id"]
    return [
        "/",
        "/?status=online",
        "/slots/",
        "/slots/?zoom=24h",
        "/leases/",
        "/leases/new",
        f"/leases/{lease['id']}/",
        "/placement/preview",
        report,
        "/instances/",
        f"/instances/{inst['iid']}/",
        "/reschedules/",
        "/alerts/",
        "/audit/",
        f"/nodes/{node}/",
    ]


AXE_RUN = """async () => {
  const result = await axe.run(document, { resultTypes: ["violations"] });
  return {
    passed: result.passes.length,
    serious: result.violations
      .filter((v) => v.impact === "serious" || v.impact === "critical")
      .map((v) => v.id + " (" + v.impact + "): " + v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(" | ")),
  };
}"""


def axe_violations(page, url: str) -> list[str]:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    # Live updates paused while axe reads the page: a morph in the middle of its run is not what it should judge.
    if page.locator("#live-toggle:visible").count():  # hidden on a page with nothing live
        page.click("#live-toggle")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(AXE_RUN)
    assert result["passed"] >= 10, f"axe checked almost nothing on {url}: {result}"
    return result["serious"]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_axe_finds_no_serious_or_critical_violation_on_any_console_page(request, console, theme):
    context = request.getfixturevalue(theme)
    page = context.new_page()
    try:
        found = {path: axe_violations(page, console.url + path) for path in console_pages(console, page)}
        signed_out = context.browser.new_context(color_scheme=theme)
        try:
            login = signed_out.new_page()
            found["/login/"] = axe_violations(login, console.url + "/login/")
        finally:
            signed_out.close()
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"axe-{theme}.png"), full_page=True)
        raise
    finally:
        page.close()
    broken = {path: v for path, v in found.items() if v}
    assert not broken, f"axe in the {theme} theme: {broken}"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_axe_finds_no_serious_or_critical_violation_in_the_keyboard_sheet(request, console, theme):
    """The `?` sheet (issue 46, item 4), open, with the shortcuts on and off: axe reads the page with the dialog
    open (the rest of the page inert under it)."""
    context = request.getfixturevalue(theme)
    page = context.new_page()
    found = {}
    try:
        for path in ("/", "/slots/"):
            page.goto(console.url + path)
            page.wait_for_load_state("networkidle")
            page.click("#live-toggle")
            page.keyboard.press("?")
            assert page.locator("#shortcuts").evaluate("(d) => d.open")
            page.add_script_tag(path=str(AXE))
            for switch in ("on", "off"):
                if switch == "off":
                    page.locator("#shortcuts-on").uncheck()
                    page.wait_for_function("document.body.dataset.shortcutsSaved === 'off'")
                result = page.evaluate(AXE_RUN)
                assert result["passed"] >= 10, result
                found[f"{path} ({switch})"] = result["serious"]
            page.locator("#shortcuts-on").check()
            page.wait_for_function("document.body.dataset.shortcutsSaved === 'on'")
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"axe-sheet-{theme}.png"), full_page=True)
        raise
    finally:
        page.close()
    broken = {where: v for where, v in found.items() if v}
    assert not broken, f"axe in the {theme} theme: {broken}"
