"""The trace readers, on every shipped Haizea trace and on small broken ones (no database)."""

from pathlib import Path

import pytest

from leases.slottable import Res
from leases.traces import (
    ADVANCE_RESERVATION,
    BEST_EFFORT,
    DEADLINE,
    IMMEDIATE,
    TraceError,
    merge_traces,
    parse_reltime,
    parse_resources,
    read_injection,
    read_lwf,
    read_swf,
    read_trace,
)
from slotkeeper import shared

HAIZEA = shared.HAIZEA
VM = Res(cpu=100, mem=1024)
FOUR_NODE_SITE = (VM,) * 4


def listing(folder: str, pattern: str) -> list[Path]:
    return sorted((HAIZEA / folder).glob(pattern))


def ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


# ------------------------------------------------------------------------------------------ shipped LWF files

# file -> (leases, ARs, deadline leases, leases with a <realduration>, site nodes); counted with grep, apart
# from this reader. Every other lease is best-effort.
LWF_FACTS = {
    "migrate.lwf": (3, 2, 0, 0, 4),
    "preemption.lwf": (2, 1, 0, 0, 4),
    "preemption_prematureend.lwf": (2, 1, 0, 1, 4),
    "preemption_prematureend2.lwf": (2, 1, 0, 2, 4),
    "reservation.lwf": (2, 0, 0, 0, 4),
    "reservation_prematureend.lwf": (2, 0, 0, 1, 4),
    "reuse1.lwf": (2, 1, 0, 0, 4),
    "reuse2.lwf": (3, 2, 0, 0, 4),
    "wait.lwf": (8, 0, 0, 0, 4),
    "deadline1.lwf": (2, 0, 2, 0, 4),
    "deadline2.lwf": (2, 0, 2, 0, 4),
    "deadline3.lwf": (2, 0, 2, 0, 4),
    "deadline4.lwf": (2, 0, 2, 0, 4),
    "deadline5.lwf": (2, 0, 2, 0, 4),
    "deadline6.lwf": (3, 0, 3, 0, 4),
    "deadline7.lwf": (3, 0, 3, 0, 4),
    "deadline8.lwf": (3, 0, 3, 0, 4),
    "deadline9.lwf": (3, 0, 3, 0, 4),
    "deadline10-1.lwf": (3, 0, 3, 3, 4),
    "deadline10-2.lwf": (3, 0, 3, 3, 4),
    "deadline10-3.lwf": (3, 0, 3, 3, 4),
    "deadline10-4.lwf": (3, 0, 3, 1, 4),
    "deadline10-5.lwf": (3, 0, 3, 1, 4),
    "deadline10-6.lwf": (3, 0, 3, 1, 4),
    "deadline10-7.lwf": (3, 0, 3, 2, 4),
    "deadline10-8.lwf": (3, 0, 3, 2, 4),
    "deadline10-9.lwf": (3, 0, 3, 2, 4),
    "deadline10-10.lwf": (3, 0, 3, 0, 4),
    "deadline10-11.lwf": (3, 0, 3, 0, 4),
    "deadline10-12.lwf": (3, 0, 3, 0, 4),
    "deadline11-1.lwf": (3, 0, 3, 0, 4),
    "deadline11-2.lwf": (3, 0, 3, 0, 4),
    "deadline12.lwf": (9, 0, 9, 0, 5),
    "deadline13.lwf": (3, 0, 3, 0, 4),
    "deadline14.lwf": (3, 0, 3, 1, 4),
    "deadline15.lwf": (4, 0, 4, 0, 4),
    "deadline16.lwf": (6, 0, 6, 1, 4),
    "piggybacking.lwf": (2, 1, 0, 0, 4),
    "prematureend_in_start.lwf": (2, 1, 0, 1, 4),
    "price1.lwf": (1, 1, 0, 0, 4),
    "price2.lwf": (1, 1, 0, 0, 4),
    "pricedeadline.lwf": (2, 0, 2, 0, 4),
    "sample.lwf": (0, 0, 0, 0, 0),  # its two example requests are commented out
    "inj1.lwf": (13, 13, 0, 0, 0),
    "inj2.lwf": (13, 13, 0, 0, 0),
    "withoutprematureend.lwf": (139, 0, 0, 0, 0),
    "withprematureend.lwf": (139, 0, 0, 139, 0),
}
LWF_FILES = [
    *listing("tests-1.0", "*.lwf"),
    *listing("tests-1.1-extra", "*.lwf"),
    *listing("traces", "*.lwf"),
    *listing("traces/multi", "*.lwf"),
]


@pytest.mark.parametrize("path", LWF_FILES, ids=ids(LWF_FILES))
def test_every_shipped_lwf_trace_reads_with_its_lease_types_and_site(path):
    leases, ars, deadlines, real, site_nodes = LWF_FACTS[path.name]
    trace = read_trace(path)
    assert len(trace.leases) == leases
    assert sum(lease.type == ADVANCE_RESERVATION for lease in trace.leases) == ars
    assert sum(lease.type == DEADLINE for lease in trace.leases) == deadlines
    assert sum(lease.type == BEST_EFFORT for lease in trace.leases) == leases - ars - deadlines
    assert sum(lease.real_duration_s is not None for lease in trace.leases) == real
    assert len(trace.site or ()) == site_nodes
    assert [lease.submit_s for lease in trace.leases] == sorted(lease.submit_s for lease in trace.leases)


def test_the_shipped_lwf_listing_is_the_one_the_facts_describe():
    assert sorted(p.name for p in LWF_FILES) == sorted(LWF_FACTS)


@pytest.mark.parametrize("path", listing("tests-1.0", "*.lwf"), ids=ids(listing("tests-1.0", "*.lwf")))
def test_haizea_1_0_test_traces_run_on_four_nodes_of_one_cpu_and_1024_mb(path):
    assert read_lwf(path).site == FOUR_NODE_SITE


def test_preemption_lwf_is_a_best_effort_hour_then_an_ar_on_all_four_nodes_at_13_30():
    first, second = read_lwf(HAIZEA / "tests-1.0/preemption.lwf").leases
    assert (first.id, first.type, first.submit_s, first.start_s, first.duration_s) == (
        1,
        BEST_EFFORT,
        0,
        None,
        3600,
    )
    assert (first.vnodes, first.preemptible, first.image, first.image_size_mb) == (
        (VM,),
        True,
        "foobar1.img",
        1024,
    )
    assert (second.id, second.type, second.submit_s, second.start_s) == (2, ADVANCE_RESERVATION, 900, 1800)
    assert (second.duration_s, second.vnodes, second.preemptible) == (1800, (VM,) * 4, False)


def test_a_deadline_lease_keeps_its_start_and_deadline_relative_to_the_workload_start():
    lease = read_lwf(HAIZEA / "tests-1.1-extra/deadline1.lwf").leases[0]
    assert (lease.type, lease.start_s, lease.deadline_s, lease.duration_s) == (DEADLINE, 1800, 6300, 1800)


def test_a_premature_end_is_the_real_duration_beside_the_requested_one():
    trace = read_lwf(HAIZEA / "traces/multi/withprematureend.lwf")
    first = trace.leases[0]
    assert (first.id, first.duration_s, first.real_duration_s) == (1, 3600, 900)


def test_software_none_means_no_image_and_a_price_trace_has_none():
    lease = read_lwf(HAIZEA / "tests-1.1-extra/price1.lwf").leases[0]
    assert (lease.image, lease.image_size_mb) == (None, None)


# ------------------------------------------------------------------------------------------ shipped SWF files

# file -> (jobs in the file, jobs cancelled while queued); the counts of SEMANTICS §7.3, checked with awk.
SWF_FACTS = {
    "150requests.swf": (150, 0),
    "200requests.swf": (200, 18),
    "600requests.swf": (600, 33),
    "1000requests.swf": (1000, 49),
    "15days.swf": (3383, 299),
    "30days.swf": (5545, 437),
    "60days.swf": (10280, 827),
}
SWF_FILES = listing("traces/blue", "*.swf")


@pytest.mark.parametrize("path", SWF_FILES, ids=ids(SWF_FILES))
def test_every_blue_horizon_subset_gives_a_best_effort_lease_per_job_not_cancelled_in_the_queue(path):
    jobs, cancelled = SWF_FACTS[path.name]
    trace = read_trace(path)
    assert len(trace.leases) + len(trace.skipped) == jobs
    assert len(trace.skipped) == cancelled
    assert {lease.type for lease in trace.leases} == {BEST_EFFORT}
    assert all(1 <= len(lease.vnodes) <= 144 for lease in trace.leases)


@pytest.mark.parametrize("path", SWF_FILES, ids=ids(SWF_FILES))
def test_every_blue_horizon_subset_starts_with_job_13_on_4_nodes_for_64800_s(path):
    first = read_swf(path).leases[0]
    assert (first.id, first.submit_s, first.duration_s, first.real_duration_s) == (13, 0, 64800, 43)
    assert (first.vnodes, first.user) == ((VM,) * 4, "96")


def test_30days_is_the_hpdc08_base_workload_of_5545_jobs_and_5108_leases():
    trace = read_swf(HAIZEA / "traces/blue/30days.swf")
    assert len(trace.leases) + len(trace.skipped) == 5545
    assert len(trace.leases) == 5108


@pytest.mark.parametrize(
    ("scale", "nodes"),
    [(1, 4), (2, 2), (3, 1), (8, 1)],  # job 13 asks for 4 nodes; a job smaller than the scale keeps one VM
)
def test_swf_scale_divides_the_processor_count_and_never_reaches_zero(scale, nodes):
    first = read_swf(HAIZEA / "traces/blue/150requests.swf", scale=scale).leases[0]
    assert len(first.vnodes) == nodes


def test_swf_vm_size_comes_from_the_caller():
    first = read_swf(HAIZEA / "traces/blue/150requests.swf", cpu=50, memory_mb=512).leases[0]
    assert first.vnodes[0] == Res(cpu=50, mem=512)


SWF_JOB = "7 {submit} 5 {run} 32 0.03 -1 {procs} 3600 -1 {status} 96 -1 -1 3 -1 -1 -1"


@pytest.mark.parametrize(
    ("run", "status", "procs", "real", "nodes"),
    [
        (0, 1, 4, 1.0, 4),  # under a second: swf2lwf makes it 1 s
        (120, 1, 4, 120.0, 4),
        (-1, 0, 4, None, 4),  # failed before running, not cancelled: run time unknown
    ],
)
def test_swf_run_times_become_real_durations(tmp_path, run, status, procs, real, nodes):
    path = tmp_path / "one.swf"
    path.write_text(SWF_JOB.format(submit=10, run=run, procs=procs, status=status) + "\n")
    (lease,) = read_swf(path).leases
    assert (lease.real_duration_s, len(lease.vnodes), lease.submit_s) == (real, nodes, 10)


def test_swf_comments_and_blank_lines_are_skipped_and_ties_keep_file_order(tmp_path):
    path = tmp_path / "ties.swf"
    lines = [SWF_JOB.format(submit=5, run=1, procs=1, status=1).replace("7 ", f"{n} ", 1) for n in (3, 1, 2)]
    path.write_text("; UnixStartTime: 0\n\n" + "\n".join(lines) + "\n")
    assert [lease.id for lease in read_swf(path).leases] == [3, 1, 2]


def test_an_swf_line_with_the_wrong_field_count_names_its_line(tmp_path):
    path = tmp_path / "short.swf"
    good = SWF_JOB.format(submit=0, run=1, procs=1, status=1)
    path.write_text(f"; header\n{good}\n{good} 99\n")
    with pytest.raises(TraceError) as caught:
        read_swf(path)
    assert str(caught.value) == f"{path}:3: an SWF job has 18 fields, this line has 19"


def test_an_swf_field_that_is_not_a_number_is_named(tmp_path):
    path = tmp_path / "bad.swf"
    path.write_text(SWF_JOB.format(submit="soon", run=1, procs=1, status=1) + "\n")
    with pytest.raises(TraceError, match=r":1: field 2 \(submit time\) is 'soon', not a number$"):
        read_swf(path)


# ------------------------------------------------------------------------------------------ legacy injections

INJECTION_FILES = listing("traces/blue/injected_leases", "*/*.lwf")
SIZES = {"1small": (1, 24), "2medium": (25, 48), "3large": (49, 72)}


def _injection_facts(path: Path) -> tuple[int, tuple[int, int], float]:
    """(hours, node range, advance notice s) from an HPDC'08 name, work_LL-dur_Hh-size_S[-NNh]."""
    parts = path.stem.split("-")
    notice = int(parts[3].rstrip("h")) * 3600 if len(parts) == 4 else 86400
    return int(parts[1].removeprefix("dur_").rstrip("h")), SIZES[parts[2].removeprefix("size_")], notice


def test_there_are_174_hpdc08_injection_files():
    assert len(INJECTION_FILES) == 174


@pytest.mark.parametrize("path", INJECTION_FILES, ids=[f"{p.parent.name}/{p.name}" for p in INJECTION_FILES])
def test_every_hpdc08_injection_holds_the_ars_its_name_describes(path):
    hours, (fewest, most), notice = _injection_facts(path)
    trace = read_trace(path)
    assert trace.leases
    for lease in trace.leases:
        assert (lease.type, lease.preemptible) == (ADVANCE_RESERVATION, False)
        assert fewest <= len(lease.vnodes) <= most
        assert (hours - 0.5) * 3600 <= lease.duration_s <= (hours + 0.5) * 3600
        # Requests that would precede the trace start were clamped to 0, so only later ones show the notice.
        assert lease.submit_s == 0 or lease.start_s - lease.submit_s == notice


def test_an_injection_line_is_an_ar_with_its_own_real_duration_and_image():
    first = read_injection(HAIZEA / "traces/blue/injected_leases/15days/work_10-dur_2h-size_1small-01h.lwf")
    lease = first.leases[0]
    assert (lease.id, lease.submit_s, lease.start_s, lease.duration_s, lease.real_duration_s) == (
        1,
        0,
        0,
        7632,
        7632,
    )
    assert (lease.vnodes, lease.image, lease.image_size_mb) == ((VM,) * 19, "NONE.img", 600)


def test_injected_ars_that_start_before_the_trace_are_kept_for_replay_to_refuse():
    trace = read_injection(HAIZEA / "traces/blue/injected_leases/30days/work_25-dur_1h-size_1small.lwf")
    assert sum(lease.start_s < 0 for lease in trace.leases) == 2


def test_an_injection_line_with_a_disk_size_is_refused_rather_than_guessed(tmp_path):
    path = tmp_path / "disk.lwf"
    path.write_text("0 3600 600 600 2 1 1024 10 'x.img' 600\n")
    with pytest.raises(TraceError, match=r"disk.lwf:1: disk 10"):
        read_injection(path)


# ------------------------------------------------------------------------------------------ merging


def test_merging_colliding_injection_ids_shifts_them_past_the_workload():
    base = read_lwf(HAIZEA / "traces/multi/withprematureend.lwf")
    merged = merge_traces(base, read_lwf(HAIZEA / "traces/multi/inj1.lwf"))
    assert len(merged.leases) == 152
    assert len({lease.id for lease in merged.leases}) == 152
    assert sorted(lease.id for lease in merged.leases if lease.type == ADVANCE_RESERVATION) == list(
        range(140, 153)
    )
    assert [lease.submit_s for lease in merged.leases] == sorted(lease.submit_s for lease in merged.leases)


def test_merging_injections_with_fresh_ids_keeps_them():
    base = read_swf(HAIZEA / "traces/blue/150requests.swf")  # job ids start at 13
    injected = read_injection(HAIZEA / "traces/blue/injected_leases/15days/work_05-dur_4h-size_3large.lwf")
    merged = merge_traces(base, injected)
    ars = sorted(lease.id for lease in merged.leases if lease.type == ADVANCE_RESERVATION)
    assert ars == list(range(1, len(injected.leases) + 1))
    assert len(merged.leases) == len(base.leases) + len(injected.leases)


# ------------------------------------------------------------------------------------------ small LWF cases

NODES = (
    "<nodes><node-set numnodes='2'><res type='CPU' amount='100'/><res type='Memory' amount='512'/>"
    "</node-set></nodes>"
)
LEASE = """<lease-request arrival="{arrival}">
  <lease id="{id}" preemptible="true">
  {nodes}
    {start}
    <duration time="00:30:00"/>
    {extra}
  </lease>
</lease-request>"""


def lwf(tmp_path: Path, *requests: str) -> Path:
    path = tmp_path / "t.lwf"
    path.write_text('<?xml version="1.0"?>\n<lease-workload name="t">\n<lease-requests>\n'
                    + "\n".join(requests) + "\n</lease-requests>\n</lease-workload>\n")  # fmt: skip
    return path


def request(arrival: str = "00:00:00", lease_id: str = "1", start: str = "<start/>", extra: str = "") -> str:
    return LEASE.format(arrival=arrival, id=lease_id, nodes=NODES, start=start, extra=extra)


@pytest.mark.parametrize(
    ("start", "extra", "kind", "start_s", "deadline_s"),
    [
        ("<start/>", "", BEST_EFFORT, None, None),
        ("<start></start>", "", BEST_EFFORT, None, None),
        ("<start><now/></start>", "", IMMEDIATE, None, None),
        ('<start><exact time="01:00:00"/></start>', "", ADVANCE_RESERVATION, 3600, None),
        ('<start><exact time="01:00:00"/></start>', '<deadline time="02:00:00"/>', DEADLINE, 3600, 7200),
    ],
)
def test_the_lease_type_is_derived_from_start_and_deadline(tmp_path, start, extra, kind, start_s, deadline_s):
    (lease,) = read_lwf(lwf(tmp_path, request(start=start, extra=extra))).leases
    assert (lease.type, lease.start_s, lease.deadline_s) == (kind, start_s, deadline_s)
    assert lease.vnodes == (Res(cpu=100, mem=512),) * 2


def test_a_multi_instance_cpu_is_the_sum_of_its_instances(tmp_path):
    cpus = '<res type="CPU"><instance amount="100"/><instance amount="50"/></res>'
    text = request().replace("<res type='CPU' amount='100'/>", cpus)
    assert read_lwf(lwf(tmp_path, text)).leases[0].vnodes[0] == Res(cpu=150, mem=512)


def test_leases_are_sorted_by_arrival_and_keep_their_file_ids(tmp_path):
    path = lwf(tmp_path, request("00:10:00", "7"), request("00:05:00", "3"), request("00:10:00", "5"))
    assert [(lease.id, lease.submit_s) for lease in read_lwf(path).leases] == [(3, 300), (7, 600), (5, 600)]


def test_leases_without_an_id_are_numbered_after_the_largest(tmp_path):
    path = lwf(tmp_path, request(lease_id="4"), request().replace(' id="1"', ""), request(lease_id="2"))
    assert [lease.id for lease in read_lwf(path).leases] == [4, 5, 2]


def test_a_user_attribute_is_kept(tmp_path):
    path = lwf(tmp_path, request().replace('preemptible="true"', 'preemptible="false" user="alice"'))
    lease = read_lwf(path).leases[0]
    assert (lease.user, lease.preemptible) == ("alice", False)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            request().replace('<duration time="00:30:00"/>', "<duration/>"),
            "8: <duration> has no time attribute",
        ),
        (request().replace('<duration time="00:30:00"/>', ""), "5: <lease> has no <duration>"),
        (request(arrival="half past"), "4: <lease-request> arrival: 'half past' is not HH:MM:SS[.ss]"),
        (request(start="<start><later/></start>"), "7: <start> holds <later>, not <exact> or <now>"),
        (request(extra='<deadline time="01:00:00"/>'), "5: a <deadline> needs an exact <start>"),
        (request() + "\n" + request(), "13: lease id 1 is already used at line 5"),
        (request().replace("type='CPU'", "type='GPU'"), "6: resource type 'GPU' is not one of CPU, Memory"),
        (request().replace("numnodes='2'", "numnodes='two'"), "6: <node-set> numnodes='two' is not a whole"),
        (request().replace("</lease>", ""), "11: not well-formed XML: mismatched tag"),
    ],
)
def test_a_broken_lwf_names_the_file_and_line_on_one_line(tmp_path, text, problem):
    path = lwf(tmp_path, text)
    with pytest.raises(TraceError) as caught:
        read_lwf(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{problem}")
    assert "\n" not in message


def test_an_xml_file_that_is_not_a_workload_is_refused(tmp_path):
    path = tmp_path / "other.lwf"
    path.write_text('<?xml version="1.0"?>\n<lease-annotations/>\n')
    with pytest.raises(TraceError, match=r"other.lwf:2: the root element is <lease-annotations>"):
        read_trace(path)


# ------------------------------------------------------------------------------------------ values


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:00:00", 0),
        ("01:00:00.00", 3600),
        ("00:07:30.50", 450.5),
        ("1:02:03:04", 93784),
        ("48:00:00", 172800),
    ],
)
def test_lwf_times_are_hh_mm_ss_or_dd_hh_mm_ss(text, seconds):
    assert parse_reltime(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "00:10", "1:2:3:4:5", "-01:00:00", "aa:bb:cc"])
def test_other_time_shapes_are_refused(text):
    with pytest.raises(ValueError, match="is not HH:MM:SS"):
        parse_reltime(text)


@pytest.mark.parametrize(
    ("spec", "nodes", "each"),
    [
        ("4 CPU:100 Memory:1024", 4, VM),
        ("4  CPU:100 Memory:1024", 4, VM),  # haizea-1.0-sample_multi.conf
        ("144 CPU:100,Memory:1024", 144, VM),  # blue-144.conf, the manual's comma form
        ("2 CPU:200 Memory:2048 Disk:20 Net-in:100 Net-out:100", 2, Res(200, 2048, 20, 100, 100)),
    ],
)
def test_a_resources_string_is_n_identical_nodes(spec, nodes, each):
    assert parse_resources(spec) == (each,) * nodes


@pytest.mark.parametrize(
    "spec", ["", "in-tracefile", "0 CPU:100", "4", "4 CPU", "4 CPU:lots", "4 CPU:100 GPU:1"]
)
def test_a_malformed_resources_string_is_refused(spec):
    with pytest.raises(ValueError, match="resource"):
        parse_resources(spec)
