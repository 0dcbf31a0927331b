"""/metrics through prometheus-client (issue 49, item 3): every series described (HELP, TYPE), the four histograms
fed where their events happen, and the metrics directory's rules. The live halves, over real Daphnes, are in
tests/test_metrics_live.py and tests/test_metrics_multiprocess.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Node
from leases import pass_metrics
from leases.lifecycle import LeaseState
from leases.models import Lease
from leases.planning.passes import planning
from leases.scheduling.records import Change
from slotkeeper import metrics
from slotkeeper.auth import node_tokens
from slotkeeper.heartbeat_route import VIEW_NAME
from slotkeeper.timing import route_of
from tests.conftest import healthy
from tests.leases.conftest import fleet, intent  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]


def families(text: str) -> dict[str, dict[str, str]]:
    """Each family of an exposition: its HELP, its TYPE and the names of its samples."""
    found: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            found.setdefault(name, {"samples": set()})["help"] = help_
        elif line.startswith("# TYPE "):
            name, _, type_ = line[7:].partition(" ")
            found.setdefault(name, {"samples": set()})["type"] = type_
        elif line and not line.startswith("#"):
            sample = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            named = {sample} | {sample.removesuffix(end) for end in ("_bucket", "_sum", "_count")}
            family = next((f for f in found if f in named), None)
            assert family is not None, f"{sample} comes before its HELP and TYPE"
            found[family]["samples"].add(sample)
    return found


def test_every_metric_the_code_counts_is_described():
    """A name passed to `inc`, `observe`, `add_gauge` or `set_gauge` anywhere in the code has its HELP and kind in
    slotkeeper/metrics.py: an undescribed one would be counted as "(not described)"."""
    called = set()
    for path in [*ROOT.glob("slotkeeper/**/*.py"), *ROOT.glob("fleet/**/*.py"), *ROOT.glob("leases/**/*.py")]:
        text = path.read_text()
        called |= set(re.findall(r"metrics\.(?:inc|observe|add_gauge|set_gauge)\(\s*\"([a-z0-9_]+)\"", text))
    assert "slotkeeper_plan_passes_total" in called  # the search finds the call sites
    assert called - metrics.series() == set()


@pytest.mark.django_db
def test_every_series_on_metrics_has_help_and_type_and_the_old_names_stay(register_node, operator):
    node, agent = register_node("tank")
    agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json")
    operator.post("/api/placement/preview", {"mem_mib": 1024}, format="json")
    response = Client().get("/metrics")
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    found = families(response.content.decode())
    for name, family in found.items():
        assert family.get("help") and family.get("help") != "(not described)", name
        assert family.get("type") in {"counter", "gauge", "histogram"}, name
    types = {name: family["type"] for name, family in found.items()}
    # Names and meanings from before prometheus-client, as the dashboards and tests read them.
    assert types["slotkeeper_heartbeats_total"] == "counter"
    assert types["slotkeeper_placements_total"] == "counter"
    assert types["slotkeeper_nodes"] == "gauge"
    assert types["slotkeeper_queue_length"] == "gauge"
    assert types["slotkeeper_gc_collections_total"] == "counter"


def test_first_starts_count_a_lease_once_with_its_wait_and_type():
    sched = SimpleNamespace(
        leases={
            1: SimpleNamespace(first_start=1000.0, request=SimpleNamespace(type="best_effort", submit=940.0)),
            # Resumed at 1000: it first started at 500, in another pass.
            2: SimpleNamespace(first_start=500.0, request=SimpleNamespace(type="best_effort", submit=400.0)),
            3: SimpleNamespace(first_start=1000.0, request=SimpleNamespace(type="immediate", submit=1000.0)),
        }
    )
    changes = [
        Change(1000.0, 1, "lease_state", state=LeaseState.READY),
        Change(1000.0, 1, "lease_state", state=LeaseState.ACTIVE),
        Change(1000.0, 1, "lease_state", state=LeaseState.ACTIVE),  # named twice in one journal: once
        Change(1000.0, 2, "lease_state", state=LeaseState.ACTIVE),
        Change(1000.0, 3, "lease_state", state=LeaseState.ACTIVE),
        Change(1000.0, 4, "lease_state", state=LeaseState.ACTIVE),  # not the scheduler's (gone): skipped
    ]
    assert pass_metrics.first_starts(sched, changes) == [("best_effort", 60.0), ("immediate", 0.0)]


def test_a_pass_is_timed_and_the_leases_it_starts_have_their_wait_counted_on_commit(
    fleet,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    now = timezone.now()
    count = metrics.value("slotkeeper_plan_pass_duration_seconds_count")
    waited = metrics.value("slotkeeper_lease_wait_seconds_count", type="best_effort")
    waited_s = metrics.value("slotkeeper_lease_wait_seconds_sum", type="best_effort")
    for i in range(2):
        intent(f"w{i}", now - timedelta(seconds=30), cores=2, count=2)
    with django_capture_on_commit_callbacks(execute=True) as callbacks, planning(now):
        pass
    assert Lease.objects.filter(state=LeaseState.ACTIVE).count() == 2
    assert callbacks, "the waits wait for the commit"
    assert metrics.value("slotkeeper_plan_pass_duration_seconds_count") == count + 1
    assert metrics.value("slotkeeper_plan_batch_size_last") == 2
    assert metrics.value("slotkeeper_plan_pass_seconds_last") > 0
    assert metrics.value("slotkeeper_lease_wait_seconds_count", type="best_effort") == waited + 2
    assert metrics.value("slotkeeper_lease_wait_seconds_sum", type="best_effort") == pytest.approx(
        waited_s + 60, abs=2
    )


def test_heartbeat_ages_are_measured_against_the_stored_one_and_each_other():
    t = timezone.now()
    stored = {1: t - timedelta(seconds=5), 2: None, 3: t}
    received = {
        1: [t, t + timedelta(seconds=1)],
        2: [t, t + timedelta(seconds=5)],  # its first heartbeat ever has no age; its next one has
        3: [t - timedelta(seconds=1)],  # older than what another process stored already: no age
    }
    assert metrics_ages(stored, received) == [5.0, 1.0, 5.0]


def metrics_ages(stored, received):
    from fleet.heartbeats import ages_since

    return ages_since(stored, received)


@pytest.mark.django_db
def test_a_heartbeat_through_the_view_counts_its_age_when_it_reads_the_node_row(register_node):
    node, agent = register_node("tank")
    count = metrics.value("slotkeeper_heartbeat_age_seconds_count")
    agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json")  # its first ever: no age
    assert metrics.value("slotkeeper_heartbeat_age_seconds_count") == count
    node_tokens.clear()  # as in a process that has not seen the token: the view reads the node row
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=7))
    within_8, within_6 = (
        metrics.value("slotkeeper_heartbeat_age_seconds_bucket", le=le) for le in ("8.0", "6.0")
    )
    agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json")
    assert metrics.value("slotkeeper_heartbeat_age_seconds_count") == count + 1
    assert metrics.value("slotkeeper_heartbeat_age_seconds_bucket", le="8.0") == within_8 + 1
    assert metrics.value("slotkeeper_heartbeat_age_seconds_bucket", le="6.0") == within_6
    # A token the process knows: the view reads no node row (tests/fleet/test_node_tokens.py), so no age.
    agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json")
    assert metrics.value("slotkeeper_heartbeat_age_seconds_count") == count + 1


@pytest.mark.django_db
def test_a_buffered_flush_counts_the_ages_of_what_it_wrote(register_node):
    from fleet.actions import HealthReport
    from fleet.heartbeats import Pending
    from leases.instances.actions import heartbeats
    from slotkeeper.auth import node_token_of

    node, _ = register_node("tank")
    Node.objects.filter(pk=node.pk).update(
        status="online", last_heartbeat_at=timezone.now() - timedelta(seconds=12)
    )
    node.refresh_from_db()
    token = node_token_of(node)
    now = timezone.now()
    report = HealthReport(**{k: v for k, v in healthy().items() if k != "instances"}, instances=())
    before = metrics.value("slotkeeper_heartbeat_age_seconds_count")
    summed = metrics.value("slotkeeper_heartbeat_age_seconds_sum")
    done = heartbeats.flush({node.pk: [Pending(token=token, report=report, at=now)]})
    assert done.set_based + done.per_node == 1
    assert metrics.value("slotkeeper_heartbeat_age_seconds_count") == before + 1
    assert metrics.value("slotkeeper_heartbeat_age_seconds_sum") == pytest.approx(summed + 12, abs=1)


def test_the_fast_route_names_heartbeats_as_the_view_does():
    from django.urls import resolve

    assert resolve("/api/nodes/7/heartbeat").view_name == VIEW_NAME


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/healthz", "healthz"),  # answered by ProbeMiddleware before resolving
        ("/api/leases/41/", "api:lease-detail"),  # a name, never the id
        ("/no/such/page", "unmatched"),
    ],
)
def test_a_request_is_named_by_its_url_pattern(path, route):
    assert route_of(SimpleNamespace(resolver_match=None, path_info=path)) == route


def run_python(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in (metrics.ENV, metrics.MADE_HERE)} | env
    done = subprocess.run(
        [sys.executable, "-c", code], env=environ, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


PRINT_DIRECTORY = "from slotkeeper import metrics; print(metrics.DIRECTORY)"


def test_a_process_started_without_a_directory_makes_its_own_and_removes_it_at_exit():
    made = run_python(PRINT_DIRECTORY)
    assert made.startswith(os.path.join(tempfile.gettempdir(), "slotkeeper-metrics-"))
    assert not os.path.exists(made)


def test_a_directory_left_by_a_process_that_died_is_removed_by_the_next_one():
    # A process stopped by the shutdown's deadline (os._exit) or killed runs no atexit hook.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    left = tempfile.mkdtemp(prefix=f"{metrics.ORPHAN_PREFIX}{pid}-")
    alive = tempfile.mkdtemp(prefix=f"{metrics.ORPHAN_PREFIX}{os.getpid()}-")
    try:
        run_python(PRINT_DIRECTORY)
        assert not os.path.exists(left)
        assert os.path.exists(alive), "a running process's directory is its own"
    finally:
        os.rmdir(alive)


def test_a_process_started_by_one_that_made_its_directory_makes_another(tmp_path):
    # What a Daphne started by `manage.py demo`, or by the tests, inherits: its parent's own directory.
    inherited = str(tmp_path / "parents")
    made = run_python(PRINT_DIRECTORY, **{metrics.ENV: inherited, metrics.MADE_HERE: inherited})
    assert made != inherited


def test_a_configured_directory_is_shared_and_kept(tmp_path):
    shared = str(tmp_path / "shared")
    assert run_python(PRINT_DIRECTORY, **{metrics.ENV: shared}) == shared
    code = "from slotkeeper import metrics; metrics.inc('slotkeeper_ticks_total'); print(metrics.DIRECTORY)"
    run_python(code, **{metrics.ENV: shared})
    run_python(code, **{metrics.ENV: shared})
    ticks = run_python(
        "from slotkeeper import metrics; print(metrics.value('slotkeeper_ticks_total'))",
        **{metrics.ENV: shared},
    )
    assert float(ticks) == 2  # two processes' counters, summed


@pytest.mark.django_db
def test_metrics_answers_a_scrape_by_pod_ip_as_the_probes_do():
    """Prometheus' Kubernetes discovery scrapes by pod IP, which is not in ALLOWED_HOSTS."""
    response = Client(HTTP_HOST="10.1.2.3:8000").get("/metrics")
    assert response.status_code == 200
    assert b"# TYPE slotkeeper_nodes gauge" in response.content
