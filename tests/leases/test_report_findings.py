"""What bench/bench_reports.py and bench/capacity_scenario.py found in the reports (issue 11): a placed lease's
summary said the fleet held none of it, and a report of a lease most nodes lack a capability for was 56 KiB (each
node's exclusion sentence stored again). Both failed before the fix."""

from __future__ import annotations

import json

import pytest

from fleet import reports
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def test_a_placed_lease_s_summary_does_not_say_the_fleet_holds_none_of_it(operator, fleet):
    whole_node = vm(cores=4, mem=8192)  # each node allocates exactly one
    for _ in range(3):
        body = {"name": "fill", "type": "immediate", "duration_s": 3600, "nodes": [whole_node]}
        assert operator.post("/api/leases/", body, format="json").status_code == 201
    body = {"name": "last", "type": "immediate", "duration_s": 3600, "nodes": [whole_node]}
    response = operator.post("/api/leases/", body, format="json")
    assert response.status_code == 201
    report = operator.get(f"/api/leases/{response.json()['id']}/").json()["placement_reports"][0]
    assert report["outcome"] == "placed" and len(report["chosen"]) == 1
    assert "the fleet holds 0" not in report["summary"], report["summary"]


class Verdict:
    """One node's verdict shaped as bench_reports.py measured them at 1,000 nodes: three node sizes, 5 % excluded
    with their own sentence, a lease needing a capability three quarters of the nodes lack (the sentence the
    scheduler gives each of them), busy nodes naming up to five leases in the way."""

    def __init__(self, node: int) -> None:
        shape = node % 10
        self.node, self.dim, self.need = node, "mem", 8192
        self.allocatable = (26624, 124928, 256000)[0 if shape < 3 else 1 if shape < 8 else 2]
        self.free = self.allocatable - 4096 * (node % 17)
        self.rank, self.chosen, self.blockers, self.note = None, False, (), ""
        if node % 20 == 0:
            self.holds, self.code, self.note = 0, "draining", "an operator cordoned this node"
        elif shape < 8:
            self.holds, self.code, self.note = 0, "missing_capability", "lacks gpu"
        elif node % 3 == 0:
            self.holds, self.code = 0, "at_capacity"
            self.blockers = tuple(range(node * 10, node * 10 + 5))
        else:
            self.holds, self.code, self.rank = 1, None, node


def test_a_report_whose_lease_most_nodes_cannot_take_for_a_capability_is_stored_in_40_kib():
    blob = reports.encode([Verdict(n) for n in range(1, 1001)], start=1.8e9, end=1.8e9 + 3600, summary="x")
    assert len(json.dumps(blob)) <= 40 * 1024, f"{len(json.dumps(blob)) / 1024:.1f} KiB"
