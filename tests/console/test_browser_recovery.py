"""Node-loss recovery in a real headless Chromium against a real Daphne: two instances are lost when an admin declares
their node dead through the API, an operator selects both proposals on /reschedules/, confirms once, reads one
result line per instance, and finds both approvals in the audit feed.

Screenshots of failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from tests.console import live

ARTIFACTS = live.ARTIFACTS

pytestmark = live.BROWSER_TEST


def admin_token(workdir) -> str:
    """An admin's API token in the running console's database: only an admin may declare a node dead."""
    out = subprocess.run(
        [sys.executable, str(live.ROOT / "manage.py"), "issue_token", "ada", "--role", "admin"],
        env=live.environment(workdir / "console.sqlite3"),
        cwd=live.ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("recovery")
    server = live.start(workdir)
    server.admin_token = admin_token(workdir)  # type: ignore[attr-defined]
    yield server
    live.stop(server.process)


@pytest.fixture
def page(browser, console, request):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto(console.url + "/login/")
    page.fill("input[name=username]", "otto")
    page.fill("input[name=password]", live.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(console.url + "/")
    yield page
    live.screenshot_on_failure(page, request)
    context.close()


def lose_two_instances(console) -> list[str]:
    """A fourth node registered through the API, every node heartbeating, two immediate leases, and the node(s)
    holding them declared dead by an admin: two lost instances, two pending proposals. Returns their ids."""
    body = {"name": "zion", "cpu_cores": 8, "mem_total_mib": 16384, "disk_total_gib": 200}
    zion = console.api("POST", "/api/nodes/", console.operator_token, body)
    console.nodes["zion"] = {"id": zion["id"], "token": zion["token"]}
    for name in console.nodes:
        console.heartbeat(name, used_mib=2048)
    lost = []
    for name in ("render-a", "render-b"):
        lease = console.api(
            "POST",
            "/api/leases",
            console.operator_token,
            {
                "name": name,
                "type": "immediate",
                "duration_s": 3600,
                "nodes": [{"cpu_cores": 1, "mem_mib": 2048}],
            },
        )
        [inst] = console.api("GET", f"/api/instances/?lease={lease['id']}", console.operator_token)["results"]
        lost.append(inst)
    for node_id in {inst["node_id"] for inst in lost}:
        console.api(
            "POST",
            f"/api/nodes/{node_id}/declare-dead",
            console.admin_token,
            {"reason": "PSU failed, ticket 88"},
        )
    return [inst["iid"] for inst in lost]


def refresh_sent_before_the_ticks(page) -> None:
    """A live refresh of the list whose request left before the operator ticked the boxes (so its rows come back
    unticked), morphed in after the ticks: what a busy fleet's events do now and then. The request is rewritten on
    its way out without the ticked ids it carries (hx-include), which makes that race happen every time, and its
    answer marked as a later render than the one on screen (console.js swaps nothing for the same bytes)."""

    def unticked(route):
        parts = urlsplit(route.request.url)
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "id"])
        answer = route.fetch(url=urlunsplit(parts._replace(query=query)))
        route.fulfill(response=answer, body=answer.text().replace("</table>", "</table><!-- later -->", 1))

    page.route(re.compile(r"/reschedules/\?"), unticked)
    page.evaluate(
        "window.__settled = false;"
        "document.body.addEventListener('htmx:afterSettle', () => { window.__settled = true; }, {once: true});"
        "document.body.dispatchEvent(new CustomEvent('reschedule-changed'))"
    )
    page.wait_for_function("window.__settled")
    page.unroute(re.compile(r"/reschedules/\?"))


def test_approve_two_reschedules_in_bulk(page, console):
    iids = lose_two_instances(console)
    page.goto(console.url + "/reschedules/")
    page.wait_for_selector("#live-state.ok")
    for iid in iids:
        page.check(f'tr[data-instance="{iid}"] input[name=id]')
    assert page.locator("#pending-count").inner_text() == "2"
    refresh_sent_before_the_ticks(page)
    assert all(page.is_checked(f'tr[data-instance="{iid}"] input[name=id]') for iid in iids), (
        "a live refresh asked before the boxes were ticked kept the operator's ticks"
    )
    page.click("#review-selected")
    page.wait_for_selector("#confirm-approve")
    confirmation = page.locator("#confirm-list").inner_text()
    assert all(iid in confirmation for iid in iids) and confirmation.count("→") == 2
    page.click("#confirm-approve")
    page.wait_for_selector("#reschedule-result")
    lines = page.locator("#reschedule-result tr[data-result]")
    assert lines.count() == 2
    assert [lines.nth(i).get_attribute("data-result") for i in range(2)] == ["moved", "moved"]
    assert "2 of 2 moved" in page.locator("#reschedule-result h3").inner_text()
    # The live list drops the applied proposals and the nav count follows, with no reload.
    page.wait_for_selector("#reschedules tr[data-reschedule]", state="detached")
    page.wait_for_selector("#pending-count:empty", state="attached")
    page.goto(console.url + "/audit/?action=reschedule.approve")
    rows = page.locator('tr[data-action="reschedule.approve"]')
    assert rows.count() == 2
    assert all("otto" in rows.nth(i).inner_text() for i in range(2))
