"""Live updates in a real headless Chromium against a real Daphne: a page that misses a batch notices the gap in the
batches' numbers and re-fetches its fragments; a page that misses nothing does not.

Playwright stands between the page and Daphne's websocket (`route_web_socket`) and drops one batch, as the channel
layer does when a broadcast expires or overflows, or as the hub does for a socket that lags. Screenshots of
failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.console import live

ARTIFACTS = live.ARTIFACTS

pytestmark = live.BROWSER_TEST


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with live.running(tmp_path_factory.mktemp("live")) as server:
        yield server


class Wire:
    """Forwards the websocket both ways; `drop_next` swallows the next batch that mentions a node, and after a drop
    every later batch reaches the page with its number but none of its events, so only a resync can show what
    changed."""

    def __init__(self) -> None:
        self.drop_next: int | None = None
        self.dropped: list[dict] = []
        self.seqs: list[int] = []

    def route(self, ws) -> None:
        server = ws.connect_to_server()
        ws.on_message(lambda message: server.send(message))

        def from_server(message) -> None:
            data = json.loads(message)
            if data.get("event") == "batch":
                nodes = {item.get("node") for item in data["changed"].get("node-changed", [])}
                if self.drop_next is not None and self.drop_next in nodes:
                    self.drop_next = None
                    self.dropped.append(data)
                    return
                if self.dropped:
                    data["changed"] = {}
                    message = json.dumps(data)
                self.seqs.append(data["seq"])
            ws.send(message)

        server.on_message(from_server)


@pytest.fixture
def wired(browser, console, request):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    wire = Wire()
    page.route_web_socket("**/ws/console/", wire.route)
    page.goto(console.url + "/login/")
    page.fill("input[name=username]", "otto")
    page.fill("input[name=password]", live.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(console.url + "/")
    page.wait_for_selector("#live-state.ok")
    yield page, wire
    live.screenshot_on_failure(page, request)
    context.close()


def bar(node: str) -> str:
    return f'tr[data-node="{node}"] [data-observed-pct]'


def test_a_page_that_misses_a_batch_sees_the_gap_and_resyncs(wired, console):
    page, wire = wired
    # In order: the change arrives as its own event, no resync.
    console.heartbeat("architect", used_mib=4096)
    page.wait_for_selector(bar("architect") + '[data-observed-pct="25.0"]')
    assert page.evaluate("document.body.dataset.liveGaps") is None

    wire.drop_next = console.nodes["architect"]["id"]
    console.heartbeat("architect", used_mib=12288)
    deadline = time.monotonic() + 10
    while not wire.dropped and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert wire.dropped, "the heartbeat's batch never came"
    page.wait_for_timeout(1000)
    # The page never heard of it.
    assert page.locator(bar("architect")).get_attribute("data-observed-pct") == "25.0"

    # The next batch the page gets (another node's heartbeat, its events stripped) skips a number: resync.
    console.heartbeat("morpheus", used_mib=2048)
    page.wait_for_selector(bar("architect") + '[data-observed-pct="75.0"]')
    assert page.evaluate("document.body.dataset.liveGaps") == "1"
    assert wire.seqs[-1] > wire.dropped[0]["seq"]
