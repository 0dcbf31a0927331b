"""The e2e marker, when the e2e tests run (PostgreSQL and Redis configured: CI's second pass), and the one cluster
all of them share (starting it takes 10-20 s here; each test leaves it as it found it)."""

from __future__ import annotations

import os

import pytest

from tests.e2e import harness

SKIP_REASON = (
    "e2e: needs DATABASE_URL pointing at PostgreSQL and REDIS_URL set (CI's second pass); it starts its own "
    "Redis, Daphne, Celery and agents on loopback"
)


def enabled() -> bool:
    return os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")) and bool(
        os.environ.get("REDIS_URL")
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: the distributed run end to end (processes on loopback)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if enabled():
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("e2e"):
            item.add_marker(skip)


# Set when an e2e test fails, so the run's folder (every process's log) is kept for the post-mortem.
FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed and item.get_closest_marker("e2e"):
        item.session.stash[FAILED] = True
    return report


# Package scope: torn down after the last e2e test, so the rest of a full run does not share two cores with idle
# Daphnes, workers and agents heartbeating every second.
@pytest.fixture(scope="package")
def cluster(request: pytest.FixtureRequest):
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def show(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(line, flush=True)

    harness.progress_sink = show
    running = harness.Cluster(os.environ["DATABASE_URL"])
    try:
        running.start()
    except BaseException:
        running.stop()  # the folder stays: its logs say why the run did not come up
        raise
    try:
        yield running
    finally:
        running.stop()
        if not request.session.stash.get(FAILED, False):
            running.discard()
