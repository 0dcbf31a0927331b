"""The paged lease list in a real headless Chromium against a real Daphne: the pager moves through the pages in
place and keeps each in the URL, and a live refresh re-fetches the page being viewed, not page 1 (the list showed
the newest 200 leases on every page, and its refresh asked for the plain list).

Screenshots of failures land in test-artifacts/. Skipped only when Debian's chromium is not installed.
"""

from __future__ import annotations

import re

import pytest

from tests.console import live

pytestmark = live.BROWSER_TEST

# Leases pg-000 ... pg-249, newer than anything the seeded console holds: pg-249 is the newest.
MAKE_LEASES = """
from datetime import timedelta
from django.utils import timezone
from leases.models import Lease
base = timezone.now() + timedelta(hours=1)
Lease.objects.bulk_create(
    Lease(name=f"pg-{i:03d}", type="best_effort", state="queued", submitted_at=base + timedelta(seconds=i),
          duration_s=600, vnodes=[{"cpu_cores": 1, "mem_mib": 512, "disk_gib": 0}])
    for i in range(%d, %d)
)
"""


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("console-lease-list")
    server = live.start(workdir)
    live.shell(workdir, MAKE_LEASES % (0, 250))
    server.workdir = workdir
    yield server
    live.stop(server.process)


@pytest.fixture(scope="module")
def operator(browser, console):
    context = live.sign_in(browser, console, "otto", live.PASSWORD)
    yield context
    context.close()


@pytest.fixture
def page(operator, request):
    return live.new_page(operator, request)


def first_row(page) -> str:
    return page.locator("#lease-table tbody tr a").first.inner_text()


def test_the_pager_moves_in_place_and_a_live_refresh_keeps_the_page(page, console):
    page.goto(console.url + "/leases/")
    assert first_row(page).endswith("pg-249")
    page.click("#lease-pager a[rel=next]")
    page.wait_for_url(console.url + "/leases/?page=2")
    page.wait_for_function("document.querySelector('#lease-table tbody tr a').textContent.endsWith('pg-149')")
    assert page.locator("#lease-pager [aria-current=page]").inner_text() == "page 2 of 3"
    assert page.locator("#lease-pager [data-showing]").inner_text().startswith("Leases 101–200 of ")

    # A newer lease moves every row one down the list; the live refresh of page 2 must show page 2 moved.
    live.shell(console.workdir, MAKE_LEASES % (250, 251))
    page.evaluate("document.body.dispatchEvent(new CustomEvent('lease-changed'))")
    page.wait_for_function("document.querySelector('#lease-table tbody tr a').textContent.endsWith('pg-150')")
    assert page.url == console.url + "/leases/?page=2"
    assert page.locator("#lease-pager [aria-current=page]").inner_text() == "page 2 of 3"

    # Back is page 1 again (the pager pushed each page into the history).
    page.go_back()
    page.wait_for_url(console.url + "/leases/")
    page.wait_for_function(
        "document.querySelector('#lease-pager [aria-current=page]').textContent === 'page 1 of 3'"
    )


def test_a_live_refresh_in_flight_when_the_pager_moves_does_not_bring_the_old_page_back(page, console):
    """A live refresh of page 1 still on its way when the operator moved to page 2 landed after page 2 and put page
    1's rows back under page 2's URL (seen under load in CI). A region's own refresh that asked for another state
    than the region shows when it lands is not swapped in: the refresh is held here until page 2 is shown, then let
    go."""
    held = []

    def hold(route):
        if route.request.headers.get("hx-request") and "page=" not in route.request.url:
            held.append(route)  # the live refresh of page 1: answered only when the test says so
        else:
            route.continue_()

    page.goto(console.url + "/leases/")
    page.route(re.compile(r"/leases/(\?.*)?$"), hold)
    page.evaluate("document.body.dispatchEvent(new CustomEvent('lease-changed'))")
    for _ in range(50):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the live refresh was asked for"
    page.click("#lease-pager a[rel=next]")
    page.wait_for_url(console.url + "/leases/?page=2")
    page.wait_for_function(
        "document.querySelector('#lease-pager [aria-current=page]').textContent === 'page 2 of 3'"
    )
    held[0].continue_()
    page.wait_for_timeout(1_500)
    assert page.locator("#lease-pager [aria-current=page]").inner_text() == "page 2 of 3"
    assert page.url == console.url + "/leases/?page=2"
