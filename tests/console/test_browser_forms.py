"""The console's forms in a real headless Chromium against a real Daphne: an operator submits each type of lease and
reads its decision, previews a placement, cancels a lease and resolves an alert; an admin declares a node dead and
re-admits it; and the API docs render with the network cut off (Swagger UI from our own static files).

Screenshots of failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.console import live

pytestmark = live.BROWSER_TEST

ADMIN_PASSWORD = "console-test-admin-password"
MAKE_ADMIN = """
from django.contrib.auth import get_user_model
from slotkeeper.management.commands.issue_token import grant_role
user = get_user_model().objects.create_user(username="ada", password=%r)
grant_role(user, "admin")
"""


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("console-forms")
    server = live.start(workdir)
    live.shell(workdir, MAKE_ADMIN % ADMIN_PASSWORD)
    for name in server.nodes:
        server.heartbeat(name, used_mib=2048)
    yield server
    live.stop(server.process)


@pytest.fixture(scope="module")
def operator(browser, console):
    context = live.sign_in(browser, console, "otto", live.PASSWORD)
    yield context
    context.close()


@pytest.fixture(scope="module")
def admin(browser, console):
    context = live.sign_in(browser, console, "ada", ADMIN_PASSWORD)
    yield context
    context.close()


@pytest.fixture
def page(operator, request):
    return live.new_page(operator, request)


@pytest.fixture
def admin_page(admin, request):
    return live.new_page(admin, request)


def submit_lease(page, console, *, name: str, type_: str, vms: int = 1, mem_mib: int = 2048, **extra) -> str:
    """Fills the lease form as a person would and returns the state the lease's page shows after the redirect."""
    page.goto(console.url + "/leases/")
    page.click("#new-lease")
    page.fill("input[name=name]", name)
    page.check(f"input[name=type][value={type_}]")
    page.fill("input[name=duration_s]", str(extra.get("duration_s", 1800)))
    page.fill("input[name=vms]", str(vms))
    page.fill("input[name=mem_mib]", str(mem_mib))
    if "start" in extra:
        page.fill("input[name=start]", extra["start"])
    if "capabilities" in extra:
        page.fill("input[name=capabilities]", extra["capabilities"])
    if extra.get("preemptible") is False:
        page.uncheck("input[name=preemptible]")
    page.click("#submit-lease")
    page.wait_for_url(f"{console.url}/leases/*/")
    assert name in page.locator("h1").inner_text()
    return page.locator("#lease-body [data-state]").inner_text()


def test_an_operator_submits_a_best_effort_lease_and_reads_its_decision(page, console):
    state = submit_lease(page, console, name="be-from-form", type_="best_effort")
    assert state in {"active", "ready", "scheduled", "queued"}
    assert "be-from-form" in page.locator(".messages").inner_text()  # the decision, as a message
    assert page.locator("details.report").count() >= 1  # its placement report


def test_an_operator_submits_an_advance_reservation_and_reads_its_window(page, console):
    start = (datetime.now(UTC) + timedelta(hours=3)).replace(second=0, microsecond=0)
    state = submit_lease(
        page,
        console,
        name="ar-from-form",
        type_="advance_reservation",
        start=start.strftime("%Y-%m-%dT%H:%M"),
    )
    assert state in {"scheduled", "ready"}
    assert start.strftime("%Y-%m-%d %H:%M:00") in page.locator("#lease-reservations").inner_text()
    assert "ar-from-form" in page.locator(".messages").inner_text()


def test_an_operator_submits_an_immediate_lease_of_two_gpu_vms_and_it_runs_on_tank(page, console):
    state = submit_lease(
        page, console, name="im-from-form", type_="immediate", vms=2, capabilities="gpu", preemptible=False
    )
    assert state == "active"
    assert "not preemptible" in page.locator("#lease-body").inner_text()
    placed = page.locator("#lease-reservations tbody").inner_text()
    assert "tank" in placed and "architect" not in placed and "morpheus" not in placed


def test_an_immediate_lease_too_big_to_run_now_is_rejected_with_its_reason(page, console):
    state = submit_lease(page, console, name="im-too-big", type_="immediate", vms=8, mem_mib=8192)
    assert state == "rejected"
    assert "rejected" in page.locator(".messages").inner_text()


def test_bad_input_is_shown_beside_its_field_and_nothing_is_submitted(page, console):
    page.goto(console.url + "/leases/new")
    page.fill("input[name=name]", "no-start")
    page.check("input[name=type][value=advance_reservation]")
    page.click("#submit-lease")
    page.wait_for_selector("#start-error")
    assert page.locator("#start-error").inner_text() == "An advance reservation needs its exact start."
    assert page.locator("input[name=name]").input_value() == "no-start"


def test_a_what_if_preview_shows_the_verdict_table(page, console):
    page.goto(console.url + "/")
    page.click("#what-if")
    page.fill("input[name=mem_mib]", "4096")
    page.fill("input[name=capabilities]", "gpu")
    page.click("#run-preview")
    page.wait_for_selector("#preview-result")
    assert page.locator("#preview-result").get_attribute("data-outcome") == "placed"
    assert page.locator("[data-chosen]").all_inner_texts() == ["tank"]
    rows = page.locator("#preview-verdicts tbody tr")
    assert rows.count() == 3
    architect = page.locator('#preview-verdicts tr[data-node="architect"]')
    assert architect.locator("[data-code]").get_attribute("data-code") == "missing_capability"
    assert "lacks a capability" in architect.inner_text(), "the code is said in words"


def test_an_operator_cancels_a_lease_from_its_page(page, console):
    lease = console.api(
        "POST",
        "/api/leases",
        console.operator_token,
        {"name": "to-cancel", "type": "best_effort", "duration_s": 7200, "nodes": [{"mem_mib": 1024}]},
    )
    page.goto(f"{console.url}/leases/{lease['id']}/")
    page.click("#lease-actions summary")
    page.fill("#cancel-form input[name=reason]", "job finished early")
    page.click("#cancel-lease")
    page.wait_for_selector("#lease-body [data-state]:text('cancelled')")
    assert "cancelled" in page.locator(".messages").inner_text()
    assert page.locator("#cancel-form").count() == 0


def test_an_operator_resolves_an_alert(page, admin_page, console):
    # A node declared dead raises a node_dead alert (a rejected lease raises none: its client has its 409).
    node = console.nodes["morpheus"]
    admin_page.goto(f"{console.url}/nodes/{node['id']}/")
    admin_page.click("details.danger summary")
    admin_page.fill("details.danger input[name=reason]", "alert-maker: PSU")
    admin_page.click("#declare-dead")
    admin_page.wait_for_selector("#node-fenced")
    page.goto(console.url + "/alerts/")
    row = page.locator('tr[data-alert="node_dead"]', has_text="alert-maker")
    row.locator("summary").click()
    row.locator("input[name=reason]").fill("PSU replaced")
    row.locator("button[type=submit]").click()
    page.wait_for_selector(".messages li.success")
    assert "resolved" in page.locator(".messages").inner_text()
    assert page.locator('tr[data-alert="node_dead"]', has_text="alert-maker").count() == 0
    admin_page.fill("#node-fenced input[name=reason]", "PSU replaced")
    admin_page.click("#readmit")
    admin_page.wait_for_selector(".messages li.success")


def test_an_admin_declares_a_node_dead_and_re_admits_it(admin_page, console):
    page = admin_page
    node = console.nodes["architect"]
    page.goto(f"{console.url}/nodes/{node['id']}/")
    page.click("details.danger summary")
    page.fill("details.danger input[name=reason]", "PSU failed, ticket 88")
    page.click("#declare-dead")
    page.wait_for_selector("#node-fenced")
    assert "PSU failed, ticket 88" in page.locator("#node-fenced").inner_text()
    assert page.locator("[data-status]").first.inner_text() == "dead"
    page.fill("#node-fenced input[name=reason]", "PSU replaced")
    page.click("#readmit")
    page.wait_for_selector(".messages li.success")
    assert "re-admitted" in page.locator(".messages").inner_text()
    assert page.locator("#node-fenced").count() == 0


def test_the_operator_sees_no_declare_dead(page, console):
    page.goto(f"{console.url}/nodes/{console.nodes['tank']['id']}/")
    assert page.locator("#declare-dead").count() == 0


def test_an_empty_reschedules_page_logs_no_htmx_error(page, console):
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type in {"error", "warning"} else None)
    page.goto(console.url + "/reschedules/")
    page.wait_for_selector("#reschedules")
    page.evaluate("htmx.trigger(document.body, 'resync')")  # the live refresh that logged it
    page.wait_for_timeout(500)
    assert not [e for e in errors if "returned no matches" in e]


def test_the_api_docs_render_with_the_network_off(page, console):
    requested: list[str] = []

    def only_localhost(route):
        url = route.request.url
        if url.startswith(console.url):
            route.continue_()
        else:
            requested.append(url)
            route.abort()

    page.route("**/*", only_localhost)
    page.goto(console.url + "/api/docs/")
    page.wait_for_selector(".swagger-ui .opblock", timeout=15_000)
    assert page.locator(".swagger-ui .opblock").count() > 20
    assert "Slotkeeper API" in page.locator(".swagger-ui .info .title").inner_text()
    assert requested == []
