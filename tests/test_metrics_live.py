"""`curl /metrics` against a real Daphne (issue 49, item 3): every series with HELP and TYPE, the four histograms
fed by real heartbeats, a real lease and real planning passes; and the Grafana dashboard and the Prometheus alert
rules in deploy/ name only series that this output has, so neither can drift from the code."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from slotkeeper import metrics
from tests.console import live
from tests.test_metrics import families

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "slotkeeper-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
HISTOGRAMS = {
    "slotkeeper_http_request_duration_seconds",
    "slotkeeper_plan_pass_duration_seconds",
    "slotkeeper_heartbeat_age_seconds",
    "slotkeeper_lease_wait_seconds",
}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return answer.read().decode()


def sample_value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def scraped(tmp_path_factory) -> str:
    """One live console (SQLite, the embedded loop ticking) after two heartbeats a node, a preview and a lease
    that starts: its /metrics once all four histograms have something."""
    console = live.start(tmp_path_factory.mktemp("metrics-live"))
    try:
        for _ in range(2):
            for name in console.nodes:
                console.heartbeat(name, used_mib=2048)
            time.sleep(0.5)  # past a flush (HEARTBEAT_FLUSH_S): the second heartbeat's age is measured
        token = console.operator_token
        console.api("POST", "/api/placement/preview", token, {"mem_mib": 512})
        body = {"name": "metrics-live", "type": "best_effort", "duration_s": 600, "nodes": [{"mem_mib": 512}]}
        console.api("POST", "/api/leases/", token, body)
        deadline = time.monotonic() + 20
        while True:
            text = scrape(console.url)
            if sample_value(text, 'slotkeeper_lease_wait_seconds_count{type="best_effort"}') >= 1:
                break
            assert time.monotonic() < deadline, "the lease never started"
            time.sleep(0.5)
        return scrape(console.url)  # the scrapes above are counted in this one
    finally:
        live.stop(console.process)


def test_curl_metrics_shows_help_and_type_for_every_series_and_the_four_histograms(scraped):
    found = families(scraped)
    for name, family in found.items():
        assert family.get("help") and family["help"] != "(not described)", name
        assert family.get("type") in {"counter", "gauge", "histogram"}, name
        assert family["samples"], name
    assert {name for name, family in found.items() if family["type"] == "histogram"} == HISTOGRAMS
    for name in HISTOGRAMS:
        assert {f"{name}_bucket", f"{name}_sum", f"{name}_count"} <= found[name]["samples"], name
    assert sample_value(scraped, "slotkeeper_heartbeat_age_seconds_count") >= 3  # every node's second
    assert sample_value(scraped, "slotkeeper_plan_pass_duration_seconds_count") >= 1
    assert set(found) <= metrics.series()


def test_requests_are_timed_by_route_name_and_status_class_never_by_path(scraped):
    labels = re.findall(
        r'^slotkeeper_http_request_duration_seconds_count\{route="([^"]*)",status_class="([^"]*)"\} (\S+)$',
        scraped,
        re.MULTILINE,
    )
    counted = {(route, status): float(n) for route, status, n in labels}
    # Six heartbeats, each answered by the route in front of Django or (a token's first) by the view: one name.
    assert counted[("api:node-heartbeat", "2xx")] == 6
    assert counted[("metrics", "2xx")] >= 1
    assert counted[("api:lease-list", "2xx")] == 1
    assert {status for _, status in counted} <= {"1xx", "2xx", "3xx", "4xx", "5xx", "closed"}
    assert not [route for route, _ in counted if "/" in route or re.search(r"\d", route)]


def referenced(expressions: list[str]) -> set[str]:
    """The series an expression reads: a histogram's by its family name."""
    names = set()
    for expr in expressions:
        for name in re.findall(r"\bslotkeeper_[a-z0-9_]+", expr):
            for end in ("_bucket", "_sum", "_count"):
                if name.endswith(end) and name.removesuffix(end) in HISTOGRAMS:
                    name = name.removesuffix(end)
            names.add(name)
    return names


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "slotkeeper" and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    exprs = []
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        exprs += [target["expr"] for target in panel["targets"]]
    return exprs


def alert_rules() -> list[dict]:
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert (
            rule["alert"] and rule["expr"] and rule["labels"]["severity"] and rule["annotations"]["summary"]
        )
    return rules


def test_the_alert_rules_cover_a_stalled_tick_a_disrupted_fleet_and_rising_rejections():
    names = {rule["alert"] for rule in alert_rules()}
    assert {"SlotkeeperTickStalled", "SlotkeeperFleetDisrupted", "SlotkeeperRejectionRateRising"} <= names


# The pool's series appear only where there is a pool (PostgreSQL with DB_POOL), not on this SQLite console.
POOL = set(metrics.POOL_LEVELS.values()) | set(metrics.POOL_TOTALS.values())


def test_the_dashboard_and_the_alerts_read_only_series_that_metrics_shows(scraped):
    shown = set(families(scraped))
    exprs = dashboard_expressions() + [rule["expr"] for rule in alert_rules()]
    names = referenced(exprs)
    assert {
        "slotkeeper_nodes",
        "slotkeeper_last_tick_age_seconds",
        "slotkeeper_lease_submissions_total",
    } <= names
    assert names - shown - POOL == set()
    assert names & POOL <= metrics.series()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs Prometheus' promtool on PATH")
def test_promtool_accepts_the_rules_and_every_dashboard_query(tmp_path):
    subprocess.run(["promtool", "check", "rules", str(ALERTS)], check=True, capture_output=True)
    queries = [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(dashboard_expressions())]
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": queries}]}))
    subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "queries.yml")], check=True, capture_output=True
    )
