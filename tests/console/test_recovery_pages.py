"""The recovery pages through Django's test client: instances with their restart history, reschedule approval
(one confirmation, then a result per item), rejection with a reason, alerts and drain progress; each page renders
for a viewer, serves its fragment to htmx from the same URL, and keeps every action to operators."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.models import Node, NodeStatus, PlacementReport
from leases import actions as lease_actions
from leases import alerts
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import reports, reschedules
from leases.instances.models import Reschedule
from leases.models import Alert, Instance, Lease
from slotkeeper.models import AuditEntry
from tests.console.conftest import vm


def submit(name: str, mem: int = 1024) -> Lease:
    spec = lease_actions.LeaseSpec(name=name, type="immediate", duration_s=3600, vnodes=[vm(mem=mem)])
    return lease_actions.do_submit_lease(None, spec, now=timezone.now()).lease


def lose_node_of(lease: Lease) -> Node:
    inst = Instance.objects.get(lease=lease)
    node_actions.do_declare_dead(None, inst.node_id, reason="PSU failed", now=timezone.now())
    return inst.node


@pytest.fixture
def two_lost(fleet):
    """Two immediate leases whose instances are lost with their node(s): two pending proposals, each holding
    half a GiB of the survivors' room (so that the fixtures after it still have room)."""
    a, b = submit("render-a", mem=512), submit("render-b", mem=512)
    lose_node_of(a)
    if Instance.objects.get(lease=b).state != "lost":
        lose_node_of(b)
    proposals = list(Reschedule.objects.filter(status="pending").order_by("pk"))
    assert len(proposals) == 2 and all(p.proposed_node_id for p in proposals)
    return proposals


def agent_reports(inst: Instance, status: str, at, **extra) -> Instance:
    """What the instance's node agent says about it, through the same path as a heartbeat."""
    reports.ingest_reports(inst.node, [{"id": inst.iid, "status": status, **extra}], at)
    return Instance.objects.get(pk=inst.pk)


@pytest.fixture
def crash_looping(fleet):
    """An instance that exited twice with code 137: restarted at once, then held back by its 1 s backoff."""
    inst = Instance.objects.get(lease=submit("flaky"))
    t0 = timezone.now()
    inst = agent_reports(inst, "running", t0)
    inst = agent_reports(inst, "exited", t0, exit_code=137, log_tail=["oom-killer woke up"])
    inst = agent_reports(inst, "running", t0 + timedelta(milliseconds=200))
    inst = agent_reports(inst, "exited", t0 + timedelta(milliseconds=400), exit_code=137)
    assert inst.state == "restarting" and inst.restart_not_before is not None
    return inst


def pages(fleet, two_lost, crash_looping) -> dict[str, tuple[str, str]]:
    return {
        "instance-list": (reverse("instance-list"), 'id="instance-table"'),
        "instance-detail": (reverse("instance-detail", args=[crash_looping.iid]), 'id="instance-body"'),
        "reschedule-list": (reverse("reschedule-list"), 'id="reschedule-table"'),
        "alert-list": (reverse("alert-list"), 'id="alert-table"'),
        "node-drain-progress": (reverse("node-drain-progress", args=[fleet[0].pk]), 'id="drain-progress"'),
    }


PAGE_NAMES = ["instance-list", "instance-detail", "reschedule-list", "alert-list", "node-drain-progress"]


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_every_recovery_page_renders_for_a_viewer(vera, fleet, two_lost, crash_looping, name):
    url, marker = pages(fleet, two_lost, crash_looping)[name]
    response = vera.get(url)
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" in body and marker in body


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_the_same_url_serves_only_the_fragment_to_htmx(vera, fleet, two_lost, crash_looping, name):
    url, marker = pages(fleet, two_lost, crash_looping)[name]
    response = vera.get(url, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body and marker in body
    assert "HX-Request" in response["Vary"]


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_a_signed_out_browser_is_sent_to_sign_in(client, fleet, two_lost, crash_looping, name):
    url, _ = pages(fleet, two_lost, crash_looping)[name]
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_nav_links_every_recovery_page(vera, fleet):
    body = vera.get(reverse("fleet-board")).content.decode()
    for name in ("instance-list", "reschedule-list", "alert-list"):
        assert f'href="{reverse(name)}"' in body
    assert 'id="pending-count"' in body and "load, reschedule-changed" in body


# Instances -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "shown", "hidden"),
    [
        ({"state": "lost"}, ["render-a"], ["flaky"]),
        ({"state": "restarting"}, ["flaky"], ["render-a"]),
        ({"lease": "LEASE_FLAKY"}, ["flaky"], ["render-a", "render-b"]),
        ({"state": "bogus"}, ["flaky", "render-a"], []),
    ],
)
def test_instance_filters_come_from_the_url(vera, two_lost, crash_looping, query, shown, hidden):
    query = {k: (str(crash_looping.lease_id) if v == "LEASE_FLAKY" else v) for k, v in query.items()}
    body = vera.get(reverse("instance-list"), query, headers={"HX-Request": "true"}).content.decode()
    for name in shown:
        assert f"{name}</a>" in body
    for name in hidden:
        assert f"{name}</a>" not in body


def test_the_instance_list_filters_by_node_id_or_name(vera, fleet, crash_looping):
    node = crash_looping.node
    for value in (str(node.pk), node.name):
        body = vera.get(reverse("instance-list"), {"node": value}).content.decode()
        assert f'data-instance="{crash_looping.iid}"' in body
    other = next(n for n in fleet if n.pk != node.pk)
    body = vera.get(reverse("instance-list"), {"node": other.name}).content.decode()
    assert f'data-instance="{crash_looping.iid}"' not in body


def test_a_crash_looping_instance_shows_its_backoff_in_the_restart_history(vera, crash_looping):
    body = vera.get(reverse("instance-detail", args=[crash_looping.iid])).content.decode()
    history = body[body.index('id="restart-history"') :]
    history = history[: history.index("</table>")]
    assert history.count("data-decision=") == 2
    assert 'data-decision="restart"' in history and 'data-decision="wait"' in history
    assert "exit code 137" in history and "waits 1 s after the previous restart" in history
    assert "backing off: next restart not before" in body


def test_an_old_instance_id_leads_to_the_generation_that_replaced_it(vera, crash_looping):
    old = f"{crash_looping.lease_id}-{crash_looping.vnode}-0"
    assert crash_looping.iid != old, "the first restart must have given the instance a new id"
    page = vera.get(reverse("instance-detail", args=[old]))
    assert page.status_code == 302 and page["Location"] == reverse(
        "instance-detail", args=[crash_looping.iid]
    )
    fragment = vera.get(reverse("instance-detail", args=[old]), headers={"HX-Request": "true"})
    assert fragment.status_code == 200 and fragment["HX-Replace-Url"].endswith(f"/{crash_looping.iid}/")
    assert vera.get(reverse("instance-detail", args=["9-9-9"])).status_code == 404


def test_the_instance_page_shows_its_exit_code_and_log_tail(vera, crash_looping):
    body = vera.get(reverse("instance-detail", args=[crash_looping.iid])).content.decode()
    assert "<dd data-exit>137</dd>" in body and "oom-killer woke up" in body


# Reschedules: roles ----------------------------------------------------------------------------------------------


def test_a_viewer_sees_the_proposals_but_no_checkboxes_or_buttons(vera, two_lost):
    body = vera.get(reverse("reschedule-list")).content.decode()
    assert body.count("data-reschedule=") == 2
    assert 'name="id"' not in body and "Review selected" not in body and "Reject" not in body
    assert 'id="reschedule-form"' not in body


def test_an_operator_sees_a_checkbox_per_pending_proposal(otto, two_lost):
    body = otto.get(reverse("reschedule-list")).content.decode()
    assert body.count('form="reschedule-form" name="id"') == 2
    assert "Review all 2 matching this filter" in body


@pytest.mark.parametrize(
    ("route", "args", "data"),
    [
        ("reschedule-confirm", [], {"id": "PK"}),
        ("reschedule-approve", [], {"id": "PK"}),
        ("reschedule-reject", ["PK"], {"reason": "leave it"}),
    ],
)
def test_a_viewer_is_refused_every_reschedule_action_on_the_server(vera, two_lost, route, args, data):
    pk = str(two_lost[0].pk)
    url = reverse(route, args=[pk if a == "PK" else a for a in args])
    response = vera.post(url, {k: (pk if v == "PK" else v) for k, v in data.items()})
    assert response.status_code == 403
    assert Reschedule.objects.filter(status="pending").count() == 2


# Reschedules: bulk approval through one confirmation ---------------------------------------------------------------


def confirm(client, proposals, **extra):
    data = {"id": [str(p.pk) for p in proposals], **{f"v{p.pk}": str(p.version) for p in proposals}, **extra}
    return client.post(reverse("reschedule-confirm"), data, headers={"HX-Request": "true"})


def test_the_confirmation_lists_each_instance_and_its_target_and_moves_nothing(otto, two_lost):
    body = confirm(otto, two_lost).content.decode()
    for p in two_lost:
        row = body[body.index(f'data-reschedule="{p.pk}"') :]
        row = row[: row.index("</tr>")]
        assert p.instance.iid in row and f"→ <strong>{p.proposed_node.name}</strong>" in row
        assert f'name="v{p.pk}" value="{p.version}"' in body
    assert 'id="confirm-approve"' in body and "Approve 2 reschedules" in body
    assert Reschedule.objects.filter(status="pending").count() == 2


def test_the_confirmation_flags_a_proposal_that_changed_since_the_list(otto, two_lost):
    fresh, changed = two_lost
    data = {
        "id": [str(fresh.pk), str(changed.pk)],
        f"v{fresh.pk}": str(fresh.version),
        f"v{changed.pk}": "99",
    }
    body = otto.post(reverse("reschedule-confirm"), data).content.decode()
    assert body.count("data-changed") == 1
    row = body[body.index(f'data-reschedule="{changed.pk}"') :]
    assert "data-changed" in row[: row.index("</tr>")]
    assert f'name="v{changed.pk}" value="{changed.version}"' in body, "the confirmation carries what it shows"


def test_all_matching_the_filter_confirms_every_pending_proposal(otto, two_lost):
    body = otto.post(
        reverse("reschedule-confirm"), {"all": "1", "status": "pending", "cause": "node_dead"}
    ).content
    assert body.decode().count('<input type="hidden" name="id"') == 2
    body = otto.post(reverse("reschedule-confirm"), {"all": "1", "cause": "drain"}).content.decode()
    assert "Nothing to approve" in body


def test_an_operator_approves_two_in_bulk_and_gets_a_result_line_each(otto, vera, two_lost):
    data = {"id": [str(p.pk) for p in two_lost], **{f"v{p.pk}": str(p.version) for p in two_lost}}
    response = otto.post(reverse("reschedule-approve"), data, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert body.count('data-result="moved"') == 2 and "2 of 2 moved" in body
    assert set(Reschedule.objects.values_list("status", flat=True)) == {"applied"}
    feed = vera.get(reverse("audit-feed"), {"action": "reschedule.approve"}).content.decode()
    assert feed.count('data-action="reschedule.approve"') == 2 and "otto" in feed


def test_a_stale_version_shows_the_changed_line_and_does_not_apply(otto, two_lost):
    fresh, stale = two_lost
    data = {"id": [str(fresh.pk), str(stale.pk)], f"v{fresh.pk}": str(fresh.version), f"v{stale.pk}": "99"}
    body = otto.post(reverse("reschedule-approve"), data).content.decode()
    line = body[body.rindex("<tr", 0, body.index(f'data-reschedule="{stale.pk}"')) :]
    line = line[: line.index("</tr>")]
    assert (
        'data-result="stale"' in line and "changed since you saw it, review again (version 99, now 1)" in line
    )
    assert Reschedule.objects.get(pk=stale.pk).status == "pending"
    assert Reschedule.objects.get(pk=fresh.pk).status == "applied"


def test_a_single_stale_approval_is_a_result_line_not_an_error(otto, two_lost):
    p = two_lost[0]
    response = otto.post(reverse("reschedule-approve"), {"id": str(p.pk), f"v{p.pk}": "99"})
    assert response.status_code == 200
    assert 'data-result="stale"' in response.content.decode()
    assert Reschedule.objects.get(pk=p.pk).status == "pending"


def test_approving_an_already_applied_proposal_says_so(otto, two_lost):
    p = two_lost[0]
    reschedules.do_approve(None, [p.pk], now=timezone.now())
    body = otto.post(reverse("reschedule-approve"), {"id": str(p.pk)}).content.decode()
    assert 'data-result="refused"' in body and "already applied" in body


def test_an_empty_or_tampered_selection_approves_nothing(otto, two_lost):
    response = otto.post(reverse("reschedule-approve"), {"id": ["x", "-1"]}, follow=True)
    assert "Select at least one proposal" in response.content.decode()
    assert Reschedule.objects.filter(status="pending").count() == 2


def test_a_live_refetch_keeps_the_boxes_still_ticked(otto, two_lost):
    keep = two_lost[1].pk
    body = otto.get(reverse("reschedule-list"), {"id": str(keep)}, headers={"HX-Request": "true"}).content
    body = body.decode()
    assert f'value="{keep}" aria-label="select {two_lost[1].instance.iid}" checked' in body
    assert body.count(" checked>") == 1
    assert 'id="pending-count"' in body and 'hx-swap-oob="true"' in body, "the nav count rides along"


# Reschedules: reject, filters, counts --------------------------------------------------------------------------


def test_an_operator_rejects_with_a_reason_and_it_is_audited(otto, two_lost):
    p = two_lost[0]
    response = otto.post(reverse("reschedule-reject", args=[p.pk]), {"reason": "leave it, ticket 9"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("reschedule-list"))
    p.refresh_from_db()
    assert (p.status, p.message, p.decided_by) == ("rejected", "leave it, ticket 9", "otto")
    assert AuditEntry.objects.get(action="reschedule.reject").reason == "leave it, ticket 9"


def test_a_rejection_needs_a_reason(otto, two_lost):
    response = otto.post(reverse("reschedule-reject", args=[two_lost[0].pk]), {"reason": " "}, follow=True)
    assert "needs a reason" in response.content.decode()
    assert Reschedule.objects.get(pk=two_lost[0].pk).status == "pending"


@pytest.mark.parametrize(
    ("query", "count"),
    [
        ({}, 1),
        ({"status": "rejected"}, 1),
        ({"status": ""}, 2),
        ({"cause": "drain"}, 0),
        ({"cause": "node_dead"}, 1),
    ],
)
def test_reschedule_filters_come_from_the_url(vera, two_lost, query, count):
    reschedules.do_reject(None, two_lost[0].pk, now=timezone.now(), reason="no")
    body = vera.get(reverse("reschedule-list"), query, headers={"HX-Request": "true"}).content.decode()
    assert body.count("data-reschedule=") == count


def test_the_pending_count_badge_counts_pending_proposals(vera, two_lost):
    body = vera.get(reverse("reschedule-pending-count")).content.decode()
    assert 'data-pending="2"' in body and ">2</span>" in body
    assert "load," not in body, "a swapped-in badge must not fetch itself again on load"


def test_the_list_links_each_proposal_to_its_placement_report(vera, two_lost):
    body = vera.get(reverse("reschedule-list")).content.decode()
    for p in two_lost:
        assert reverse("placement-report", args=[p.report_id]) in body


MANY = 100


@pytest.fixture
def many_proposals(fleet):
    now = timezone.now()
    leases = Lease.objects.bulk_create(
        Lease(
            name=f"job-{i}",
            type="immediate",
            state="active",
            submitted_at=now,
            duration_s=3600,
            vnodes=[vm()],
        )
        for i in range(MANY)
    )
    instances = Instance.objects.bulk_create(
        Instance(
            iid=f"{lease.pk}-1-0",
            lease=lease,
            vnode=1,
            node=fleet[i % 3],
            state="lost",
            created_at=now,
            state_changed_at=now,
        )
        for i, lease in enumerate(leases)
    )
    report = PlacementReport.objects.create(
        created_at=now,
        subject="reschedule:bulk",
        request={},
        outcome="placed",
        message="",
        verdicts=[],
        chosen=[],
    )
    Reschedule.objects.bulk_create(
        Reschedule(
            instance=inst, lease=inst.lease, proposed_node=fleet[(i + 1) % 3], report=report, created_at=now
        )
        for i, inst in enumerate(instances)
    )


@pytest.mark.parametrize("role", ["vera", "otto"])
@pytest.mark.parametrize("htmx", [False, True])
def test_the_reschedule_list_at_100_proposals_takes_at_most_12_queries(
    request, many_proposals, django_assert_max_num_queries, role, htmx
):
    client = request.getfixturevalue(role)
    headers = {"HX-Request": "true"} if htmx else {}
    with django_assert_max_num_queries(12):
        response = client.get(reverse("reschedule-list"), headers=headers)
    body = response.content.decode()
    assert body.count("data-reschedule=") == MANY
    assert body.count('name="id"') == (MANY if role == "otto" else 0)


# Alerts and drain progress ---------------------------------------------------------------------------------------


def test_open_alerts_are_listed_with_links_and_resolved_ones_on_request(vera, fleet, crash_looping):
    now = timezone.now()
    alerts.raise_alert("instance_held", "instance held: no capable node", now, instance=crash_looping)
    Alert.objects.create(kind="stale_node", message="tank is stale", created_at=now, resolved_at=now)
    body = vera.get(reverse("alert-list")).content.decode()
    assert 'data-alert="instance_held"' in body and 'data-alert="stale_node"' not in body
    assert reverse("instance-detail", args=[crash_looping.iid]) in body
    assert reverse("node-detail", args=[crash_looping.node_id]) in body
    body = vera.get(reverse("alert-list"), {"resolved": "1", "kind": "stale_node"}).content.decode()
    assert 'data-alert="stale_node"' in body and 'data-alert="instance_held"' not in body


def drain_with_deadline(node: Node) -> None:
    node_actions.do_drain(
        None,
        node.pk,
        reason="kernel upgrade",
        now=timezone.now(),
        deadline=timezone.now() + timedelta(hours=1),
    )


def test_drain_progress_lists_each_move_and_what_blocks_it(vera, fleet):
    lease = submit("web")
    node = Instance.objects.get(lease=lease).node
    drain_with_deadline(node)
    body = vera.get(reverse("node-drain-progress", args=[node.pk])).content.decode()
    assert "<strong data-left>1</strong>" in body
    assert body.count("data-move=") == 1 and f"{lease.pk}-1-0" in body
    assert "max_parallel" in body or "waiting" in body


def test_the_node_page_shows_drain_progress_only_for_a_drain_with_a_deadline(vera, otto, fleet):
    url = reverse("node-detail", args=[fleet[0].pk])
    otto.post(reverse("node-drain", args=[fleet[0].pk]), {"reason": "no deadline", "confirm": "1"})
    assert 'id="drain-progress"' not in vera.get(url).content.decode()
    fleet_actions.do_undrain(None, fleet[0].pk, reason="back", now=timezone.now())
    drain_with_deadline(Node.objects.get(pk=fleet[0].pk))
    body = vera.get(url).content.decode()
    assert 'id="drain-progress"' in body and reverse("node-drain-progress", args=[fleet[0].pk]) in body
    assert f'href="{reverse("instance-list")}?node={fleet[0].pk}"' in body


def test_drain_progress_of_a_node_that_is_not_draining_says_so(vera, fleet):
    assert Node.objects.get(pk=fleet[1].pk).status == NodeStatus.ONLINE
    body = vera.get(reverse("node-drain-progress", args=[fleet[1].pk])).content.decode()
    assert "not draining" in body


def test_a_drain_from_the_console_can_set_a_deadline_and_parallelism(client, db):
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from fleet import actions as fleet_actions
    from fleet.models import Node
    from slotkeeper.management.commands.issue_token import grant_role

    node, _ = fleet_actions.do_register_node(
        None,
        name="deadline-node",
        cpu_cores=4,
        mem_total_mib=8192,
        disk_total_gib=50,
        capabilities=[],
        now=timezone.now(),
    )
    user = get_user_model().objects.create_user("oda", password="pw-only-for-tests")
    grant_role(user, "operator")
    client.force_login(user)
    response = client.post(
        f"/nodes/{node.pk}/drain",
        {"reason": "rack move", "confirm": "1", "deadline_min": "30", "max_parallel": "3"},
    )
    assert response.status_code == 302
    node = Node.objects.get(pk=node.pk)
    assert node.status == "draining"
    assert node.drain_max_parallel == 3
    assert 29 * 60 < (node.drain_deadline - timezone.now()).total_seconds() <= 30 * 60
