"""The console in a real headless Chromium against a real Daphne: sign in, watch the fleet and the slot table
change live as the API is used, drain a node through its preview, and find the drain in the audit feed.

Screenshots of failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

import re

import pytest

from tests.console import live

pytestmark = live.BROWSER_TEST


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with live.running(tmp_path_factory.mktemp("console")) as server:
        yield server


@pytest.fixture(scope="module")
def signed_in(browser, console):
    """One operator session for the module: signing in once keeps the whole file well under a minute."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto(console.url + "/login/")
    page.fill("input[name=username]", "otto")
    page.fill("input[name=password]", live.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(console.url + "/")
    yield context
    context.close()


@pytest.fixture
def page(signed_in, request):
    page = signed_in.new_page()
    yield page
    live.screenshot_on_failure(page, request)


def wait_live(page) -> None:
    # Changes are only pushed to a page whose websocket is open; waiting for it makes "no reload" a fair test.
    page.wait_for_selector("#live-state.ok")


def test_an_operator_signs_in_and_sees_the_fleet(page, console):
    page.goto(console.url + "/")
    for name in ("tank", "architect", "morpheus"):
        assert page.locator(f'tr[data-node="{name}"]').count() == 1
    assert page.locator('[data-total="online"]').inner_text() == "online 3"
    assert "otto · operator" in page.locator("#whoami").inner_text()


def test_a_heartbeat_moves_a_memory_bar_without_a_reload(page, console):
    page.goto(console.url + "/")
    wait_live(page)
    page.evaluate("window.notReloaded = true")
    bar = page.locator('tr[data-node="architect"] [data-observed-pct]')
    assert bar.get_attribute("data-observed-pct") == "12.5"
    console.heartbeat("architect", used_mib=12288)
    page.wait_for_selector('tr[data-node="architect"] [data-observed-pct="75.0"]')
    assert page.evaluate("window.notReloaded") is True


def test_a_lease_submitted_through_the_api_appears_on_the_slot_table_live(page, console):
    page.goto(console.url + "/slots/?zoom=6h")
    wait_live(page)
    page.evaluate("window.notReloaded = true")
    lease = console.api(
        "POST",
        "/api/leases",
        console.operator_token,
        {
            "name": "render-farm",
            "type": "immediate",
            "duration_s": 3600,
            "nodes": [{"cpu_cores": 2, "mem_mib": 4096}],
        },
    )
    bar = page.locator(f'svg.slots [data-lease="{lease["id"]}"]')
    bar.wait_for()
    assert "render-farm" in bar.locator("title").text_content()
    assert page.evaluate("window.notReloaded") is True


def test_a_drain_with_a_reason_goes_through_its_preview_and_lands_in_the_audit_feed(page, console):
    node = console.nodes["morpheus"]
    page.goto(f"{console.url}/nodes/{node['id']}/")
    page.fill("#drain-form input[name=reason]", "kernel upgrade, ticket 412")
    page.click("#drain-form button[type=submit]")
    page.wait_for_selector("#confirm-drain")
    assert "kernel upgrade, ticket 412" in page.locator("#drain-preview").inner_text()
    page.click("#confirm-drain")
    page.wait_for_selector("[data-status]:text('draining')")
    assert page.locator("[data-drain-reason]").inner_text() == "kernel upgrade, ticket 412"
    page.goto(console.url + "/audit/?action=node.drain")
    row = page.locator('tr[data-action="node.drain"]').first
    # The action in words, its code the tooltip (issue 46, item 5).
    assert re.search(r"otto.*node: drain.*morpheus.*kernel upgrade, ticket 412", row.inner_text(), re.S)
    assert row.locator("[data-code]").get_attribute("title") == "node.drain"


def mib_of(text: str) -> float:
    """ "3,072 MiB" or "10.0 GiB" in MiB."""
    value, unit = text.replace(",", "").split()
    return float(value) * (1024 if unit == "GiB" else 1)


def committed_and_allocatable_mib(text: str) -> tuple[float, float]:
    """ "3,072 / 10,240 MiB" or "3.0 / 10.0 GiB" (both in the unit written last) in MiB."""
    part, whole = text.split(" / ")
    unit = whole.split()[1]
    return mib_of(f"{part} {unit}"), mib_of(whole)


def test_the_board_reads_allocatable_and_committed_as_the_node_api_does_and_follows_a_new_lease(
    page, console
):
    def figures() -> dict[str, dict]:
        listed = console.api("GET", "/api/nodes/?page_size=100", console.operator_token)["results"]
        return {n["name"]: n for n in listed}

    page.goto(console.url + "/")
    wait_live(page)
    page.evaluate("window.notReloaded = true")
    before = figures()
    body = {
        "name": "figures",
        "type": "immediate",
        "duration_s": 3600,
        "nodes": [{"cpu_cores": 3, "mem_mib": 3072}],
    }
    console.api("POST", "/api/leases", console.operator_token, body)
    after = figures()
    (host,) = [
        n for n in after if after[n]["committed"]["mem_mib"] == before[n]["committed"]["mem_mib"] + 3072
    ]
    cores = after[host]["committed"]["cpu_cores"], after[host]["allocatable"]["cpu_cores"]
    # The live update re-renders the row: the host's committed cores change with no reload.
    page.wait_for_selector(
        f'tr[data-node="{host}"] [data-cores]:text-is("{cores[0]:g} / {cores[1]:g} cores")'
    )
    assert page.evaluate("window.notReloaded") is True
    for name, node in after.items():
        row = page.locator(f'tr[data-node="{name}"]')
        allocatable_cores, allocatable_mem = row.locator("[data-allocatable]").inner_text().split(" · ")
        assert allocatable_cores == f"{node['allocatable']['cpu_cores']:g} cores"
        assert abs(mib_of(allocatable_mem) - node["allocatable"]["mem_mib"]) <= 51, (name, allocatable_mem)
        committed, allocatable = committed_and_allocatable_mib(row.locator("[data-mem]").inner_text())
        assert abs(committed - node["committed"]["mem_mib"]) <= 51, (name, committed)
        assert abs(allocatable - node["allocatable"]["mem_mib"]) <= 51, (name, allocatable)
        assert (row.locator("[data-over-allocatable]").count() == 1) is node["over_allocatable"]
