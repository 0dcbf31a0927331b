"""A lease's placement report as a person reads it in a real headless Chromium against a real Daphne (issue 11):
a rejected lease's "why not" table gives every node a verdict of unfit with its reason, and a placed lease's table
marks the nodes it runs on as chosen.

The console of tests/console/live.py: three nodes of 8 cores and 16 GiB declared (tank has a GPU), each heartbeated
idle at 2 GiB, so each allocates 16,384 - 4,096 - 2,048 = 10,240 MiB. The leases here would fit what the declared
totals leave but not what allocatable capacity leaves, and the reports must say which. Each test cancels what it placed.
"""

from __future__ import annotations

import json
import urllib.error

import pytest

from tests.console import live

pytestmark = live.BROWSER_TEST

ALLOCATABLE_MIB = 16384 - 4096 - 2048


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with live.running(tmp_path_factory.mktemp("console-reports")) as server:
        yield server


@pytest.fixture(scope="module")
def operator(browser, console):
    context = live.sign_in(browser, console, "otto", live.PASSWORD)
    yield context
    context.close()


@pytest.fixture
def page(operator, request):
    return live.new_page(operator, request)


def submit(console, body: dict) -> tuple[int, int]:
    """POST /api/leases as the operator: (HTTP status, lease id), a 409 rejection included."""
    try:
        lease = console.api("POST", "/api/leases", console.operator_token, body)
        return 201, lease["id"]
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
        return 409, json.loads(exc.read())["lease"]


def node_names(console) -> dict[int, str]:
    return {n["id"]: name for name, n in console.nodes.items()}


def report_rows(page):
    """The verdict rows of the lease's newest placement report (open at the top of its page)."""
    table = page.locator("details.report[open] table[data-verdicts]").first
    table.wait_for()
    return table.locator("tbody tr")


def test_a_rejected_lease_shows_every_node_unfit_with_its_reason(page, console):
    # A 6 GiB GPU VM keeps tank busy; a second one fits what tank has left of its 16 GiB declared (10 GiB), not of
    # its 10 GiB allocatable (4 GiB); the other nodes have no GPU.
    gpu_vm = {"cpu_cores": 1, "mem_mib": 6144, "disk_gib": 10}
    status, busy = submit(console, {"name": "gpu-busy", "type": "immediate", "duration_s": 1800,
                                    "capabilities": ["gpu"], "nodes": [gpu_vm]})  # fmt: skip
    assert status == 201
    try:
        status, lease_id = submit(console, {"name": "why-not", "type": "immediate", "duration_s": 1800,
                                            "capabilities": ["gpu"], "nodes": [gpu_vm]})  # fmt: skip
        assert status == 409

        page.goto(f"{console.url}/leases/{lease_id}/")
        assert page.locator("#lease-body [data-state]").inner_text() == "rejected"
        assert page.locator("details.report[open] summary .badge").inner_text() == "rejected"
        assert "Why not" in page.locator("details.report[open] table[data-verdicts] thead").inner_text()
        rows = report_rows(page)
        assert rows.count() == len(console.nodes)
        seen = {}
        for i in range(rows.count()):
            row = rows.nth(i)
            cells = row.locator("td")
            node = row.get_attribute("data-node")
            assert row.get_attribute("class") == "unfit", node
            assert row.locator("[data-chosen]").count() == 0, node
            verdict = cells.nth(1).inner_text()
            assert verdict.startswith("✘"), f"{node}: {verdict!r}"
            assert "fit" not in verdict and "_" not in verdict, (
                f"{node}: {verdict!r} (codes are said in words)"
            )
            code = cells.nth(1).locator("[data-code]").get_attribute("data-code")
            reason = cells.nth(2).inner_text().strip()
            assert code and reason, f"{node}: code {code!r}, reason {reason!r}"
            assert cells.nth(3).inner_text().strip() == "0", f"{node} holds {cells.nth(3).inner_text()!r}"
            seen[node] = (code, reason)
        assert set(seen) == set(console.nodes)
        # Tank is busy now, in the user's units: 4 GiB free of 10 GiB allocatable, and who holds the rest.
        assert seen["tank"][0] == "at_capacity", seen["tank"]
        assert f"{ALLOCATABLE_MIB // 1024} GiB allocatable" in seen["tank"][1]
        assert "4 GiB" in seen["tank"][1] and "6 GiB" in seen["tank"][1]
        assert seen["architect"][0] == seen["morpheus"][0] == "missing_capability"
        assert "gpu" in seen["architect"][1]
    finally:
        console.api("POST", f"/api/leases/{busy}/cancel", console.operator_token, {"reason": "test done"})


def test_a_placed_lease_marks_the_nodes_it_runs_on_as_chosen(page, console):
    # Two VMs of 6 GiB: each node allocates one of them (two fit 16 GiB declared), so the lease spans two nodes.
    body = {"name": "chosen-rows", "type": "immediate", "duration_s": 1800,
            "nodes": [{"cpu_cores": 1, "mem_mib": 6144, "disk_gib": 10}] * 2}  # fmt: skip
    status, lease_id = submit(console, body)
    assert status == 201
    try:
        lease = console.api("GET", f"/api/leases/{lease_id}", console.operator_token)
        names = node_names(console)
        runs_on = {names[n] for r in lease["reservations"] for n in r["nodes"].values()}
        assert len(runs_on) == 2

        page.goto(f"{console.url}/leases/{lease_id}/")
        assert page.locator("details.report[open] summary .badge").inner_text() == "placed"
        rows = report_rows(page)
        assert rows.count() == len(console.nodes)
        chosen = page.locator("details.report[open] table[data-verdicts] tbody tr:has([data-chosen])")
        assert {chosen.nth(i).get_attribute("data-node") for i in range(chosen.count())} == runs_on
        for i in range(chosen.count()):
            row = chosen.nth(i)
            assert row.locator("[data-chosen]").inner_text() == "★ chosen"
            assert row.get_attribute("class") == "fit"
            assert row.locator("td").nth(3).inner_text().strip() == "1"  # holds one of its two VMs
        # The chosen rows lead the table; the third node could have taken one VM too: fit, but not chosen.
        assert {rows.nth(i).get_attribute("data-node") for i in range(2)} == runs_on
        (other,) = set(console.nodes) - runs_on
        other_row = page.locator(f'details.report[open] tr[data-node="{other}"]')
        assert other_row.locator("[data-chosen]").count() == 0
        assert other_row.locator("td").nth(1).inner_text().startswith("✔ fit")
    finally:
        console.api("POST", f"/api/leases/{lease_id}/cancel", console.operator_token, {"reason": "test done"})
