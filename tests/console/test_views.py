"""The console pages through Django's test client: each renders for a viewer, serves its fragment to htmx from the
same URL, keeps actions to the roles that may take them, and lands every action in the audit feed."""

from __future__ import annotations

import csv
import io
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.models import Node, NodeStatus
from fleet.views import sort_verdicts
from leases import actions as lease_actions
from slotkeeper.models import AuditEntry
from tests.console.conftest import heartbeat, vm


def submit(name="render", mem=2048, type_="immediate", duration_s=3600):
    spec = lease_actions.LeaseSpec(name=name, type=type_, duration_s=duration_s, vnodes=[vm(mem=mem)])
    return lease_actions.do_submit_lease(None, spec, now=timezone.now()).lease


def host_of(lease) -> int:
    return int(next(iter(lease.reservations.get().nodes.values())))


@pytest.fixture
def lease(fleet):
    return submit()


def pages(fleet, lease):
    report_id = lease_report_id(lease)
    return {
        "fleet-board": (reverse("fleet-board"), "#fleet-table", 'id="fleet-table"'),
        "node-detail": (reverse("node-detail", args=[fleet[0].pk]), "#node-status", 'id="node-status"'),
        "slot-table": (reverse("slot-table"), "#slot-table", 'id="slot-table"'),
        "lease-list": (reverse("lease-list"), "#lease-table", 'id="lease-table"'),
        "lease-detail": (reverse("lease-detail", args=[lease.pk]), "#lease-body", 'id="lease-body"'),
        "audit-feed": (reverse("audit-feed"), "#audit-table", 'id="audit-table"'),
        "placement-report": (reverse("placement-report", args=[report_id]), None, 'id="verdicts"'),
    }


def lease_report_id(lease) -> int:
    from fleet.models import PlacementReport

    return PlacementReport.objects.filter(subject=f"lease:{lease.pk}").latest("id").pk


PAGE_NAMES = ["fleet-board", "node-detail", "slot-table", "lease-list", "lease-detail", "audit-feed"]


@pytest.mark.parametrize("name", [*PAGE_NAMES, "placement-report"])
def test_every_page_renders_for_a_viewer(vera, fleet, lease, name):
    url, _, marker = pages(fleet, lease)[name]
    response = vera.get(url)
    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" in body and marker in body


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_the_same_url_serves_only_the_fragment_to_htmx_and_varies_on_it(vera, fleet, lease, name):
    url, _, marker = pages(fleet, lease)[name]
    response = vera.get(url, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body and marker in body
    assert "HX-Request" in response["Vary"]


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_a_signed_out_browser_is_sent_to_sign_in(client, fleet, lease, name):
    url, _, _ = pages(fleet, lease)[name]
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


# Roles -------------------------------------------------------------------------------------------------------


def test_a_viewer_sees_no_action_buttons_on_a_node(vera, fleet):
    body = vera.get(reverse("node-detail", args=[fleet[0].pk])).content.decode()
    assert 'id="node-actions"' not in body
    assert (
        "Preview drain" not in body
        and "Declare tank dead" not in body
        and 'method="post" action="/nodes' not in body
    )


def test_an_operator_may_drain_but_not_declare_dead(otto, fleet):
    body = otto.get(reverse("node-detail", args=[fleet[0].pk])).content.decode()
    assert "Preview drain" in body
    assert "Declare tank dead" not in body


def test_an_admin_may_declare_a_node_dead(ada, fleet):
    body = ada.get(reverse("node-detail", args=[fleet[0].pk])).content.decode()
    assert "Declare tank dead" in body


@pytest.mark.parametrize(
    ("route", "method", "data"),
    [
        ("node-drain", "post", {"reason": "kernel upgrade", "confirm": "1"}),
        ("node-drain", "post", {"reason": "done", "undrain": "1"}),
        ("node-drain-preview", "get", {"reason": "kernel upgrade"}),
        ("node-declare-dead", "post", {"reason": "board fried"}),
        ("node-readmit", "post", {"reason": "fixed"}),
    ],
)
def test_a_viewer_is_refused_every_action_on_the_server(vera, fleet, route, method, data):
    response = getattr(vera, method)(reverse(route, args=[fleet[0].pk]), data)
    assert response.status_code == 403
    fleet[0].refresh_from_db()
    assert fleet[0].status == NodeStatus.ONLINE and not AuditEntry.objects.filter(actor_label="vera").exists()


def test_an_operator_is_refused_declaring_a_node_dead(otto, fleet):
    response = otto.post(reverse("node-declare-dead", args=[fleet[0].pk]), {"reason": "board fried"})
    assert response.status_code == 403
    assert Node.objects.get(pk=fleet[0].pk).status == NodeStatus.ONLINE


def test_an_admin_declares_a_node_dead_with_a_reason(ada, fleet):
    ada.post(reverse("node-declare-dead", args=[fleet[1].pk]), {"reason": "PSU failed, ticket 88"})
    entry = AuditEntry.objects.get(action="node.declare_dead")
    assert Node.objects.get(pk=fleet[1].pk).status == NodeStatus.DEAD
    assert (entry.actor_label, entry.reason) == ("ada", "PSU failed, ticket 88")


def test_a_node_declared_dead_shows_it_is_fenced_and_an_admin_readmits_it_from_its_page(ada, otto, fleet):
    ada.post(reverse("node-declare-dead", args=[fleet[1].pk]), {"reason": "PSU failed, ticket 88"})
    page = ada.get(reverse("node-detail", args=[fleet[1].pk])).content.decode()
    assert "Fenced" in page and "PSU failed, ticket 88" in page and "Re-admit architect" in page
    assert "Re-admit" not in otto.get(reverse("node-detail", args=[fleet[1].pk])).content.decode()
    assert otto.post(reverse("node-readmit", args=[fleet[1].pk]), {"reason": "fixed"}).status_code == 403
    ada.post(reverse("node-readmit", args=[fleet[1].pk]), {"reason": "PSU replaced"})
    node = Node.objects.get(pk=fleet[1].pk)
    assert (node.status, node.fenced_at) == (NodeStatus.OFFLINE, None)
    entry = AuditEntry.objects.get(action="node.readmit")
    assert (entry.actor_label, entry.reason) == ("ada", "PSU replaced")


# Drain through its preview -------------------------------------------------------------------------------------


def test_the_drain_preview_lists_the_leases_on_the_node(otto, fleet, lease):
    node_id = host_of(lease)
    body = otto.get(
        reverse("node-drain-preview", args=[node_id]), {"reason": "kernel upgrade"}
    ).content.decode()
    assert f'data-lease="{lease.pk}"' in body and "render" in body
    assert 'id="confirm-drain"' in body
    assert Node.objects.get(pk=node_id).status == NodeStatus.ONLINE, "a preview must not drain"


def test_a_drain_preview_without_a_reason_offers_no_confirmation(otto, fleet):
    body = otto.get(reverse("node-drain-preview", args=[fleet[0].pk]), {"reason": "  "}).content.decode()
    assert "needs a reason" in body and "confirm-drain" not in body


def test_an_operator_drains_with_a_reason_and_it_lands_in_the_audit_feed(otto, vera, fleet):
    response = otto.post(
        reverse("node-drain", args=[fleet[2].pk]), {"reason": "kernel upgrade, ticket 412", "confirm": "1"}
    )
    assert response.status_code == 302
    node = Node.objects.get(pk=fleet[2].pk)
    assert (node.status, node.drain_reason, node.drained_by.username) == (
        "draining",
        "kernel upgrade, ticket 412",
        "otto",
    )
    feed = vera.get(reverse("audit-feed"), {"action": "node.drain"}).content.decode()
    assert "kernel upgrade, ticket 412" in feed and "otto" in feed and "morpheus" in feed


def test_a_drain_posted_without_its_preview_is_sent_to_the_preview(otto, fleet):
    response = otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "kernel upgrade"})
    assert response.status_code == 302
    assert (
        response["Location"] == reverse("node-drain-preview", args=[fleet[0].pk]) + "?reason=kernel+upgrade"
    )
    assert Node.objects.get(pk=fleet[0].pk).status == NodeStatus.ONLINE


@pytest.mark.parametrize("undrain", ["", "1"])
def test_drain_and_undrain_both_need_a_reason(otto, fleet, undrain):
    if undrain:
        otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "maintenance", "confirm": "1"})
    before = Node.objects.get(pk=fleet[0].pk).status
    data = {"reason": " ", "confirm": "1", **({"undrain": "1"} if undrain else {})}
    response = otto.post(reverse("node-drain", args=[fleet[0].pk]), data, follow=True)
    assert "needs a reason" in response.content.decode()
    assert Node.objects.get(pk=fleet[0].pk).status == before


def test_an_undrain_with_a_reason_brings_a_fresh_node_back_online(otto, fleet):
    url = reverse("node-drain", args=[fleet[0].pk])
    otto.post(url, {"reason": "maintenance", "confirm": "1"})
    otto.post(url, {"reason": "maintenance done", "undrain": "1"})
    node = Node.objects.get(pk=fleet[0].pk)
    assert (node.status, node.drain_reason) == ("online", "")
    assert AuditEntry.objects.get(action="node.undrain").reason == "maintenance done"


# Fleet board ---------------------------------------------------------------------------------------------------


def test_the_board_totals_count_statuses_and_online_capacity(vera, otto, fleet):
    otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "maintenance", "confirm": "1"})
    body = vera.get(reverse("fleet-board")).content.decode()
    assert 'data-total="online">online <strong>2</strong>' in body
    assert 'data-total="draining">draining <strong>1</strong>' in body
    assert '<strong data-capacity="cores">8</strong>' in body, (
        "only the two online nodes' cores can take work"
    )


@pytest.mark.parametrize(
    ("query", "shown", "hidden"),
    [
        ({"q": "tank"}, ["tank"], ["architect", "morpheus"]),
        ({"q": "gpu"}, ["tank"], ["architect"]),
        ({"status": "draining"}, ["tank"], ["morpheus"]),
        ({"status": "online", "q": "mor"}, ["morpheus"], ["tank", "architect"]),
    ],
)
def test_board_filters_come_from_the_url(vera, otto, fleet, query, shown, hidden):
    otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "maintenance", "confirm": "1"})
    body = vera.get(reverse("fleet-board"), query, headers={"HX-Request": "true"}).content.decode()
    for name in shown:
        assert f'data-node="{name}"' in body
    for name in hidden:
        assert f'data-node="{name}"' not in body


def test_the_board_shows_who_drained_a_node_and_why(vera, otto, fleet):
    otto.post(reverse("node-drain", args=[fleet[1].pk]), {"reason": "disk swap", "confirm": "1"})
    body = vera.get(reverse("fleet-board")).content.decode()
    assert "disk swap" in body and "by otto since" in body


# Slot table and lease page ---------------------------------------------------------------------------------------


def test_a_lease_is_a_bar_on_its_node_row_linking_to_the_lease(vera, fleet, lease):
    body = vera.get(reverse("slot-table"), {"zoom": "6h"}).content.decode()
    assert f'data-lease="{lease.pk}"' in body
    assert reverse("lease-detail", args=[lease.pk]) in body
    assert 'class="now"' in body


def test_a_drained_nodes_row_shows_its_reason_in_the_slot_table(vera, otto, fleet):
    otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "fan noise", "confirm": "1"})
    body = vera.get(reverse("slot-table")).content.decode()
    assert "draining: fan noise" in body


def test_the_lease_page_lists_every_nodes_verdict(vera, fleet, lease):
    body = vera.get(reverse("lease-detail", args=[lease.pk]), {"sort": "node"}).content.decode()
    table = body[body.index("data-verdicts") :]
    order = [name for name in ("architect", "morpheus", "tank") if f'data-node="{name}"' in table]
    assert order == ["architect", "morpheus", "tank"]
    assert [table.index(f'data-node="{n}"') for n in order] == sorted(
        table.index(f'data-node="{n}"') for n in order
    )


VERDICTS = [
    {"node": "tank", "fit": False, "reason_code": "too_small", "slots": 0, "headroom": 10.0},
    {"node": "architect", "fit": True, "reason_code": None, "slots": 3, "headroom": 80.0},
    {"node": "morpheus", "fit": True, "reason_code": None, "slots": 1, "headroom": 95.0},
]


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("rank", ["tank", "architect", "morpheus"]),
        ("node", ["architect", "morpheus", "tank"]),
        ("-node", ["tank", "morpheus", "architect"]),
        ("fit", ["architect", "morpheus", "tank"]),
        ("-headroom", ["morpheus", "architect", "tank"]),
        ("-slots", ["architect", "morpheus", "tank"]),
        ("bogus", ["tank", "architect", "morpheus"]),
    ],
)
def test_verdicts_sort_by_the_asked_column(sort, expected):
    assert [v["node"] for v in sort_verdicts(VERDICTS, sort)] == expected


# Audit feed and CSV ----------------------------------------------------------------------------------------------


@pytest.fixture
def history(otto, ada, fleet):
    otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "kernel upgrade", "confirm": "1"})
    otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "upgrade done", "undrain": "1"})
    ada.post(reverse("node-declare-dead", args=[fleet[1].pk]), {"reason": '=HYPERLINK("http://x")'})


@pytest.mark.parametrize(
    ("query", "actions"),
    [
        ({"actor": "otto"}, {"node.drain", "node.undrain"}),
        ({"action": "node.drain"}, {"node.drain"}),
        ({"actor": "ada", "action": "node."}, {"node.declare_dead"}),
        ({"target": "architect", "actor": "ada"}, {"node.declare_dead"}),
        ({"since": "2001-01-01", "until": "2001-01-02"}, set()),
    ],
)
def test_the_audit_feed_filters_by_actor_action_target_and_dates(vera, history, query, actions):
    body = vera.get(reverse("audit-feed"), query, headers={"HX-Request": "true"}).content.decode()
    shown = {chunk.split('"')[0] for chunk in body.split('data-action="')[1:]}
    assert shown == actions


def test_the_audit_feed_filters_by_one_target_id(vera, history, fleet):
    body = vera.get(reverse("audit-feed"), {"target": f"node:{fleet[1].pk}"}).content.decode()
    shown = {chunk.split('"')[0] for chunk in body.split('data-action="')[1:]}
    assert shown == {"node.register", "node.back", "node.declare_dead"}


def test_today_as_both_dates_shows_todays_entries(vera, history):
    today = timezone.now().date().isoformat()
    body = vera.get(reverse("audit-feed"), {"since": today, "until": today}).content.decode()
    assert 'data-action="node.drain"' in body


def test_the_csv_export_holds_the_filtered_entries(vera, history):
    response = vera.get(reverse("audit-csv"), {"actor": "otto"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == ["at", "actor", "action", "target_type", "target_id", "target", "reason", "details"]
    assert [(r[1], r[2], r[6]) for r in rows[1:]] == [
        ("otto", "node.undrain", "upgrade done"),
        ("otto", "node.drain", "kernel upgrade"),
    ]


def test_the_csv_export_keeps_a_formula_typed_as_a_reason_as_text(vera, history):
    response = vera.get(reverse("audit-csv"), {"action": "node.declare_dead"})
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[1][6] == '\'=HYPERLINK("http://x")'


def test_the_export_link_carries_the_page_filters(vera, history):
    body = vera.get(reverse("audit-feed"), {"actor": "otto", "action": "node.drain"}).content.decode()
    assert 'href="/audit.csv?actor=otto&amp;action=node.drain"' in body


def test_a_heartbeat_keeps_the_board_current(vera, fleet):
    heartbeat(fleet[0], used_mib=4096)
    body = vera.get(reverse("fleet-board"), headers={"HX-Request": "true"}).content.decode()
    row = body[body.index('data-node="tank"') :]
    assert 'data-observed-pct="50.0"' in row[: row.index("</tr>")]


def test_a_running_leases_run_time_counts_the_run_in_force(vera, fleet):
    """Run time counted only runs that ended: a lease running for twelve minutes read "Run time 0 s"."""
    from datetime import timedelta

    from leases.models import Reservation

    lease = submit()
    assert lease.state == "active"
    run = Reservation.objects.get(lease=lease, kind="vm", status="active")
    Reservation.objects.filter(pk=run.pk).update(start=run.start - timedelta(minutes=12))
    body = vera.get(reverse("lease-detail", args=[lease.pk])).content.decode()
    shown = re.search(r"<dd data-run-time>(\d+) s, running since", body)
    assert shown and 720 <= int(shown[1]) < 780, shown
