"""The fleet board in a real headless Chromium against a real Daphne (issue 46, items 1, 2 and 4): its page, sort and
filters live in the URL and survive a reload, and a live change to a node patches that node's row and nothing else:
no request for the board's page or table, the other rows the very same DOM elements, a focused link still focused.

Screenshots of failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

import pytest

from tests.console import live

pytestmark = live.BROWSER_TEST


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with live.running(tmp_path_factory.mktemp("board")) as server:
        yield server


@pytest.fixture(scope="module")
def signed_in(browser, console):
    context = live.sign_in(browser, console)
    yield context
    context.close()


@pytest.fixture
def page(signed_in, request):
    return live.new_page(signed_in, request)


def rows(page) -> list[str]:
    return page.eval_on_selector_all("#fleet-rows > tr[data-node]", "rows => rows.map(r => r.dataset.node)")


def board_requests(page) -> list[str]:
    """Every request the page makes from now on for the board itself (its page, its table, its patches)."""
    seen: list[str] = []
    page.on(
        "request", lambda r: seen.append(r.url) if "/ws/" not in r.url and "/static/" not in r.url else None
    )
    return seen


def test_page_sort_and_filters_live_in_the_url_and_survive_a_reload(page, console):
    page.goto(console.url + "/?per=2&sort=-name")
    assert rows(page) == ["tank", "morpheus"]
    assert page.locator("#fleet-pager [data-showing]").inner_text() == "Nodes 1–2 of 3"

    page.click("#fleet-pager a[rel=next]")
    page.wait_for_url("**/?sort=-name&page=2&per=2")
    page.wait_for_function("document.querySelectorAll('#fleet-rows > tr[data-node]').length === 1")
    assert rows(page) == ["architect"]
    page.reload()
    assert rows(page) == ["architect"], "the page is in the URL"

    # A header sorts by its column; clicked again, it reverses; a new sort starts again on page 1.
    page.click('th a[data-sort="name"]')
    page.wait_for_url("**/?per=2")
    assert rows(page) == ["architect", "morpheus"]
    assert page.locator('th[aria-sort="ascending"] a[data-sort="name"]').count() == 1
    page.click('th a[data-sort="age"]')
    page.wait_for_url("**/?sort=age&per=2")

    # The search keeps the sort and the page size (they ride along with the form) and starts on page 1.
    page.fill("input[name=q]", "ARCH")
    page.wait_for_url("**/?q=ARCH&per=2&sort=age")
    page.wait_for_function("document.querySelectorAll('#fleet-rows > tr[data-node]').length === 1")
    assert rows(page) == ["architect"]
    page.reload()
    assert page.input_value("input[name=q]") == "ARCH"
    assert page.input_value("select[name=per]") == "2"
    assert rows(page) == ["architect"]
    assert page.locator('th[aria-sort="ascending"] a[data-sort="age"]').count() == 1

    # A status chip is a plain link: it keeps the search and the sort.
    page.goto(console.url + "/?status=dead")
    assert page.locator("#fleet-rows").inner_text().strip() == "No nodes match these filters."
    page.click('[data-total="online"]')
    page.wait_for_url("**/?status=online")
    assert page.input_value("select[name=status]") == "online"
    assert rows(page) == ["architect", "morpheus", "tank"]


def test_a_url_the_board_cannot_read_says_why_and_offers_the_board_without_it(page, console):
    response = page.goto(console.url + "/?page=abc&sort=price&q=tank")
    assert response.status == 400
    problems = page.locator("#board-problems").inner_text()
    assert 'Page: "abc" is not a page number' in problems and 'Cannot sort by "price"' in problems
    assert rows(page) == ["tank"], "what could be read still counts"
    page.click("#board-problems a")
    page.wait_for_url("**/?q=tank")
    assert page.locator("#board-problems").count() == 0


def test_a_live_change_to_a_node_on_the_page_patches_its_row_and_nothing_else(page, console):
    page.goto(console.url + "/")
    page.wait_for_selector("#live-state.ok")
    page.wait_for_load_state("networkidle")
    page.evaluate(
        """() => { window.notReloaded = true;
          for (const tr of document.querySelectorAll('#fleet-rows > tr')) tr.__keep = tr.dataset.node;
          document.querySelector('#fleet-table').__keep = true; }"""
    )
    page.locator('tr[data-node="tank"] td a').focus()
    patches = int(page.evaluate("Number(document.body.dataset.boardPatches || 0)"))
    requests = board_requests(page)
    with page.expect_response(lambda r: "/board/patch/" in r.url and 'data-rows="1"' in r.text()) as patched:
        console.heartbeat("architect", used_mib=8192)
    page.wait_for_selector('tr[data-node="architect"] [data-observed-pct="50.0"]')

    body = patched.value.text()
    assert (
        'data-node="architect"' in body
        and 'data-node="tank"' not in body
        and 'data-node="morpheus"' not in body
    )
    assert "data-order" not in body
    assert all("/board/patch/" in url for url in requests), requests
    assert page.evaluate("Number(document.body.dataset.boardPatches)") > patches
    same = page.evaluate(
        """() => Array.from(document.querySelectorAll('#fleet-rows > tr'), tr => tr.__keep === tr.dataset.node)"""
    )
    assert same == [True, True, True], "every row is the element it was, the changed one morphed in place"
    assert page.evaluate("document.querySelector('#fleet-table').__keep") is True
    assert page.evaluate("document.activeElement.textContent") == "tank"
    assert page.evaluate("window.notReloaded") is True


def test_a_node_that_leaves_a_filtered_page_goes_without_a_refetch_and_focus_stays(page, console):
    page.goto(console.url + "/?status=online")
    page.wait_for_selector("#live-state.ok")
    page.wait_for_load_state("networkidle")
    page.locator('tr[data-node="tank"] td a').focus()
    page.evaluate("() => { document.activeElement.__keep = true; }")
    requests = board_requests(page)
    node = console.nodes["morpheus"]["id"]
    console.api("POST", f"/api/nodes/{node}/drain", console.operator_token, {"reason": "rack move"})
    try:
        page.wait_for_function("!document.querySelector('tr[data-node=\"morpheus\"]')")
        assert rows(page) == ["architect", "tank"]
        assert page.locator('[data-total="draining"] strong').inner_text() == "1"
        assert page.locator("#fleet-pager [data-showing]").inner_text() == "Nodes 1–2 of 2 matching"
        assert all("/board/patch/" in url for url in requests), requests
        assert page.evaluate("document.activeElement.__keep") is True
    finally:
        console.api("POST", f"/api/nodes/{node}/undrain", console.operator_token, {"reason": "back"})
    page.wait_for_selector('tr[data-node="morpheus"]')
    assert rows(page) == ["architect", "morpheus", "tank"], "and it comes back in its place"
