"""Negotiating a lease in the console (issue 48), in a real headless Chromium against a real Daphne: an advance
reservation that does not fit offers the windows that would, and one click takes the first; a running lease's end
is previewed, then changed.

Screenshots of failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.console import live

pytestmark = live.BROWSER_TEST


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("console-negotiation")
    server = live.start(workdir)
    for name in server.nodes:
        server.heartbeat(name, used_mib=2048)
    yield server
    live.stop(server.process)


@pytest.fixture(scope="module")
def operator(browser, console):
    context = live.sign_in(browser, console, "otto", live.PASSWORD)
    yield context
    context.close()


@pytest.fixture
def page(operator, request):
    return live.new_page(operator, request)


def lease(console, **body) -> dict:
    base = {"duration_s": 3600, "nodes": [{"cpu_cores": 8, "mem_mib": 4096}]}
    return console.api("POST", "/api/leases/", console.operator_token, {**base, **body})


def test_a_reservation_that_does_not_fit_is_taken_at_its_first_counter_offer_in_one_click(page, console):
    start = (datetime.now(UTC) + timedelta(hours=5)).replace(second=0, microsecond=0)
    # Every node's cores from `start` for an hour.
    wall = lease(
        console, name="wall", type="advance_reservation", start=start.isoformat(),
        nodes=[{"cpu_cores": 8, "mem_mib": 4096}] * 3,
    )  # fmt: skip
    assert wall["state"] in ("ready", "scheduled")
    page.goto(console.url + "/leases/new")
    page.fill("input[name=name]", "needs-a-window")
    page.check("input[name=type][value=advance_reservation]")
    page.fill("input[name=duration_s]", "1800")
    page.fill("input[name=start]", start.strftime("%Y-%m-%dT%H:%M"))
    page.fill("input[name=cpu_cores]", "8")
    page.click("#submit-lease")
    page.wait_for_url(f"{console.url}/leases/*/")
    assert page.locator("#lease-body [data-state]").inner_text() == "rejected"
    offers = page.locator("#lease-offers [data-offer]")
    assert offers.count() == 3
    first = offers.first.locator("time").first.get_attribute("datetime")
    assert datetime.fromisoformat(first) == start + timedelta(hours=1)  # when the wall ends
    assert "wall" in page.locator("#lease-offers").inner_text()  # in the way of the window asked
    rejected_url = page.url
    offers.first.locator("button").click()
    page.wait_for_url(lambda url: url != rejected_url and "/leases/" in url)
    assert page.locator("#lease-body [data-state]").inner_text() in ("ready", "scheduled")
    assert (start + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S") in page.locator(
        "#lease-reservations"
    ).inner_text()


def test_a_running_lease_is_extended_after_a_preview(page, console):
    job = lease(console, name="runs-long", type="immediate", nodes=[{"cpu_cores": 1, "mem_mib": 1024}])
    assert job["state"] == "active"
    page.goto(f"{console.url}/leases/{job['id']}/")
    ends = page.locator("#lease-body [data-ends] time").get_attribute("datetime")
    page.click("#lease-change-end summary")
    page.fill("input[name=by_min]", "30")
    page.click("#preview-change")
    page.wait_for_selector("#change-result")
    assert page.locator("#change-result").get_attribute("data-ok") == "true"
    assert "Would apply" in page.locator("#change-result").inner_text()
    assert page.locator("#lease-body [data-ends] time").get_attribute("datetime") == ends  # nothing changed
    page.click("#apply-change")
    page.wait_for_selector(".messages")
    assert "instead of" in page.locator(".messages").inner_text()
    later = page.locator("#lease-body [data-ends] time").get_attribute("datetime")
    assert datetime.fromisoformat(later) - datetime.fromisoformat(ends) == timedelta(minutes=30)


def test_the_slot_table_counts_down_to_a_lease_whose_notice_went_out_and_axe_finds_nothing_serious(
    page, console
):
    from tests.console.test_browser_a11y import AXE, AXE_RUN

    job = lease(
        console, name="ends-soon", type="immediate", duration_s=900, notify_before_s=3600,
        nodes=[{"cpu_cores": 1, "mem_mib": 1024}],
    )  # fmt: skip
    assert job["state"] == "active"
    page.goto(f"{console.url}/slots/")
    # The server's tick sends the notice within seconds; the table's live refresh then shows it.
    summary = page.locator("details.ending-soon summary")
    summary.wait_for(timeout=30_000)
    assert f"lease {job['id']} ends-soon in" in summary.inner_text()
    summary.click()
    item = page.locator("details.ending-soon li", has_text="ends-soon")
    assert item.is_visible() and "ends in 1" in item.inner_text()  # 14 or 15 minutes
    page.click("#live-toggle")  # paused while axe reads it
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(AXE_RUN)
    assert result["passed"] >= 10 and result["serious"] == [], result["serious"]
