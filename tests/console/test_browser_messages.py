"""Messages an operator can read (issue 13, item 3), in a real headless Chromium against a real Daphne: the result of
a bulk approval is a table with one row per instance, each row saying either where it went or why it did not move
(never a node name beside a bare reason code), and no text on the result, list or instance page runs longer than a
few lines; the placer's verdict per node is behind a disclosure, one line a node.

The console of tests/console/live.py: tank, architect and morpheus, 8 cores and 16 GiB declared, each heartbeated idle
at 2 GiB, so each allocates 16,384 - 4,096 - 2,048 = 10,240 MiB. Two immediate leases of one 6 GiB VM land on two
nodes (two do not fit in one); an admin declares both nodes dead; the first proposal names the last node, which holds
one of them and not two, and the second, counting the first, names none (at capacity). Approved together, the first
moves there and the second is still at capacity. Before the fix the result was one paragraph per instance of about
ten lines, and the list showed the second's old target ("→ morpheus") beside its new code ("at_capacity"). (Both
proposals used to name the last node; since proposals count each other, the second names none.)
"""

from __future__ import annotations

import pytest

from tests.console import live
from tests.console.test_browser_recovery import admin_token

pytestmark = live.BROWSER_TEST

ARTIFACTS = live.ARTIFACTS
VM = {"cpu_cores": 1, "mem_mib": 6144, "disk_gib": 5}
# The longest run of text allowed outside a disclosure, in rendered lines at 1,280 px. Before the fix a pending
# move's message took three lines with this three-node fleet (ten with the demo's twelve).
MAX_LINES = 2

# The number of line boxes of every text node under `root` shown without opening a disclosure: a wall of text is one
# node on many lines. (Chromium lays out a closed <details>' content for find-in-page, so it is skipped by hand.)
LINES_JS = """root => {
  const out = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent.trim();
    if (!text) continue;
    const closed = node.parentElement.closest("details:not([open])");
    if (closed && !node.parentElement.closest("summary")) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
    if (tops.size) out.push([tops.size, text.slice(0, 80)]);
  }
  return out;
}"""


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("messages")
    server = live.start(workdir)
    server.admin_token = admin_token(workdir)  # type: ignore[attr-defined]
    for name in server.nodes:
        server.heartbeat(name, used_mib=2048)
    yield server
    live.stop(server.process)


@pytest.fixture(scope="module")
def lost(console) -> dict:
    """Two instances lost with their nodes, the first proposed to the last node and the second to none (the last
    node holds one of them): {iid: (lease id, node it was on)}."""
    out = {}
    for name in ("render-a", "render-b"):
        body = {"name": name, "type": "immediate", "duration_s": 3600, "nodes": [VM]}
        lease = console.api("POST", "/api/leases", console.operator_token, body)
        [inst] = console.api("GET", f"/api/instances/?lease={lease['id']}", console.operator_token)["results"]
        out[inst["iid"]] = (lease["id"], inst["node_id"])
    dead = {node for _, node in out.values()}
    assert len(dead) == 2, "two 6 GiB VMs do not fit in one node's 10 GiB"
    for node_id in dead:
        console.api(
            "POST",
            f"/api/nodes/{node_id}/declare-dead",
            console.admin_token,
            {"reason": "PSU failed, ticket 88"},
        )
    return out


@pytest.fixture(scope="module")
def operator(browser, console):
    context = live.sign_in(browser, console, "otto", live.PASSWORD)
    yield context
    context.close()


@pytest.fixture
def page(operator, request):
    return live.new_page(operator, request)


def last_node(console, lost) -> str:
    dead = {node for _, node in lost.values()}
    (name,) = [name for name, n in console.nodes.items() if n["id"] not in dead]
    return name


def longest_text(page, selector: str) -> tuple[int, str]:
    runs = page.locator(selector).first.evaluate(LINES_JS)
    return max((tuple(r) for r in runs), default=(0, ""))


def test_a_bulk_approval_is_one_row_per_instance_with_its_target_or_its_reason(page, console, lost):
    survivor = last_node(console, lost)
    page.goto(console.url + "/reschedules/")
    page.wait_for_selector("#live-state.ok")
    page.click("#review-all")
    page.wait_for_selector("#confirm-approve")
    page.click("#confirm-approve")
    page.wait_for_selector("#reschedule-result")
    lines, text = longest_text(page, "#reschedule-result")
    assert lines <= MAX_LINES, f"{lines} lines: {text!r}"

    rows = page.locator("#reschedule-result table#result-list tbody tr[data-result]")
    assert rows.count() == len(lost) == 2
    assert {rows.nth(i).get_attribute("data-instance") for i in range(2)} == set(lost)
    kinds = sorted(rows.nth(i).get_attribute("data-result") for i in range(2))
    assert kinds == ["moved", "pending"], kinds
    assert "1 of 2 moved" in page.locator("#reschedule-result h3").inner_text()

    moved = page.locator('#result-list tr[data-result="moved"]')
    assert moved.locator("[data-target]").inner_text() == survivor
    assert moved.locator("[data-reason]").count() == 0, "a row that moved gives no reason code"
    assert f"placed on {survivor}" in moved.locator("[data-outcome]").inner_text()

    waiting = page.locator('#result-list tr[data-result="pending"]')
    assert waiting.locator("[data-target]").count() == 0, "a row that did not move names no target"
    assert waiting.locator("[data-reason]").get_attribute("data-reason") == "at_capacity"
    outcome = waiting.locator("[data-outcome]").inner_text()
    assert outcome.startswith("not placed: at capacity"), outcome
    assert "at_capacity" not in outcome, "codes are said in words"
    # Its proposal named no node (the survivor's room was the first proposal's), so no earlier target is mentioned.
    assert "proposed earlier" not in outcome

    # The detail, behind its disclosure: one line per node, each saying which verdict applies.
    why = waiting.locator("details[data-why]")
    assert not why.evaluate("d => d.open")
    why.locator("summary").click()
    verdicts = why.locator("li[data-node]")
    assert verdicts.count() == len(console.nodes)
    said = {verdicts.nth(i).get_attribute("data-node"): verdicts.nth(i).inner_text() for i in range(3)}
    assert "not here: at capacity" in said[survivor]
    assert all("not here: declared dead" in text for node, text in said.items() if node != survivor), said
    for i in range(verdicts.count()):
        box = verdicts.nth(i).bounding_box()
        line_h = verdicts.nth(i).evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
        assert box["height"] <= 2 * line_h + 1, f"{said} wraps past two lines"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "reschedule-result.png"), full_page=True)


def test_the_list_and_the_instance_page_say_which_applies_and_stay_short(page, console, lost):
    # Run alone, this test approves through the API what the test above approves from the console.
    pending = console.api("GET", "/api/reschedules/?status=pending", console.operator_token)["results"]
    if len(pending) == 2:
        ids = [p["id"] for p in pending]
        console.api("POST", "/api/reschedules/approve", console.operator_token, {"ids": ids})
    page.goto(console.url + "/reschedules/")
    page.wait_for_selector("#live-state.ok")
    [(iid, row)] = [
        (iid, page.locator(f'#reschedules tr[data-instance="{iid}"]'))
        for iid in lost
        if page.locator(f'#reschedules tr[data-instance="{iid}"]').count()
    ]
    cell = row.locator("[data-outcome]")
    assert cell.locator("[data-target]").count() == 0, cell.inner_text()
    assert cell.locator("[data-reason]").get_attribute("data-reason") == "at_capacity"
    assert cell.inner_text().startswith("not placed now: at capacity")
    assert "earlier proposal" not in cell.inner_text()  # it never named a node: see the module's docstring
    lines, text = longest_text(page, "#reschedule-table")
    assert lines <= MAX_LINES, f"{lines} lines: {text!r}"

    page.goto(f"{console.url}/instances/{iid}/")
    page.wait_for_selector("#instance-reschedules")
    lines, text = longest_text(page, "#instance-body")
    assert lines <= MAX_LINES, f"{lines} lines: {text!r}"
    message = page.locator("#instance-reschedules [data-headline]").first.inner_text()
    assert message.startswith("still pending: fleet at capacity"), message
    assert "6 GiB" in message and "6144" not in message, "memory in user units"


def test_times_inside_a_lease_message_follow_the_operators_zone(browser, console, lost):
    # The scheduler writes its times into the sentence ("runs 2026-11-30 15:40:54 UTC–… UTC on tank"); the page
    # marks them up as <time>, so the UTC / local switch reaches them like every other time on the page.
    lease_id, _ = next(iter(lost.values()))
    context = live.sign_in(browser, console, timezone_id="Asia/Tokyo")
    try:
        page = context.new_page()
        page.goto(f"{console.url}/leases/{lease_id}/")
        times = page.locator("#lease-body .lead [data-headline] time")
        assert times.count() == 2, page.locator("#lease-body .lead").inner_text()
        utc = times.first.inner_text()
        assert utc.endswith("UTC"), utc
        page.click("#tz-toggle")
        local = times.first.inner_text()
        assert local != utc and "UTC" not in local, (utc, local)
    finally:
        context.close()


def test_the_slot_table_s_window_names_the_zone_its_times_are_shown_in(browser, console):
    """Found by an outsider: switched to local time, the window under the slot table still said "UTC"."""
    context = live.sign_in(browser, console, timezone_id="America/New_York")
    try:
        page = context.new_page()
        page.goto(f"{console.url}/slots/")
        summary = page.locator("#slot-summary")
        utc = summary.inner_text()
        assert utc.endswith("UTC"), utc
        page.click("#tz-toggle")
        local = summary.inner_text()
        assert local.endswith("local time") and "UTC" not in local, (utc, local)
        page.click("#tz-toggle")
        assert summary.inner_text() == utc
    finally:
        context.close()
