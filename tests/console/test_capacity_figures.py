"""The capacity figures in the console (issue 11, item 3): the board, the node page and the slot table's row labels
show allocatable and committed now, the same figures as the node API, and flag a node whose running work exceeds
allocatable (resized under it), with a badge that says by how much. The board's cost does not grow with the fleet.

The fleet of tests/console/conftest.py: 4 cores and 8,192 MiB declared per node, heartbeating 1,000 MiB used, so
allocatable = 8,192 - 4,096 (host reserve) - 2,048 (the baseline floor) = 2,048 MiB, 4 cores, 80 GiB disk.
"""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from leases import actions as lease_actions
from tests.console.conftest import heartbeat, register, vm


def submit(cores=2, mem=1536, name="render"):
    spec = lease_actions.LeaseSpec(
        name=name, type="immediate", duration_s=3600, vnodes=[vm(cores=cores, mem=mem)]
    )
    lease = lease_actions.do_submit_lease(None, spec, now=timezone.now()).lease
    assert lease.state == "active", lease.message
    return lease


def host_of(lease) -> int:
    return int(next(iter(lease.reservations.get(kind="vm").nodes.values())))


def row_of(body: str, node_id: int) -> str:
    row = body[body.index(f'id="node-{node_id}"') :]
    return row[: row.index("</tr>")]


def cell(fragment: str, attribute: str) -> str:
    """The text of the first element carrying `attribute`, tags stripped and whitespace collapsed."""
    match = re.search(rf"<(\w+)[^>]*\s{attribute}(?=[\s=>])[^>]*>(.*?)</\1>", fragment, re.S)
    assert match, f"no element with {attribute}"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", match.group(2))).split())


def attribute_of(fragment: str, marker: str, name: str) -> str:
    """The value of attribute `name` on the first tag carrying `marker`."""
    tag = re.search(rf"<[^>]*\s{marker}(?=[\s=>])[^>]*>", fragment)
    assert tag, f"no tag with {marker}"
    value = re.search(rf'\b{name}="([^"]*)"', tag.group(0))
    assert value, f"no {name} on the tag with {marker}"
    return html.unescape(value.group(1))


@pytest.fixture
def running(fleet):
    """One immediate lease of 2 cores and 1,536 MiB running on one node of the fleet."""
    return submit()


def test_the_board_shows_declared_allocatable_and_committed_now_for_a_node_with_a_running_lease(
    vera, fleet, running
):
    body = vera.get(reverse("fleet-board")).content.decode()
    # Each header is the link that sorts by its column, with what it counts in small print.
    assert "Declared</a> <small>cores · memory</small>" in body
    assert "Allocatable</a> <small>cores · memory</small>" in body
    assert "Committed now</a> <small>/ allocatable</small>" in body
    host = row_of(body, host_of(running))
    assert cell(host, "data-declared") == "4 cores · 8,192 MiB"
    assert cell(host, "data-allocatable") == "4 cores · 2,048 MiB"
    assert cell(host, "data-mem") == "1,536 / 2,048 MiB"
    assert cell(host, "data-cores") == "2 / 4 cores"
    assert attribute_of(host, "data-committed-pct", "data-committed-pct") == "75.0"
    assert "data-over-allocatable" not in host
    idle = row_of(body, next(n.pk for n in fleet if n.pk != host_of(running)))
    assert (cell(idle, "data-mem"), cell(idle, "data-cores")) == ("0 / 2,048 MiB", "0 / 4 cores")
    # The totals over the three online nodes.
    assert cell(body, 'data-capacity="allocatable"') == "6.0 GiB"
    assert cell(body, 'data-capacity="committed"') == "1.5 GiB"


def test_the_board_and_the_node_page_show_the_node_apis_figures(vera, fleet, running):
    node_id = host_of(running)
    api = vera.get(f"/api/nodes/{node_id}/").json()
    allocatable, committed = api["allocatable"], api["committed"]
    board = row_of(vera.get(reverse("fleet-board")).content.decode(), node_id)
    page = vera.get(reverse("node-detail", args=[node_id])).content.decode()
    for shown in (board, page):
        assert cell(shown, "data-mem") == f"{committed['mem_mib']:,} / {allocatable['mem_mib']:,} MiB"
        assert cell(shown, "data-cores") == f"{committed['cpu_cores']:g} / {allocatable['cpu_cores']:g} cores"


def test_the_node_page_shows_allocatable_committed_and_free_now(vera, running):
    body = vera.get(reverse("node-detail", args=[host_of(running)])).content.decode()
    assert cell(body, "data-declared") == "4 cores · 8,192 MiB · 100 GiB disk"
    assert cell(body, "data-allocatable").startswith("4 cores · 2,048 MiB · 80 GiB disk")
    assert (cell(body, "data-mem"), cell(body, "data-cores")) == ("1,536 / 2,048 MiB", "2 / 4 cores")
    assert cell(body, "data-free") == "2 cores · 512 MiB · 80 GiB disk"
    assert cell(body, "data-baseline") == "1,000 MiB measured idle: the 2,048 MiB floor counts"


def test_the_slot_tables_row_label_carries_the_figures(vera, fleet, running):
    body = vera.get(reverse("slot-table")).content.decode()
    host = next(n for n in fleet if n.pk == host_of(running))
    row = body[body.index(f'data-node="{host.name}"') :]
    row = row[: row.index("</g>")]
    title = html.unescape(re.search(r"<title>(.*?)</title>", row).group(1))
    assert "committed now 1,536 / 2,048 MiB, 2 / 4 cores (of allocatable)" in title, title
    assert "data-over-allocatable" not in row


def test_a_node_resized_under_its_running_work_is_flagged_over_allocatable_everywhere(
    vera, ada, fleet, running
):
    node_id = host_of(running)
    # 1,024 MiB less declared: allocatable 1,024 MiB under the 1,536 MiB the running lease holds.
    response = ada.patch(f"/api/nodes/{node_id}/", {"mem_total_mib": 7168}, content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["over_allocatable"] is True
    running.refresh_from_db()
    assert running.state == "active", "running work is flagged, never killed"

    board = vera.get(reverse("fleet-board")).content.decode()
    row = row_of(board, node_id)
    assert cell(row, "data-mem") == "1,536 / 1,024 MiB"
    assert cell(row, "data-over-allocatable") == "over allocatable"
    assert "by 512 MiB memory" in attribute_of(row, "data-over-allocatable", "title")
    assert 'class="capbar over"' in row
    assert cell(board, 'data-capacity="over"') == "1 over allocatable"
    others = [row_of(board, n.pk) for n in fleet if n.pk != node_id]
    assert not any("data-over-allocatable" in r for r in others)

    page = vera.get(reverse("node-detail", args=[node_id])).content.decode()
    assert cell(page, "data-over-allocatable") == "over allocatable"
    assert "by 512 MiB memory" in attribute_of(page, "data-over-allocatable", "title")
    assert cell(page, "data-free") == "2 cores · -512 MiB · 80 GiB disk"

    slots = vera.get(reverse("slot-table")).content.decode()
    host = next(n for n in fleet if n.pk == node_id)
    label = slots[slots.index(f'data-node="{host.name}"') :]
    label = label[: label.index("</g>")]
    assert "over allocatable: committed now exceeds allocatable by 512 MiB memory" in label
    assert "▲ over" in label


def test_the_live_fragment_of_the_board_carries_the_figures_and_the_totals(vera, running):
    body = vera.get(reverse("fleet-board"), headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in body
    assert cell(row_of(body, host_of(running)), "data-mem") == "1,536 / 2,048 MiB"
    assert 'id="fleet-capacity"' in body and cell(body, 'data-capacity="committed"') == "1.5 GiB"


def grow_fleet(total: int) -> None:
    """Registers and heartbeats nodes up to `total`, then fills every node with one lease of all its allocatable
    memory (2,048 MiB), so each row has a committed figure to show."""
    from fleet.models import Node
    from leases.models import Lease

    for i in range(Node.objects.count(), total):
        heartbeat(register(f"extra-{i:02d}"))
    for i in range(Lease.objects.count(), total):
        submit(cores=1, mem=2048, name=f"job-{i}")


def queries_for(client, url: str, **kwargs) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, **kwargs)
    assert response.status_code == 200
    return len(captured)


@pytest.mark.parametrize("htmx", [False, True])
@pytest.mark.parametrize("page", ["fleet-board", "slot-table"])
def test_the_figures_cost_the_same_queries_for_5_nodes_as_for_20(vera, fleet, page, htmx):
    headers = {"HX-Request": "true"} if htmx else {}
    grow_fleet(5)
    vera.get(reverse(page), headers=headers)  # the session and the user are cached alike in both counts
    at_5 = queries_for(vera, reverse(page), headers=headers)
    grow_fleet(20)
    at_20 = queries_for(vera, reverse(page), headers=headers)
    assert at_20 == at_5, f"{page}: {at_5} queries at 5 nodes, {at_20} at 20"
    body = vera.get(reverse(page), headers=headers).content.decode()
    if page == "fleet-board":
        assert body.count("data-mem>2,048 / 2,048 MiB<") == 20, (
            "every node's running lease shows as committed"
        )
    else:
        assert len(re.findall(r"<title>[^<]*committed now 2,048 / 2,048 MiB", body)) == 20
