"""The console's forms: each succeeds through the same action as the API, refuses bad input with the API's own
field messages (a 400 that re-renders the form and changes nothing), and is offered to, and accepted from, only the
roles that may use it. Personas: vera (viewer), otto (operator), ada (admin); the fleet is tank (gpu), architect
and morpheus, 4 cores and 8 GiB each."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.models import Node, NodeStatus, PlacementReport
from fleet.wording import words
from leases.alerts import raise_alert
from leases.instances.actions import groups
from leases.instances.actions import nodes as node_actions
from leases.models import Alert, Lease
from slotkeeper.models import AuditEntry


def lease_form(**overrides) -> dict:
    form = {
        "name": "render-farm",
        "type": "best_effort",
        "duration_s": "1800",
        "vms": "1",
        "cpu_cores": "1",
        "mem_mib": "1024",
        "disk_gib": "0",
        "capabilities": "",
        "preemptible": "1",
    }
    form.update(overrides)
    return {k: v for k, v in form.items() if v is not None}


def page_text(response) -> str:
    return html.unescape(response.content.decode())


def api_errors(otto_user, path: str, body: dict) -> dict:
    """What the API answers the same request with, to hold the form to the same messages."""
    client = APIClient()
    client.force_authenticate(otto_user)
    response = client.post(path, body, format="json")
    assert response.status_code == 400, response.content
    return response.json()


@pytest.fixture
def otto_user(otto):
    return get_user_model().objects.get(username="otto")


# -- submit a lease ----------------------------------------------------------------------------------------------


def test_an_operator_submits_a_best_effort_lease_and_lands_on_its_page_with_the_decision(otto, fleet):
    response = otto.post(reverse("lease-new"), lease_form())
    lease = Lease.objects.get(name="render-farm")
    assert response.status_code == 302
    assert response["Location"] == reverse("lease-detail", args=[lease.pk])
    page = page_text(otto.get(response["Location"]))
    assert lease.type == "best_effort" and lease.submitted_by.get_username() == "otto"
    assert lease.message in page and f"Lease {lease.pk} render-farm" in page
    assert PlacementReport.objects.filter(subject=f"lease:{lease.pk}").exists()


def test_an_advance_reservation_from_the_form_gets_its_exact_window(otto, fleet):
    start = (timezone.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
    otto.post(
        reverse("lease-new"),
        lease_form(type="advance_reservation", start=start.strftime("%Y-%m-%dT%H:%M"), name="ar-window"),
    )
    lease = Lease.objects.get(name="ar-window")
    assert lease.state in {"scheduled", "ready"}  # ready: nothing to prepare before its start
    assert lease.requested_start == start
    assert lease.reservations.get().start == start


def test_an_immediate_lease_of_several_vms_with_capability_group_and_no_preemption(otto, fleet):
    # A soft rule: a hard one would keep the lease's own two VMs apart, and only tank has the gpu.
    group = groups.do_create_group(None, now=timezone.now(), name="web", policy="anti_affinity", hard=False)
    otto.post(
        reverse("lease-new"),
        lease_form(
            type="immediate", name="gpu-job", vms="2", cpu_cores="1", mem_mib="1024", capabilities="gpu",
            groups=group.name, preemptible=None,
        ),
    )  # fmt: skip
    lease = Lease.objects.get(name="gpu-job")
    assert lease.state == "active"
    assert lease.vnodes == [{"cpu_cores": 1.0, "mem_mib": 1024, "disk_gib": 0}] * 2
    assert lease.capabilities == ["gpu"] and lease.preemptible is False
    assert list(lease.groups.values_list("name", flat=True)) == ["web"]
    placed = {int(n) for r in lease.reservations.all() for n in r.nodes.values()}
    assert placed == {Node.objects.get(name="tank").pk}  # the only node with the gpu capability


def test_an_immediate_lease_that_cannot_run_now_lands_on_its_page_rejected_with_the_reason(otto, fleet):
    response = otto.post(
        reverse("lease-new"), lease_form(type="immediate", name="too-big", vms="4", mem_mib="2048")
    )
    lease = Lease.objects.get(name="too-big")
    page = page_text(otto.get(response["Location"]))
    assert lease.state == "rejected"
    assert f"Lease {lease.pk} too-big rejected" in page and lease.message in page


def test_a_vm_larger_than_any_node_is_refused_with_the_apis_message_and_nothing_is_stored(
    otto, otto_user, fleet
):
    response = otto.post(reverse("lease-new"), lease_form(mem_mib="65536"))
    expected = api_errors(
        otto_user,
        "/api/leases/",
        {"name": "render-farm", "type": "best_effort", "duration_s": 1800, "nodes": [{"mem_mib": 65536}]},
    )
    assert response.status_code == 400
    assert expected["nodes"]["0"] in page_text(response)
    assert 'data-error="nodes"' in response.content.decode()
    assert not Lease.objects.exists()


@pytest.mark.parametrize(
    ("form", "field", "message"),
    [
        ({"type": "advance_reservation"}, "start", "An advance reservation needs its exact start."),
        ({"start": "2030-01-01T10:00"}, "start", "Only an advance reservation takes a start time."),
        ({"duration_s": "soon"}, "duration_s", "A number is required (got str)."),
        ({"duration_s": ""}, "duration_s", "This field is required."),
        ({"name": ""}, "name", "This field may not be blank."),
        ({"mem_mib": "0"}, "mem_mib", "Ensure this value is greater than or equal to 1."),
        ({"vms": "0"}, "vms", "A whole number of VMs, at least 1."),
        ({"type": "whenever"}, "type", '"whenever" is not a valid choice.'),
        ({"groups": "nope"}, "groups", "Unknown group(s): nope."),
    ],
)
def test_bad_input_re_renders_the_lease_form_with_the_field_message(otto, fleet, form, field, message):
    response = otto.post(reverse("lease-new"), lease_form(**form))
    assert response.status_code == 400
    body = page_text(response)
    assert f'data-error="{field}" id="{field}-error">{message}' in body
    assert 'id="lease-form"' in body  # the form again, with what was typed
    assert f'value="{lease_form(**form)["name"]}"' in body
    assert not Lease.objects.exists()


def test_a_viewer_sees_no_lease_form_and_its_post_is_refused(vera, fleet):
    assert 'id="new-lease"' not in vera.get(reverse("lease-list")).content.decode()
    assert vera.get(reverse("lease-new")).status_code == 403
    assert vera.post(reverse("lease-new"), lease_form()).status_code == 403
    assert not Lease.objects.exists()


def test_an_operator_is_offered_the_lease_form(otto, fleet):
    assert 'id="new-lease"' in otto.get(reverse("lease-list")).content.decode()
    assert 'id="lease-form"' in otto.get(reverse("lease-new")).content.decode()


def test_a_signed_out_visitor_of_the_lease_form_is_sent_to_sign_in(db):
    response = Client().get(reverse("lease-new"))
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_the_lease_form_keeps_csrf_on(fleet):
    user = get_user_model().objects.create_user(username="otto", password="x")
    from slotkeeper.management.commands.issue_token import grant_role

    grant_role(user, "operator")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(reverse("lease-new"), lease_form()).status_code == 403
    assert not Lease.objects.exists()


# -- cancel a lease ----------------------------------------------------------------------------------------------


@pytest.fixture
def queued_lease(otto, fleet):
    otto.post(reverse("lease-new"), lease_form(name="to-cancel", duration_s="7200"))
    return Lease.objects.get(name="to-cancel")


def test_an_operator_cancels_a_lease_from_its_page(otto, queued_lease):
    page = otto.get(reverse("lease-detail", args=[queued_lease.pk])).content.decode()
    assert 'id="cancel-form"' in page
    response = otto.post(reverse("lease-cancel", args=[queued_lease.pk]), {"reason": "job finished early"})
    assert response.status_code == 302
    queued_lease.refresh_from_db()
    assert queued_lease.state == "cancelled"
    entry = AuditEntry.objects.get(action="lease.cancel")
    assert (entry.actor_label, entry.reason) == ("otto", "job finished early")
    assert 'id="cancel-form"' not in otto.get(response["Location"]).content.decode()


def test_a_cancel_reason_too_long_is_refused_with_the_apis_message_and_the_lease_runs_on(otto, queued_lease):
    state = queued_lease.state
    response = otto.post(reverse("lease-cancel", args=[queued_lease.pk]), {"reason": "x" * 301})
    assert response.status_code == 400
    assert 'data-error="reason" id="reason-error">Ensure this field has no more than 300 characters.' in (
        page_text(response)
    )
    queued_lease.refresh_from_db()
    assert queued_lease.state == state and not AuditEntry.objects.filter(action="lease.cancel").exists()


def test_cancelling_a_cancelled_lease_says_why_and_changes_nothing(otto, queued_lease):
    otto.post(reverse("lease-cancel", args=[queued_lease.pk]), {"reason": ""})
    response = otto.post(reverse("lease-cancel", args=[queued_lease.pk]), {"reason": ""}, follow=True)
    assert "it cannot be cancelled" in page_text(response)
    assert AuditEntry.objects.filter(action="lease.cancel").count() == 1


def test_a_viewer_sees_no_cancel_form_and_its_post_is_refused(vera, queued_lease):
    assert (
        'id="cancel-form"' not in vera.get(reverse("lease-detail", args=[queued_lease.pk])).content.decode()
    )
    assert vera.post(reverse("lease-cancel", args=[queued_lease.pk]), {"reason": "x"}).status_code == 403
    queued_lease.refresh_from_db()
    assert queued_lease.state != "cancelled"


# -- what-if placement preview -----------------------------------------------------------------------------------


def test_a_what_if_preview_shows_every_nodes_verdict_and_where_it_would_go(otto, fleet):
    response = otto.post(
        reverse("placement-preview-form"),
        {"count": "1", "cpu_cores": "1", "mem_mib": "2048", "disk_gib": "0", "capabilities": "gpu"},
    )
    body = page_text(response)
    report = PlacementReport.objects.get(subject__startswith="preview")
    assert response.status_code == 200
    assert 'data-outcome="placed"' in body and "<strong data-chosen>tank</strong>" in body
    for name in ("tank", "architect", "morpheus"):
        assert f'data-node="{name}"' in body
    assert body.count("missing_capability") >= 2  # architect and morpheus lack the gpu
    assert f"Report {report.pk}" in body
    assert AuditEntry.objects.filter(action="placement.preview", actor_label="otto").exists()


def test_a_preview_the_fleet_cannot_fit_says_so(otto, fleet):
    body = page_text(otto.post(reverse("placement-preview-form"), {"count": "1", "mem_mib": "9000"}))
    assert 'data-outcome="placed"' not in body and 'id="preview-verdicts"' in body


def test_a_preview_with_bad_input_re_renders_the_form_with_the_apis_message(otto, otto_user, fleet):
    response = otto.post(reverse("placement-preview-form"), {"count": "1", "mem_mib": "lots"})
    expected = api_errors(otto_user, "/api/placement/preview", {"mem_mib": "lots"})
    assert response.status_code == 400
    assert f'data-error="mem_mib" id="mem_mib-error">{expected["mem_mib"][0]}' in page_text(response)
    assert not PlacementReport.objects.exists()


def test_a_viewer_sees_no_what_if_and_its_post_is_refused(vera, otto, fleet):
    assert 'id="what-if"' not in vera.get(reverse("fleet-board")).content.decode()
    assert 'id="what-if"' in otto.get(reverse("fleet-board")).content.decode()
    assert vera.post(reverse("placement-preview-form"), {"mem_mib": "1024"}).status_code == 403
    assert not PlacementReport.objects.exists()


# -- resolve an alert --------------------------------------------------------------------------------------------


@pytest.fixture
def alert(fleet):
    return raise_alert("failed_placement", "lease 9 gpu-job was rejected", timezone.now(), node=fleet[0])


def test_an_operator_resolves_an_alert_from_the_list(otto, alert):
    assert f'data-resolve="{alert.pk}"' in otto.get(reverse("alert-list")).content.decode()
    response = otto.post(reverse("alert-resolve", args=[alert.pk]), {"reason": "capacity added"})
    assert response.status_code == 302 and response["Location"] == reverse("alert-list")
    alert.refresh_from_db()
    assert alert.resolved_at is not None
    entry = AuditEntry.objects.get(action="alert.resolve")
    assert (entry.actor_label, entry.reason) == ("otto", "capacity added")
    # The feed's Target names the alert in words: it printed the kind's code and the message cut mid-word.
    assert entry.target_label == f"alert {alert.pk}: {words(alert.kind)}" and "_" not in entry.target_label
    assert "lease 9 gpu-job" not in otto.get(reverse("alert-list")).content.decode()  # open alerts only


def test_a_resolve_reason_too_long_is_refused_and_the_alert_stays_open(otto, alert):
    response = otto.post(reverse("alert-resolve", args=[alert.pk]), {"reason": "y" * 301})
    assert response.status_code == 400
    assert "Ensure this field has no more than 300 characters." in page_text(response)
    alert.refresh_from_db()
    assert alert.resolved_at is None


def test_resolving_a_resolved_alert_says_so(otto, alert):
    otto.post(reverse("alert-resolve", args=[alert.pk]), {"reason": ""})
    response = otto.post(reverse("alert-resolve", args=[alert.pk]), {"reason": ""}, follow=True)
    assert f"alert {alert.pk} was resolved at" in page_text(response)


def test_a_viewer_sees_no_resolve_and_its_post_is_refused(vera, alert):
    assert "data-resolve" not in vera.get(reverse("alert-list")).content.decode()
    assert vera.post(reverse("alert-resolve", args=[alert.pk]), {"reason": ""}).status_code == 403
    assert Alert.objects.get(pk=alert.pk).resolved_at is None


# -- declare dead and re-admit -----------------------------------------------------------------------------------


def test_declaring_dead_without_a_reason_is_refused_with_the_apis_message(ada, fleet):
    response = ada.post(reverse("node-declare-dead", args=[fleet[1].pk]), {"reason": "  "})
    assert response.status_code == 400
    assert 'data-error="reason" id="reason-error">This field may not be blank.' in page_text(response)
    assert Node.objects.get(pk=fleet[1].pk).status == NodeStatus.ONLINE
    assert not AuditEntry.objects.filter(action="node.declare_dead").exists()


def test_re_admitting_without_a_reason_is_refused_and_the_node_stays_fenced(ada, fleet):
    node_actions.do_declare_dead(None, fleet[1].pk, reason="PSU failed", now=timezone.now())
    response = ada.post(reverse("node-readmit", args=[fleet[1].pk]), {"reason": ""})
    assert response.status_code == 400
    assert "This field may not be blank." in page_text(response)
    assert Node.objects.get(pk=fleet[1].pk).fenced_at is not None


def test_an_admin_declares_a_node_dead_and_re_admits_it_from_its_page(ada, fleet):
    ada.post(reverse("node-declare-dead", args=[fleet[2].pk]), {"reason": "board fried"})
    assert Node.objects.get(pk=fleet[2].pk).status == NodeStatus.DEAD
    response = ada.post(
        reverse("node-readmit", args=[fleet[2].pk]), {"reason": "board replaced"}, follow=True
    )
    node = Node.objects.get(pk=fleet[2].pk)
    assert node.fenced_at is None and node.status == NodeStatus.OFFLINE
    assert "Node re-admitted" in page_text(response)
    assert AuditEntry.objects.filter(
        action="node.readmit", actor_label="ada", reason="board replaced"
    ).exists()


# -- the admin's declare-dead action -----------------------------------------------------------------------------


@pytest.fixture
def superuser_client(db):
    user = get_user_model().objects.create_superuser(username="root", password="x")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_offers_declare_dead_on_nodes_and_asks_for_a_reason_first(superuser_client, fleet):
    changelist = reverse("admin:fleet_node_changelist")
    assert "declare_nodes_dead" in superuser_client.get(changelist).content.decode()
    form = {"action": "declare_nodes_dead", "_selected_action": [fleet[0].pk]}
    response = superuser_client.post(changelist, form)
    assert response.status_code == 200 and 'name="reason"' in response.content.decode()
    assert Node.objects.get(pk=fleet[0].pk).status == NodeStatus.ONLINE


def test_the_admin_declares_a_node_dead_through_the_action_with_an_audit_row(superuser_client, fleet):
    changelist = reverse("admin:fleet_node_changelist")
    form = {
        "action": "declare_nodes_dead",
        "_selected_action": [fleet[0].pk],
        "apply": "1",
        "reason": "fan died",
    }
    response = superuser_client.post(changelist, form, follow=True)
    node = Node.objects.get(pk=fleet[0].pk)
    assert node.status == NodeStatus.DEAD and node.fenced_at is not None
    entry = AuditEntry.objects.get(action="node.declare_dead")
    assert (entry.actor_label, entry.reason) == ("root", "fan died")
    assert "Declare dead: 1 node(s)." in page_text(response)


def test_the_admin_re_admits_a_fenced_node_through_the_action(superuser_client, fleet):
    node_actions.do_declare_dead(None, fleet[0].pk, reason="fan died", now=timezone.now())
    changelist = reverse("admin:fleet_node_changelist")
    form = {
        "action": "readmit_nodes",
        "_selected_action": [fleet[0].pk],
        "apply": "1",
        "reason": "fan replaced",
    }
    superuser_client.post(changelist, form)
    assert Node.objects.get(pk=fleet[0].pk).fenced_at is None
    assert AuditEntry.objects.filter(action="node.readmit", actor_label="root").exists()
