"""Shared fixtures: the named personas (viewer, operator, admin, an agent) and a clock.

Personas instead of random factories: a failing test then reads as "the viewer could drain a node", not as
"user_4817 could".
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from asgiref import sync
from django.conf import settings
from rest_framework.test import APIClient

from slotkeeper.management.commands.issue_token import issue

requires_postgres = pytest.mark.skipif(
    not settings.IS_POSTGRES, reason="needs PostgreSQL (set DATABASE_URL); runs in CI's second pass"
)
requires_redis = pytest.mark.skipif(
    not settings.REDIS_URL, reason="needs Redis (set REDIS_URL); runs in CI's second pass"
)

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _no_embedded_loop(settings):
    settings.EMBEDDED_LOOP = False


@pytest.fixture(autouse=True)
def _no_plan_listener_left():
    # A request that waited for a planning pass started this process's LISTEN connection (slotkeeper/planwake.py);
    # left open it would keep the test database from being dropped.
    yield
    from slotkeeper import planwake

    planwake.stop()


@pytest.fixture(autouse=True)
def _fresh_node_tokens():
    # The process's remembered node tokens (slotkeeper.auth): each test starts without any, as a new process would.
    from slotkeeper.auth import node_tokens

    node_tokens.clear()
    yield
    node_tokens.clear()


@pytest.fixture(autouse=True)
def _forecast_cost_unlearned(monkeypatch):
    # What an inline queue forecast cost is learned per process (leases/forecasting.py): each test starts from
    # the default, whatever the tests before it planned.
    from leases import forecasting

    monkeypatch.setattr(forecasting, "_per_unit_s", forecasting.INLINE_BUDGET_S / forecasting.INLINE_WORK)


@pytest.fixture
def t0():
    return T0


def client_with_token(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def anonymous():
    return APIClient()


@pytest.fixture
def viewer(db):
    return client_with_token(issue("vera", "viewer"))


@pytest.fixture
def operator(db):
    return client_with_token(issue("otto", "operator"))


@pytest.fixture
def admin(db):
    return client_with_token(issue("ada", "admin"))


@pytest.fixture
def register_node(db):
    """Registers a node through the action layer and returns (node, an API client holding its token)."""
    from fleet import actions

    def make(name="tank", cpu_cores=16, mem_total_mib=61440, disk_total_gib=500, capabilities=(), now=None):
        node, token = actions.do_register_node(
            None,
            name=name,
            cpu_cores=cpu_cores,
            mem_total_mib=mem_total_mib,
            disk_total_gib=disk_total_gib,
            capabilities=list(capabilities),
            now=now or T0,
        )
        return node, client_with_token(token)

    return make


def healthy(
    mem_total_mib=61440, mem_used_mib=6144, disk_free_gib=400.0, cpu_pct=5.0, load1=0.3, instances=()
):
    return {
        "mem_total_mib": mem_total_mib,
        "mem_used_mib": mem_used_mib,
        "disk_free_gib": disk_free_gib,
        "cpu_pct": cpu_pct,
        "load1": load1,
        "instances": list(instances),
    }


@pytest.fixture
def hops(monkeypatch):
    """Counts the sync_to_async hand-offs made while the test runs (the one-hop handler makes one a request)."""
    counted = {"n": 0}
    original = sync.SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        counted["n"] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counting)
    return counted


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A module whose tests share a module-scoped fixture (a live console, a Daphne, a Chromium) runs on one xdist
    worker. Under `--dist loadgroup` an ungrouped module's tests are dealt out one by one, and every worker that got
    one started the module's console for itself: a browser module of three tests started three consoles (about 10 s
    of CPU each on the two-core machine). Before xdist's own hook, which reads the group into the test's id."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures and any(d.scope == "module" for defs in fixtures.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
