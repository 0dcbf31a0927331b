"""How the console words the placer's messages (fleet/wording.py): codes in words, MiB in user units, a message cut to
its headline and its lines. The lines are the demo's (twelve nodes, a fleet at capacity), as the reschedule result
page printed them in one paragraph."""

from __future__ import annotations

import pytest

from fleet import wording

DEMO_PENDING = (
    "still pending: fleet at capacity: no capable node can take another instance of 2048 MiB, 5 GiB disk, 2 cores "
    "now; the request waits for capacity.\n"
    "  12 node(s): 8 at_capacity, 2 dead, 2 too_small\n"
    "  tank: dead: the node stopped reporting and was declared dead\n"
    "  architect: at_capacity: needs 2048 MiB; 0 MiB free after the 4096 MiB host reserve (effective use 59942 of "
    "31757 MiB: committed 59942, observed 17707; 6 instance(s) committed)\n"
    "  morpheus: at_capacity: needs 1 cores; 0 of 8 uncommitted (5 instance(s) committed)"
)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("needs 2048 MiB", "needs 2 GiB"),
        ("needs 6144 MiB", "needs 6 GiB"),
        ("1562 MiB free", "1,562 MiB free"),
        (
            "effective use 59942 of 31757 MiB: committed 59942, observed 17707;",
            "effective use 58.5 GiB of 31.0 GiB: committed 58.5 GiB, observed 17.3 GiB;",
        ),
        ("needs 1 cores; 0 of 8 uncommitted", "needs 1 core; 0 of 8 uncommitted"),
        ("no room for 1 vnode(s)", "no room for 1 vnode"),
        ("5 instance(s) committed", "5 instances committed"),
        ("2 cores, 5 GiB disk", "2 cores, 5 GiB disk"),
    ],
)
def test_figures_read_in_user_units(text, said):
    assert wording.user_units(text) == said


def test_a_message_is_a_headline_and_a_line_per_item():
    assert wording.headline(DEMO_PENDING).startswith("still pending: fleet at capacity: no capable node")
    assert wording.brief(DEMO_PENDING) == (
        "fleet at capacity: no capable node can take another instance of 2048 MiB, 5 GiB disk, 2 cores now"
    )
    lines = [wording.readable_line(line) for line in wording.detail_lines(DEMO_PENDING)]
    assert lines == [
        "12 nodes: 8 at capacity, 2 declared dead, 2 too small for one VM",
        "tank: not here: declared dead (the node stopped reporting and was declared dead)",
        "architect: not here: at capacity (needs 2 GiB; 0 MiB free after the 4 GiB host reserve (effective use "
        "58.5 GiB of 31.0 GiB: committed 58.5 GiB, observed 17.3 GiB; 6 instances committed))",
        "morpheus: not here: at capacity (needs 1 core; 0 of 8 uncommitted (5 instances committed))",
    ]


def test_a_tally_leaves_out_what_is_not_a_reason():
    assert (
        wording.tally({"evaluated": 12, "at_capacity": 8, "dead": 2, "fit": 0})
        == "8 at capacity, 2 declared dead"
    )


def test_each_verdict_line_says_which_applies():
    rows = [
        {"node": "morpheus", "node_id": 3, "fit": True, "chosen": True, "reason_code": None, "reason": None},
        {"node": "gpu-01", "node_id": 4, "fit": True, "chosen": False, "reason_code": None, "reason": None},
        {
            "node": "tank",
            "node_id": 1,
            "fit": False,
            "chosen": False,
            "reason_code": "at_capacity",
            "reason": "4 GiB of memory free now of 10 GiB allocatable; one VM needs 6 GiB",
        },
    ]
    lines, more = wording.verdict_lines(rows, limit=2)
    assert [(v.node, v.verdict) for v in lines] == [("morpheus", "placed here"), ("gpu-01", "fits")]
    assert more == 1
    [tank], _ = wording.verdict_lines(rows[2:], limit=5)
    assert (tank.verdict, tank.kind) == ("not here: at capacity", "unfit")
    assert "one VM needs 6 GiB" in tank.reason


def test_times_in_a_sentence_become_time_elements_and_the_rest_is_escaped():
    html = wording.with_times(
        "runs 2026-11-30 15:40:54 UTC–2026-11-30 16:00:54 UTC on <tank>; over 2026-11-30T15:40Z"
    )
    assert html.count("<time ") == 3
    assert '<time datetime="2026-11-30T15:40:54Z">2026-11-30 15:40:54 UTC</time>' in html
    assert '<time datetime="2026-11-30T15:40:00Z">2026-11-30 15:40 UTC</time>' in html
    assert "&lt;tank&gt;" in html


def test_a_stored_request_reads_as_a_person_says_it():
    request = {"mem_mib": 2048, "disk_gib": 5, "cpu_cores": 1.0, "capabilities": [], "count": 1,
               "preferred_node": "gpu-01"}  # fmt: skip
    assert wording.request_words(request) == "1 × (1 core, 2 GiB, 5 GiB disk), preferred node gpu-01"


def test_a_reservation_reads_in_cores_and_gib_on_the_node_page():
    # gpu-01 in the demo listed "32768 MiB" and "800%" (hundredths of a core) for an 8-core, 32 GiB lease.
    assert (wording.mem(32768), wording.cores_of(800)) == ("32 GiB", "8 cores")
    assert (wording.mem(1562), wording.cores_of(100), wording.cores_of(50)) == (
        "1,562 MiB",
        "1 core",
        "0.5 cores",
    )


def test_a_request_as_the_scheduler_was_asked_reads_as_a_person_says_it():
    """Every decision's and preview's report stores the request in the scheduler's form (vnodes, type, duration):
    its page said "1 × ()" for all of them."""
    vm = {"cpu_cores": 1.0, "mem_mib": 2048, "disk_gib": 5}
    request = {"type": "best_effort", "vnodes": [vm, vm], "duration_s": 1200.0}
    assert wording.request_words(request) == "best-effort, 2 × (1 core, 2 GiB, 5 GiB disk) for 20 min"
    mixed = {
        "type": "advance_reservation",
        "vnodes": [vm, {"cpu_cores": 4.0, "mem_mib": 8192}],
        "duration_s": 5400,
    }
    assert wording.request_words(mixed) == (
        "advance reservation, 1 × (1 core, 2 GiB, 5 GiB disk) + 1 × (4 cores, 8 GiB) for 1 h 30 min"
    )
    assert (
        wording.request_words({"type": "immediate"}) == "immediate"
    )  # a request the scheduler could not plan


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(45, "45 s"), (60, "1 min"), (1200, "20 min"), (7200, "2 h"), (5400, "1 h 30 min"), (86400, "1 d"),
     (273600, "3 d 4 h")],
)  # fmt: skip
def test_a_duration_reads_in_the_largest_units_that_fit(seconds, said):
    assert wording.span(seconds) == said
