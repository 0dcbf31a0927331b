"""The fleet board at fleet scale (issue 46, items 1 and 2): a page of rows filtered, sorted and paged in the database
with the node list's FilterSet, status chips and capacity totals for the whole fleet from aggregates, every bit of
its state in the URL, a clear answer for a URL it cannot read, and the live patch that sends only the rows of the
page that changed."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fleet import nodestate
from fleet.filters import allocatable_mem
from fleet.models import Node, NodeStatus
from fleet.views import CapacityTotals, node_rows
from leases import reads as lease_reads
from leases.models import Allocation, Lease, Reservation
from tests.console.conftest import heartbeat

BOARD = reverse("fleet-board")
PATCH = reverse("fleet-board-patch")


def names(body: str) -> list[str]:
    """The nodes' names in the order the rows show them."""
    return re.findall(r'<tr id="node-\d+" data-key="\d+" data-node="([^"]+)"', body)


def shown(body: str) -> str:
    """What a live page says it shows: each row's key and version, in order (console.js sends the same)."""
    return ",".join(f"{k}.{v}" for k, v in re.findall(r'data-key="(\w+)"[^>]*data-v="(\w+)"', body))


def version_of(body: str, element_id: str) -> str:
    return re.search(rf'id="{element_id}" [^>]*data-v="(\w+)"', body).group(1)


def make_fleet(count: int, *, now=None, **fields) -> list[Node]:
    """`count` heartbeating nodes named n-000, n-001, ... of 16 cores and 64 GiB (bulk-created: the board must not
    care how a node came to be)."""
    now = now or timezone.now()
    nodes = [
        Node(
            name=f"n-{i:03d}",
            cpu_cores=16,
            mem_total_mib=65536,
            disk_total_gib=500,
            status=NodeStatus.ONLINE,
            last_heartbeat_at=now - timedelta(seconds=i),
            obs_mem_total_mib=65536,
            obs_mem_used_mib=1000 + 100 * i,
            token_digest=f"{i:064d}",
            **fields,
        )
        for i in range(count)
    ]
    return Node.objects.bulk_create(nodes)


def hold(node: Node, *, mem_mib: int, cpu: int = 100, now=None) -> None:
    """What the slot table holds on `node` now: one running lease's allocation."""
    now = now or timezone.now()
    lease = Lease.objects.create(
        name=f"on-{node.name}", type="immediate", state="active", submitted_at=now, duration_s=3600,
        vnodes=[{"cpu_cores": cpu / 100, "mem_mib": mem_mib, "disk_gib": 0}],
    )  # fmt: skip
    res = Reservation.objects.create(
        rid=lease.pk, lease=lease, kind="vm", start=now - timedelta(minutes=5), end=now + timedelta(hours=1),
        status="active", nodes={"1": node.pk},
    )  # fmt: skip
    Allocation.objects.create(
        reservation=res, node=node, start=res.start, end=res.end, cpu=cpu, mem_mib=mem_mib
    )


# -- paging, sorting, filtering -----------------------------------------------------------------------------------


def test_the_board_shows_a_page_of_100_rows_and_says_where_it_is(vera, db):
    make_fleet(250)
    body = vera.get(BOARD).content.decode()
    assert names(body) == [f"n-{i:03d}" for i in range(100)]
    assert "Nodes 1–100 of 250" in body and "page 1 of 3" in body
    assert 'data-total="all">all 250<' in body, "the chips count the whole fleet"

    last = vera.get(BOARD, {"page": "3"}).content.decode()
    assert names(last) == [f"n-{i:03d}" for i in range(200, 250)]
    assert "Nodes 201–250 of 250" in last and 'rel="next"' not in last and 'rel="prev"' in last

    small = vera.get(BOARD, {"per": "25", "page": "2"}).content.decode()
    assert names(small) == [f"n-{i:03d}" for i in range(25, 50)]
    assert 'href="/?page=3&amp;per=25"' in small, "the next page keeps the page size"


@pytest.mark.parametrize(
    ("sort", "first"),
    [
        ("name", ["n-000", "n-001", "n-002"]),
        ("-name", ["never", "n-009", "n-008"]),
        ("age", ["n-000", "n-001", "n-002"]),  # the freshest heartbeat first
        ("-age", ["never", "n-009", "n-008"]),  # "never" is the oldest of all
        ("observed", ["n-003", "n-000", "n-001"]),  # of declared: n-003 declares twice as much
        ("-observed", ["n-009", "n-008", "n-007"]),
        ("-committed", ["n-005", "n-002", "n-000"]),
        ("status", ["n-000", "n-001", "n-002"]),
        ("-status", ["never", "n-004", "n-000"]),
        ("-declared", ["n-003", "n-000", "n-001"]),
        ("allocatable", ["n-003", "n-000", "n-001"]),  # n-003's baseline leaves it the least
        ("-drain", ["n-004", "n-000", "n-001"]),
        ("capabilities", ["n-001", "n-000", "n-002"]),
        ("-capabilities", ["n-000", "n-002", "n-003"]),
    ],
)
def test_every_column_sorts_in_the_database_either_way(vera, db, sort, first):
    nodes = make_fleet(10)
    Node.objects.filter(pk=nodes[1].pk).update(capabilities=["gpu"])
    Node.objects.filter(pk=nodes[3].pk).update(
        cpu_cores=64, mem_total_mib=65536 * 2, idle_baseline_mib=140000
    )
    Node.objects.filter(pk=nodes[4].pk).update(
        status=NodeStatus.DRAINING, drain_reason="disk swap", drained_at=timezone.now()
    )
    Node.objects.create(name="never", cpu_cores=16, mem_total_mib=65536, disk_total_gib=500, token_digest="x" * 64,
                        status=NodeStatus.OFFLINE)  # fmt: skip
    hold(nodes[5], mem_mib=40000)
    hold(nodes[2], mem_mib=20000)
    hold(nodes[0], mem_mib=10000)
    response = vera.get(BOARD, {"sort": sort})
    assert response.status_code == 200
    assert names(response.content.decode())[:3] == first


def test_a_header_sorts_by_its_column_and_a_second_click_reverses_it(vera, db):
    make_fleet(3)
    body = vera.get(BOARD).content.decode()
    assert re.search(r'<th scope="col" aria-sort="ascending"><a href="/\?sort=-name"', body)
    assert 'href="/?sort=committed"' in body
    by_committed = vera.get(BOARD, {"sort": "committed", "page": "1"}).content.decode()
    assert re.search(r'aria-sort="ascending"><a href="/\?sort=-committed"', by_committed)


def test_search_finds_a_name_or_a_capability_and_status_narrows_it(vera, db):
    nodes = make_fleet(5)
    Node.objects.filter(pk=nodes[3].pk).update(capabilities=["gpu", "backend:claude"])
    Node.objects.filter(pk=nodes[4].pk).update(status=NodeStatus.OFFLINE)
    assert names(vera.get(BOARD, {"q": "N-00"}).content.decode()) == [n.name for n in nodes]
    assert names(vera.get(BOARD, {"q": "claude"}).content.decode()) == ["n-003"]
    assert names(vera.get(BOARD, {"status": "offline"}).content.decode()) == ["n-004"]
    assert names(vera.get(BOARD, {"status": "offline,online", "q": "gpu"}).content.decode()) == ["n-003"]
    body = vera.get(BOARD, {"q": "-00", "status": "offline"}).content.decode()
    assert names(body) == ["n-004"] and "1 node matching" not in body and "Nodes 1–1 of 1 matching" in body
    # The chips count the whole fleet, and keep the search.
    assert 'data-total="online">online <strong>4</strong>' in body
    assert 'href="/?q=-00&amp;status=online"' in body
    # Capability characters only: a quote or a comma would match the stored list's own punctuation.
    assert names(vera.get(BOARD, {"q": '","'}).content.decode()) == []


def test_the_filter_form_carries_the_sort_and_keeps_the_page_size(vera, db):
    make_fleet(3)
    body = vera.get(BOARD, {"sort": "-age", "per": "50", "q": "n-"}).content.decode()
    assert '<input type="hidden" name="sort" value="-age" form="board-filters">' in body
    assert '<option value="50" selected>50 a page</option>' in body
    assert 'value="n-"' in body
    assert f'data-patch="{PATCH}?q=n-&amp;sort=-age&amp;per=50"' in body


def test_a_page_past_the_end_says_so_and_links_to_the_last_page(vera, db):
    make_fleet(120)
    response = vera.get(BOARD, {"page": "9"})
    assert response.status_code == 200
    body = response.content.decode()
    assert "There is no page 9: 120 nodes match, 2 pages of 100." in body
    assert '<a href="/?page=2">Go to page 2</a>' in body
    assert 'rel="prev"' in body and 'href="/?page=2" hx-get="/?page=2" hx-target="#fleet-table"' in body
    assert 'rel="next"' not in body


def test_an_empty_search_says_no_node_matches(vera, db):
    make_fleet(2)
    assert "No nodes match these filters." in vera.get(BOARD, {"q": "nothing-like-it"}).content.decode()


# -- a URL the board cannot read ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"page": "abc"}, 'Page: "abc" is not a page number; pages count from 1.'),
        ({"page": "0"}, 'Page: "0" is not a page number'),
        ({"page": "²"}, "is not a page number"),
        ({"page": "9" * 5000}, "is not a page number"),
        ({"per": "1000"}, 'Nodes a page: "1000" is not a page size; a whole number of nodes from 1 to 200.'),
        ({"per": "-5"}, "a whole number of nodes from 1 to 200"),
        ({"sort": "unknown"}, 'Sort: Cannot sort by "unknown": one of name, status, age, declared, allocatable, '
                              "committed, observed, capabilities, drain"),
        ({"sort": "--name"}, 'Cannot sort by "--name"'),
        ({"status": "busy"}, 'Status: "busy" is not a status; one of online, draining, offline, dead'),
        ({"q": "x" * 101}, "Search: A search is at most 100 characters (this one has 101)."),
    ],
)  # fmt: skip
def test_a_value_the_board_cannot_read_is_a_400_that_names_it_and_shows_the_board_without_it(
    vera, db, query, said
):
    make_fleet(3)
    response = vera.get(BOARD, {**query, "q": query.get("q", "n-")})
    assert response.status_code == 400
    body = response.content.decode()
    assert 'role="alert" id="board-problems"' in body
    assert said.replace('"', "&quot;") in body
    assert names(body) == ["n-000", "n-001", "n-002"] or "q" in query, "the rest of the URL still counts"
    # The patch of a live page with such a URL is refused the same way (the page then refetches its table).
    patch = vera.get(PATCH, query)
    assert patch.status_code == 400 and said.split(": ")[-1][:20] in patch.content.decode()


def test_hostile_patch_versions_are_never_a_500(vera, db):
    make_fleet(3)
    for have in ["²", "1." + "f" * 500, ",,,", "none.x,none.y", "9" * 5000 + ".1", "1.2." * 1000]:
        response = vera.get(PATCH, {"have": have, "sv": "x" * 3000})
        assert response.status_code == 200, have
        assert names(response.content.decode()) == ["n-000", "n-001", "n-002"]


# -- who may see it ------------------------------------------------------------------------------------------------


def test_the_patch_needs_a_signed_in_user_with_a_role(client, db):
    make_fleet(1)
    assert client.get(PATCH)["Location"].startswith("/login/")
    nobody = Client()
    nobody.force_login(get_user_model().objects.create_user(username="nobody", password="x"))
    assert nobody.get(PATCH).status_code == 403
    assert nobody.get(BOARD).status_code == 403


# -- totals in the database -----------------------------------------------------------------------------------------


def test_the_totals_are_the_sums_of_the_rows_they_stand_for(vera, db):
    """The aggregates give what adding up every row gave before (CapacityTotals.add, removed): the fleet's
    declared size; online nodes' declared, allocatable (with remembered baselines), observed and committed; and
    the nodes over allocatable, of any status."""
    now = timezone.now()
    nodes = make_fleet(6, now=now)
    Node.objects.filter(pk=nodes[0].pk).update(idle_baseline_mib=9000)
    Node.objects.filter(pk=nodes[1].pk).update(status=NodeStatus.OFFLINE)
    Node.objects.filter(pk=nodes[2].pk).update(mem_total_mib=8192)  # 2,048 MiB allocatable
    hold(nodes[2], mem_mib=4096, now=now)  # over allocatable
    hold(nodes[1], mem_mib=70000, now=now)  # over, and offline
    hold(nodes[3], mem_mib=1000, cpu=250, now=now)
    from leases.instances import board

    counts, totals = board.totals(now)
    rows = node_rows(list(Node.objects.all()), now, lease_reads.committed_now(now))
    expected = CapacityTotals(nodes=6, cores=96, mem_mib=sum(r.node.mem_total_mib for r in rows))
    for r in rows:
        expected.over += r.figures.over
        if r.node.status == NodeStatus.ONLINE:
            expected.online_cores += r.node.cpu_cores
            expected.online_mem_mib += r.node.mem_total_mib
            expected.observed_mib += r.observed_mib or 0
            expected.allocatable_cores += r.figures.of.allocatable.cpu_cores
            expected.allocatable_mib += r.figures.of.allocatable.mem_mib
            expected.committed_cores += r.figures.of.committed.cpu_cores
            expected.committed_mib += r.figures.of.committed.mem_mib
    assert totals == expected
    assert totals.over == 2
    assert counts == {"online": 5, "draining": 0, "offline": 1, "dead": 0}


@pytest.mark.parametrize("baseline", [None, 0, 1000, 2048, 2049, 9000, 200_000])
@pytest.mark.parametrize("mem", [1, 4096, 6144, 8192, 131072])
def test_allocatable_memory_in_the_database_is_nodestates(db, baseline, mem):
    node = Node.objects.create(name="tank", cpu_cores=4, mem_total_mib=mem, disk_total_gib=100,
                               idle_baseline_mib=baseline, token_digest="t" * 64)  # fmt: skip
    in_sql = Node.objects.annotate(a=allocatable_mem()).get(pk=node.pk).a
    assert in_sql == nodestate.allocatable(4, mem, 100, baseline).mem_mib


# -- the live patch -------------------------------------------------------------------------------------------------


def test_a_patch_of_a_page_that_is_up_to_date_sends_no_row(vera, db):
    make_fleet(150)
    body = vera.get(BOARD).content.decode()
    have = {
        "have": shown(body),
        "sv": version_of(body, "fleet-summary"),
        "pv": version_of(body, "fleet-pager"),
    }
    patch = vera.get(PATCH, have)
    assert patch.status_code == 200 and patch["X-Board-Patch"] == "1"
    text = patch.content.decode()
    assert 'data-rows="0"' in text and "data-order" not in text
    assert "fleet-summary" not in text and "fleet-pager" not in text
    assert len(patch.content) < 200


def test_a_patch_sends_only_the_rows_that_changed_and_the_totals(vera, fleet):
    body = vera.get(BOARD).content.decode()
    have = {
        "have": shown(body),
        "sv": version_of(body, "fleet-summary"),
        "pv": version_of(body, "fleet-pager"),
    }
    heartbeat(fleet[1], used_mib=4096)
    text = vera.get(PATCH, have).content.decode()
    assert names(text) == ["architect"]
    assert 'data-observed-pct="50.0"' in text
    assert "data-order" not in text, "the page's order is the same"
    assert 'id="fleet-summary"' in text, "observed use moved the totals"
    assert 'id="fleet-pager"' not in text


def test_a_patch_only_for_time_passing_sends_nothing(vera, fleet):
    """A row's age is counted up in the browser: a row whose node said nothing new is not sent again."""
    body = vera.get(BOARD).content.decode()
    have = {
        "have": shown(body),
        "sv": version_of(body, "fleet-summary"),
        "pv": version_of(body, "fleet-pager"),
    }
    later = timezone.now() + timedelta(seconds=45)
    from unittest import mock

    with mock.patch("django.utils.timezone.now", return_value=later):
        text = vera.get(PATCH, have).content.decode()
    assert names(text) == [] and "fleet-summary" not in text


def test_a_node_that_leaves_the_filtered_page_is_dropped_and_the_next_one_comes_in(vera, otto, db):
    make_fleet(4)
    body = vera.get(BOARD, {"status": "online", "per": "2"}).content.decode()
    assert names(body) == ["n-000", "n-001"]
    have = {
        "have": shown(body),
        "sv": version_of(body, "fleet-summary"),
        "pv": version_of(body, "fleet-pager"),
    }
    node = Node.objects.get(name="n-000")
    otto.post(reverse("node-drain", args=[node.pk]), {"reason": "rack move", "confirm": "1"})
    text = vera.get(PATCH, {"status": "online", "per": "2", **have}).content.decode()
    n1, n2 = Node.objects.get(name="n-001").pk, Node.objects.get(name="n-002").pk
    assert f'data-order="{n1},{n2}"' in text
    assert names(text) == ["n-002"], "n-001 is on the page already and did not change"
    assert 'data-total="draining">draining <strong>1</strong>' in text
    assert "Nodes 1–2 of 3 matching" in text


def test_a_page_that_empties_shows_why_and_a_page_that_fills_drops_that_row(vera, otto, db):
    make_fleet(1)
    body = vera.get(BOARD, {"status": "draining"}).content.decode()
    assert names(body) == [] and 'data-key="none"' in body
    have = {"status": "draining", "have": shown(body)}
    node = Node.objects.get()
    otto.post(reverse("node-drain", args=[node.pk]), {"reason": "rack move", "confirm": "1"})
    text = vera.get(PATCH, have).content.decode()
    assert f'data-order="{node.pk}"' in text and names(text) == ["n-000"]
    otto.post(reverse("node-drain", args=[node.pk]), {"reason": "done", "undrain": "1"})
    again = vera.get(PATCH, {"status": "draining", "have": f"{node.pk}.x"}).content.decode()
    assert 'data-order="none"' in again and "No nodes match these filters." in again


def test_the_bytes_of_a_patch_grow_with_the_rows_that_changed_not_with_the_fleet(vera, db):
    nodes = make_fleet(300)
    body = vera.get(BOARD).content.decode()
    have = {
        "have": shown(body),
        "sv": version_of(body, "fleet-summary"),
        "pv": version_of(body, "fleet-pager"),
    }
    sizes = {}
    for changed in (1, 10, 100):
        Node.objects.filter(pk__in=[n.pk for n in nodes[:changed]]).update(obs_cpu_pct=50.0 + changed)
        # Nodes off the page change too: they must cost nothing.
        Node.objects.filter(pk__in=[n.pk for n in nodes[200:]]).update(obs_cpu_pct=10.0 + changed)
        text = vera.get(PATCH, have).content.decode()
        assert len(names(text)) == changed
        sizes[changed] = len(text)
    per_row = (sizes[100] - sizes[1]) / 99
    assert 500 < per_row < 2000
    assert sizes[1] < 3000 and sizes[10] < sizes[1] + 10 * 2000


def test_the_benchmark_reads_the_page_as_the_browser_does(vera, db):
    """bench/bench_board.py sends the patch a live page would send: it must find every row and both versions."""
    from bench.bench_board import shown as bench_shown

    nodes = make_fleet(3)
    body = vera.get(BOARD).content.decode()
    found = bench_shown(body)
    assert found["ids"] == [n.pk for n in nodes]
    assert found["have"] == shown(body)
    assert found["sv"] == version_of(body, "fleet-summary") and found["pv"] == version_of(body, "fleet-pager")
