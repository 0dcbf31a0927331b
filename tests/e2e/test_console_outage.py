"""A console through a Redis outage (issue 15), in a real headless Chromium and a websocket client against the
distributed run: with the run's own Redis stopped, open consoles are closed with 4013 ("try again later"), new
ones are refused the same way (never HTTP 500), the page falls back to polling and still shows what changes, the
`slotkeeper_websocket_clients` gauge counts only sockets really open; when Redis returns every console is
subscribed again and the page is live again, without a reload."""

from __future__ import annotations

import time

import pytest

from tests.console.live import BROWSER_TEST, CHROMIUM, CHROMIUM_ARGS
from tests.e2e.harness import OPERATOR, PASSWORD, Cluster, lease_body, say, wait_for

# One cluster and one e2e database for all of them: under pytest-xdist they run on one worker, in turn.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e"), *BROWSER_TEST, pytest.mark.timeout(240)]

TRY_AGAIN_LATER = 4013


def signed_in_page(browser, base: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto(base + "/login/")
    page.fill("input[name=username]", OPERATOR)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")
    return page


def submit(cluster: Cluster, name: str) -> int:
    # Through the second Daphne: the page under test is on the first, so what it shows comes from its own fetches.
    response = cluster.api(1).post("/api/leases/", lease_body(name, driver="sim", duration_s=600))
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def test_a_redis_outage_closes_consoles_with_try_again_later_they_poll_the_count_stays_true_and_they_resync(
    cluster: Cluster,
):
    from playwright.sync_api import sync_playwright

    base = cluster.daphne_urls[0]
    wait_for(
        lambda: cluster.websocket_clients(0) == 0, 15, "no console counted on the first Daphne at the start"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        socket = None
        try:
            page = signed_in_page(browser, base)
            page.goto(base + "/slots/?zoom=1h")
            page.wait_for_selector("#live-state.ok")
            page.evaluate("window.notReloaded = true")
            socket = cluster.console(0)
            wait_for(lambda: socket.hellos == 1, 20, "the websocket console to connect")
            wait_for(lambda: cluster.websocket_clients(0) == 2, 10, "both consoles counted")

            cluster.procs["redis"].stop()
            say("redis stopped")
            wait_for(lambda: TRY_AGAIN_LATER in socket.closes, 15, "4013 on the open websocket console")
            wait_for(
                lambda: page.evaluate("document.body.dataset.liveClose") == str(TRY_AGAIN_LATER),
                15,
                "4013 in the browser",
            )
            assert "polling" in page.locator("#live-state").inner_text()
            # Reconnections while Redis is away are refused with the same code, accepted and never counted.
            time.sleep(3)
            refused = socket.closes.count(TRY_AGAIN_LATER)
            assert refused >= 2, f"reconnections while away should be refused with 4013: {socket.closes}"
            assert not [e for e in socket.errors if "500" in e], socket.errors
            for _ in range(3):
                assert cluster.websocket_clients(0) == 0, "the gauge counts sockets that are closed"
                time.sleep(0.5)

            # The fallback: no events can arrive, yet a lease placed now shows up by polling.
            polled = submit(cluster, "e2e-outage-polled")
            page.locator(f'#slot-table [data-lease="{polled}"]').first.wait_for(timeout=20_000)
            assert page.locator("#live-state.ok").count() == 0, (
                "the page claimed to be live while Redis was away"
            )
            say(f"outage: {refused} refusals with 4013, lease {polled} seen by polling")

            cluster.restart_redis()
            say("redis back")
            wait_for(lambda: socket.hellos >= 2, 30, "the websocket console to be subscribed again")
            page.wait_for_selector("#live-state.ok", timeout=30_000)
            assert int(page.evaluate("document.body.dataset.liveHellos")) >= 2
            wait_for(lambda: cluster.websocket_clients(0) == 2, 10, "exactly the two open consoles counted")
            time.sleep(1)
            assert cluster.websocket_clients(0) == 2

            # Live again: a change arrives as an event (polling stopped with the hello) and the page follows it.
            mark = socket.mark()
            pushed = submit(cluster, "e2e-outage-pushed")
            wait_for(
                lambda: socket.saw("lease-changed", mark, lease=pushed), 15, "the event after Redis returned"
            )
            page.locator(f'#slot-table [data-lease="{pushed}"]').first.wait_for(timeout=15_000)
            assert page.evaluate("window.notReloaded") is True
        finally:
            if socket is not None:
                socket.close()
            browser.close()
    wait_for(lambda: cluster.websocket_clients(0) == 0, 15, "the gauge back to 0 once both consoles left")
