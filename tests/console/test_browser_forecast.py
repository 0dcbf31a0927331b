"""The queue forecast in a real headless Chromium against a real Daphne: a queued lease's estimated run on the lease
list (and on its page and the slot table, drawn apart from the reservations), and the reason a lease that can never
fit has none. Skipped only when Debian's chromium is not installed."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.console import live

pytestmark = live.BROWSER_TEST

WHOLE = {
    "cpu_cores": 1,
    "mem_mib": 10240,
    "disk_gib": 0,
}  # a node's whole allocatable memory (16 GiB declared)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with live.running(tmp_path_factory.mktemp("console-forecast")) as server:
        yield server


@pytest.fixture(scope="module")
def operator(browser, console):
    context = live.sign_in(browser, console, "otto", live.PASSWORD)
    yield context
    context.close()


def lease(console, name: str, duration_s: int, vms: int, **extra) -> dict:
    body = {"name": name, "type": "best_effort", "duration_s": duration_s, "nodes": [WHOLE] * vms, **extra}
    return console.api("POST", "/api/leases/", console.operator_token, body)


def moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_the_lease_list_says_when_a_queued_lease_will_run(operator, console, request):
    token = console.operator_token
    lease(console, "blocker", 1800, 3, type="immediate")  # all three nodes for 30 min
    nxt = lease(console, "next", 600, 1)  # aggressive backfilling's one future reservation, after the blocker
    wide = lease(console, "wide", 300, 3)  # needs all three nodes: waits for `next` to end as well
    assert (nxt["state"], wide["state"]) == ("ready", "queued")
    [vm] = [
        r for r in console.api("GET", f"/api/leases/{nxt['id']}/", token)["reservations"] if r["kind"] == "vm"
    ]
    estimated = console.api("GET", f"/api/leases/{wide['id']}/", token)
    assert moment(estimated["estimated_start"]) == moment(vm["end"])

    page = live.new_page(operator, request)
    page.goto(console.url + "/leases/")
    cell = page.locator(f"#lease-table tr[data-lease='{wide['id']}'] [data-estimate]")
    assert "estimated" in cell.inner_text()
    shown = cell.locator("time").first.get_attribute("datetime")
    assert moment(shown) == moment(estimated["estimated_start"])

    page.goto(f"{console.url}/leases/{wide['id']}/")
    assert "estimated" in page.locator("#lease-body [data-estimate]").inner_text()

    # On the slot table the estimate is its own row below the nodes, hatched and labelled, never on a node's row.
    page.goto(console.url + "/slots/?zoom=24h")
    bar = page.locator(f"#slot-estimates [data-lease='{wide['id']}'] .bar.estimated")
    assert bar.count() == 1
    assert "estimated" in (bar.locator("title").text_content() or "")
    # Drawn: the bar and its row's stripe have a height (both were height="", invisible, an SVG error logged).
    assert float(bar.locator("rect").get_attribute("height") or 0) > 0
    box = bar.locator("rect").bounding_box()
    assert box is not None and box["height"] > 0
    stripe = page.locator(f"#slot-estimates [data-lease='{wide['id']}'] rect.stripe")
    assert float(stripe.get_attribute("height") or 0) > 0
    assert page.locator(f"#slot-table g.row[role=row] [data-lease='{wide['id']}']").count() == 0

    # Only tank has a gpu, and it is draining: a gpu lease waits (it could run once tank is back), with no
    # estimate and the reason. (A capability no node has is refused outright: tests/leases/test_placer_word.py.)
    tank = console.nodes["tank"]
    console.api("POST", f"/api/nodes/{tank['id']}/drain", token, {"reason": "forecast test"})
    never = lease(console, "never", 300, 1, capabilities=["gpu"])
    assert never["state"] == "queued"
    page.goto(console.url + "/leases/")
    note = page.locator(f"#lease-table tr[data-lease='{never['id']}'] [data-estimate]").inner_text()
    assert note == "no estimate: no usable node: 2 lack a capability, 1 draining"
    # The code stays, as the tooltip: the API returns it (estimate_note).
    cell = page.locator(f"#lease-table tr[data-lease='{never['id']}'] [data-estimate] [title]")
    assert cell.get_attribute("title") == "no usable node: 2 missing_capability, 1 draining"
