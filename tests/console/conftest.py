"""Console personas as signed-in browsers (session cookies, not tokens), and a small fleet with leases on it."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from fleet import actions as fleet_actions
from leases.instances.actions import nodes as node_actions
from leases.planning import restore
from slotkeeper.management.commands.issue_token import grant_role


@pytest.fixture(autouse=True)
def _fresh_scheduler_cache():
    # Tests roll the database back between cases; a scheduler cached in this process must not outlive that.
    restore.drop_cache()
    yield
    restore.drop_cache()


def signed_in(username: str, role: str) -> Client:
    user = get_user_model().objects.create_user(username=username, password="x")
    grant_role(user, role)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def vera(db):
    return signed_in("vera", "viewer")


@pytest.fixture
def otto(db):
    return signed_in("otto", "operator")


@pytest.fixture
def ada(db):
    return signed_in("ada", "admin")


def heartbeat(node, *, used_mib=1000, total_mib=8192, now=None):
    report = fleet_actions.HealthReport(
        mem_total_mib=total_mib, mem_used_mib=used_mib, disk_free_gib=90.0, cpu_pct=3.0, load1=0.1
    )
    return node_actions.do_heartbeat(node, report, now=now or timezone.now())


def register(name: str, *, cores=4, mem_mib=8192, capabilities=()):
    node, _ = fleet_actions.do_register_node(
        None,
        name=name,
        cpu_cores=cores,
        mem_total_mib=mem_mib,
        disk_total_gib=100,
        capabilities=list(capabilities),
        now=timezone.now(),
    )
    return node


@pytest.fixture
def fleet(db):
    """Three heartbeating nodes of 4 cores and 8 GiB: tank (gpu), architect, morpheus."""
    names = [("tank", ["gpu"]), ("architect", []), ("morpheus", [])]
    return [heartbeat(register(name, capabilities=caps)) for name, caps in names]


def vm(cores=1, mem=1024):
    return {"cpu_cores": cores, "mem_mib": mem, "disk_gib": 0}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # The browser tests' page fixture looks at this on teardown to keep a screenshot of a failure.
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per browser-test module."""
    from playwright.sync_api import sync_playwright

    from tests.console.live import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
