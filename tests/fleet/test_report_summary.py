"""A report's one-line summary (fleet/reports.py `summary`) names at most five nodes; found by an outsider, the
list read as the whole answer ("the fleet holds 20 ...: gpu-02 2, ... batch-02 2", five nodes adding up to 10)."""

from __future__ import annotations

from fleet import reports

VM = {"cpu": 100, "mem": 1024}


def test_a_list_cut_to_five_says_what_it_leaves_out():
    holds = {f"n{i:02}": 2 for i in range(10)}
    line = reports.summary(VM, 3, holds, now=True)
    assert line.endswith(": n00 2, n01 2, n02 2, n03 2, n04 2 and 10 more on 5 other nodes"), line
    assert "holds 20 now" in line


def test_one_node_left_out_is_named_in_the_singular_and_a_whole_list_adds_nothing():
    holds = {f"n{i}": 1 for i in range(6)}
    assert reports.summary(VM, 1, holds, now=True).endswith("and 1 more on 1 other node")
    whole = reports.summary(VM, 1, {"a": 3, "b": 1, "c": 0}, now=True)
    assert whole.endswith("the fleet holds 4 now: a 3, b 1"), whole


def test_a_partial_list_with_the_fleet_s_total_says_how_many_more_without_a_node_count():
    line = reports.summary(VM, 1, {"a": 3, "b": 2}, now=False, window="the next hour", total=12)
    assert line.endswith("the fleet holds 12 over the next hour: a 3, b 2 and 7 more on other nodes"), line
