"""Every scheduler decision explains itself node by node (docs/capacity.md): the lease's report after a submission
(placed, queued, rejected) and after the queue places it later, in the API's shape."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from fleet import reports
from fleet.capacity import ReasonCode
from fleet.models import CompactJSONEncoder, Node, PlacementReport
from fleet.reports import Verdict
from leases import actions as lease_actions
from leases.models import Lease
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def submit(client, **body):
    payload = {"name": "job", "type": "best_effort", "duration_s": 3600, "nodes": [vm()], **body}
    return client.post("/api/leases/", payload, format="json")


def latest_report(client, lease_id: int) -> dict:
    return client.get(f"/api/leases/{lease_id}/").json()["placement_reports"][0]


def test_a_placed_lease_marks_its_chosen_node_and_says_what_every_node_holds(operator, fleet):
    response = submit(operator, type="immediate", nodes=[vm(cores=2, mem=4096)])
    assert response.status_code == 201
    report = latest_report(operator, response.json()["id"])
    chosen = [v for v in report["verdicts"] if v["chosen"]]
    lease = Lease.objects.get(pk=response.json()["id"])
    assert [v["node_id"] for v in chosen] == [lease.reservations.get(kind="vm").nodes["1"]]
    assert report["verdicts"][0]["chosen"], "the chosen node is listed first"
    assert report["chosen"] == [chosen[0]["node"]]
    # Every node of 4 cores and 8 GiB holds two VMs of 2 cores and 4 GiB; the chosen one held this one too.
    assert {v["holds"] for v in report["verdicts"]} == {1}  # capped at the lease's own VM count
    assert all(v["fit"] and v["reason_code"] is None for v in report["verdicts"])
    assert [v["rank"] for v in report["verdicts"]] == sorted(v["rank"] for v in report["verdicts"])
    assert report["counts"] == {"evaluated": 4, "fit": 4}
    assert report["summary"].startswith("needs 1 × (2 cores, 4 GiB)")


def test_a_rejected_lease_shows_no_node_as_fit_and_gives_every_node_its_reason_in_user_units(operator, fleet):
    Node.objects.filter(name="n4").update(status="draining", drain_reason="maintenance")
    for _ in range(3):
        assert submit(operator, type="immediate", nodes=[vm(cores=1, mem=6144)]).status_code == 201
    response = submit(operator, type="immediate", nodes=[vm(cores=1, mem=4096)] * 2)
    assert response.status_code == 409
    body = response.json()
    by_node = {v["node"]: v for v in body["verdicts"]}
    assert not any(v["fit"] for v in by_node.values())
    assert all(v["holds"] == 0 and v["reason_code"] and v["reason"] for v in by_node.values())
    assert by_node["n4"]["reason_code"] == ReasonCode.DRAINING
    busy = [by_node[n] for n in ("n1", "n2", "n3")]
    assert {v["reason_code"] for v in busy} == {ReasonCode.AT_CAPACITY}
    assert all(
        "2 GiB of memory free now of 8 GiB allocatable; one VM needs 4 GiB" in v["reason"] for v in busy
    )
    assert all(len(v["blockers"]) == 1 for v in busy)
    assert busy[0]["numbers"]["dimension"] == "mem"
    assert (busy[0]["numbers"]["need"], busy[0]["numbers"]["free"], busy[0]["numbers"]["allocatable"]) == (
        4096,
        2048,
        8192,
    )


def test_an_advance_reservation_blocked_later_in_its_window_is_reserved_naming_the_lease_in_the_way(
    operator, fleet
):
    start = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    blockers = []
    for _ in range(4):
        r = submit(
            operator, type="advance_reservation", start=start.isoformat(), nodes=[vm(cores=4, mem=8192)]
        )
        blockers.append(r.json()["id"])
    response = submit(operator, type="advance_reservation", start=start.isoformat(), nodes=[vm()])
    assert response.status_code == 409
    verdicts = response.json()["verdicts"]
    assert {v["reason_code"] for v in verdicts} == {ReasonCode.RESERVED}
    assert sorted(b for v in verdicts for b in v["blockers"]) == sorted(blockers)


def test_a_node_without_the_capability_is_never_fit_and_the_capable_one_is_chosen(operator, fleet):
    Node.objects.filter(name="n3").update(capabilities=["accel.gpu"])
    response = submit(operator, type="immediate", nodes=[vm()], capabilities=["accel.gpu"])
    assert response.status_code == 201
    report = latest_report(operator, response.json()["id"])
    by_node = {v["node"]: v for v in report["verdicts"]}
    assert by_node["n3"]["chosen"] and by_node["n3"]["fit"]
    for name in ("n1", "n2", "n4"):
        assert (by_node[name]["fit"], by_node[name]["reason_code"]) == (False, ReasonCode.MISSING_CAPABILITY)
        assert "accel.gpu" in by_node[name]["reason"]


def test_a_queued_lease_the_tick_places_later_keeps_its_capability_and_gets_a_report_for_that_placement(
    operator, fleet
):
    Node.objects.filter(name="n3").update(capabilities=["accel.gpu"])
    first = submit(
        operator, type="immediate", duration_s=600, nodes=[vm(cores=4, mem=8192)], capabilities=["accel.gpu"]
    )
    assert first.status_code == 201
    queued = submit(operator, nodes=[vm(cores=4, mem=8192)], capabilities=["accel.gpu"])
    lease = Lease.objects.get(pk=queued.json()["id"])
    assert lease.state in ("queued", "ready")  # waits for n3 (ready: reserved for when n3 frees up)
    assert latest_report(operator, lease.pk)["outcome"] in ("queued", "placed")
    lease_actions.do_cancel_lease(None, first.json()["id"], now=timezone.now())
    lease_actions.advance(timezone.now() + timedelta(seconds=1))
    lease.refresh_from_db()
    assert lease.state == "active"
    assert lease.reservations.get(kind="vm", status="active").nodes == {"1": Node.objects.get(name="n3").pk}
    report = latest_report(operator, lease.pk)
    assert report["outcome"] == "placed"
    assert [v["node"] for v in report["verdicts"] if v["chosen"]] == ["n3"]


def test_a_report_at_a_thousand_nodes_is_stored_in_under_40_kib():
    class V:
        def __init__(self, node):
            self.node, self.holds, self.code, self.dim = (
                node,
                node % 3,
                None if node % 3 else "at_capacity",
                "mem",
            )
            self.need, self.free, self.allocatable = 10240, 123456, 258048
            self.rank, self.chosen, self.blockers, self.note = (
                node,
                node == 1,
                (node,) if node % 7 == 0 else (),
                "",
            )

    blob = reports.encode([V(n) for n in range(1, 1001)], start=1.8e9, end=1.8e9 + 3600, summary="x")
    assert len(json.dumps(blob)) < 40 * 1024
    rows = reports.decode(blob, {n: f"node-{n:04d}" for n in range(1, 1001)})
    assert len(rows) == 1000 and rows[0]["chosen"] and rows[0]["node"] == "node-0001"
    assert sum(1 for r in rows if r["fit"]) == 667


def test_packed_columns_read_back_exactly_as_the_plain_ones_and_halve_the_stored_size():
    """Runs of one value and steps of consecutive node ids are stored packed; a report stored with plain lists
    (as before packing) reads back the same."""
    verdicts = [
        Verdict(n, 1 if n < 900 else 0, None if n < 900 else "too_small", "mem" if n < 950 else "disk",
                4096, 8192 + n, 65536, n if n < 900 else None, n == 3, (n,) if n == 901 else (),
                "" if n != 990 else "lacks accel.gpu")
        for n in [*range(1, 500), *range(600, 1101)]
    ]  # fmt: skip
    names = {v.node: f"n{v.node}" for v in verdicts}
    packed = reports.encode(verdicts, start=1.8e9, end=1.8e9 + 600, summary="s")
    assert packed["node"] == {"steps": [1, 499, 600, 501]} and packed["holds"] == {"runs": [1, 799, 0, 201]}
    packable = ("node", "holds", "code", "dim", "note", "rank")
    plain = {**packed, **{k: reports._unpacked(packed[k]) for k in packable}}
    assert isinstance(plain["node"], list) and len(plain["node"]) == 1000
    assert reports.decode(packed, names) == reports.decode(plain, names)
    assert reports.node_ids(packed) == [v.node for v in verdicts]
    rows = {r["node_id"]: r for r in reports.decode(packed, names)}
    assert (rows[3]["chosen"], rows[901]["blockers"], rows[990]["reason"]) == (True, [901], "lacks accel.gpu")
    assert (rows[960]["numbers"]["dimension"], rows[960]["reason_code"]) == ("disk", "too_small")
    assert len(json.dumps(packed)) < 0.75 * len(json.dumps(plain))


def test_the_report_encoder_writes_compact_json_that_reads_back_as_the_standard_library_would_write_it():
    blob = {
        "counts": {"fit": 2},
        "blockers": {3: [1, 2]},
        "free": np.array([1, 2]),
        "n": np.int64(5),
        "s": "a–b",
    }
    text = json.dumps(blob, cls=CompactJSONEncoder)
    assert json.loads(text) == {
        "counts": {"fit": 2},
        "blockers": {"3": [1, 2]},
        "free": [1, 2],
        "n": 5,
        "s": "a–b",
    }
    assert ", " not in text and '": ' not in text
    with pytest.raises(TypeError):
        json.dumps({"a": object()}, cls=CompactJSONEncoder)


def test_a_report_stored_before_reports_were_compact_still_reads(operator, fleet):
    old = PlacementReport.objects.create(
        created_at=timezone.now(),
        subject="preview",
        request={},
        outcome="placed",
        message="old",
        verdicts=[{"node": "n1", "node_id": 1, "fit": True, "reason_code": None, "reason": None, "slots": 2,
                   "headroom": 90.0, "numbers": {}}],
    )  # fmt: skip
    assert old.rows[0]["node"] == "n1"
    assert operator.get(f"/api/placement/reports/{old.pk}/").json()["verdicts"][0]["slots"] == 2


def test_a_preview_and_the_report_of_the_same_lease_give_the_same_verdicts(operator, fleet):
    Node.objects.filter(name="n2").update(capabilities=["accel.gpu"])
    Node.objects.filter(name="n3").update(status="draining", drain_reason="maintenance")
    submit(operator, type="immediate", nodes=[vm(cores=3, mem=6144)])  # something in the way on one node
    ask = {"count": 2, "cpu_cores": 1, "mem_mib": 4096, "duration_s": 600}
    preview = operator.post("/api/placement/preview", ask, format="json")
    assert preview.status_code == 200, preview.content
    lease = submit(operator, type="immediate", duration_s=600, nodes=[vm(cores=1, mem=4096)] * 2)
    assert lease.status_code == 201
    report = latest_report(operator, lease.json()["id"])

    def key(rows):
        return sorted((v["node"], v["fit"], v["holds"], v["reason_code"], v["chosen"]) for v in rows)

    assert key(preview.json()["verdicts"]) == key(report["verdicts"])
    assert preview.json()["nodes"] == report["chosen"]
    assert preview.json()["outcome"] == "placed"


def test_a_lease_message_names_its_nodes_and_a_far_reservation_its_date(operator, fleet):
    start = (timezone.now() + timedelta(days=9)).replace(hour=0, minute=0, second=0, microsecond=0)
    response = submit(operator, type="advance_reservation", start=start.isoformat(), duration_s=1800)
    assert response.status_code == 201
    message = Lease.objects.get(pk=response.json()["id"]).message
    assert f"runs {start:%Y-%m-%d} 00:00 UTC–{start:%Y-%m-%d} 00:30 UTC on n" in message, message
    assert "on nodes" not in message


def test_a_lease_the_queue_places_later_says_where_it_runs_instead_of_its_old_queue_position(operator, fleet):
    big = vm(cores=4, mem=8192)
    blockers = [
        submit(operator, type="immediate", duration_s=600, nodes=[big]).json()["id"] for _ in range(4)
    ]
    queued = submit(operator, nodes=[big]).json()["id"]
    assert (
        "queued at position 1" in Lease.objects.get(pk=queued).message
        or "runs" in Lease.objects.get(pk=queued).message
    )
    lease_actions.do_cancel_lease(None, blockers[0], now=timezone.now())
    lease_actions.advance(timezone.now() + timedelta(seconds=1))
    lease = Lease.objects.get(pk=queued)
    assert lease.state == "active"
    assert lease.message.startswith("placed by the queue: lease") and " on n" in lease.message


@pytest.mark.parametrize("seed", range(30))
def test_the_column_packers_agree_with_plain_python_on_random_columns(seed):
    """_runs, _steps, _used and _per_dim against what they mean, written the slow way: columns of every length
    from empty, one long run, alternating values, consecutive ids with gaps, codes used in any order."""
    rng = random.Random(seed)
    size = rng.choice([0, 1, 2, 3, 7, 50, 1000])
    values = np.array([rng.choice([0, 0, 0, 1, 5, -1]) for _ in range(size)], dtype=np.int64)
    if seed % 3 == 0:
        values = np.sort(values)  # long runs
    runs = reports._runs(values)
    assert reports._unpacked(runs) == values.tolist()
    starts = [i for i in range(size) if i == 0 or values[i] != values[i - 1]]
    assert isinstance(runs, dict) == (0 < 2 * len(starts) < size)

    ids, n = [], rng.randint(1, 40)
    for _ in range(size):
        n += 1 if rng.random() < 0.9 else rng.randint(2, 9)
        ids.append(n)
    steps = reports._steps(np.array(ids, dtype=np.int64))
    assert reports._unpacked(steps) == ids

    table = tuple(f"code-{c}" for c in rng.sample("qwertyuiopasdfgh", 8))
    index = np.array([rng.choice([-1, -1, *range(len(table))]) for _ in range(size)], dtype=np.int64)
    for sort in (True, False):
        names, renumbered = reports._used(index, table, sort=sort)
        seen = list(dict.fromkeys(table[i] for i in index.tolist() if i >= 0))
        assert names == (sorted(seen) if sort else seen)
        assert [names[i] if i >= 0 else None for i in renumbered.tolist()] == [
            table[i] if i >= 0 else None for i in index.tolist()
        ]

    dim = np.array([rng.choice([0, 1, 2]) for _ in range(size)], dtype=np.int64)
    figures = {0: rng.randint(1, 9), 1: rng.randint(10, 99), 2: rng.randint(100, 999)}
    need = np.array([figures[d] for d in dim.tolist()], dtype=np.int64)
    expected = {reports.DIMENSIONS[d]: figures[d] for d in sorted(set(dim.tolist()))}
    assert reports._per_dim(dim, need) == expected
    shared = [i for i in range(size) if (dim == dim[i]).sum() > 1]
    if shared:
        need[rng.choice(shared)] += 1  # one node's figure differs from another's: stored per node
        assert reports._per_dim(dim, need) is None


def test_a_leases_answer_passes_decoded_verdict_rows_through_and_sends_older_rows_through_the_fields(
    operator, fleet, monkeypatch
):
    """The decoder's rows are the API's shape already (fleet/api/serializers.py, VerdictRows): the answer to a
    submission sends them as they are, with no field-by-field pass; rows of another shape still get one."""
    from fleet.api.serializers import VerdictSerializer

    represented = []
    original = VerdictSerializer.to_representation
    monkeypatch.setattr(
        VerdictSerializer,
        "to_representation",
        lambda self, row: represented.append(row) or original(self, row),
    )
    created = submit(operator, type="immediate", nodes=[vm(cores=1, mem=1024)])
    assert created.status_code == 201, created.content
    report = PlacementReport.objects.get(subject=f"lease:{created.json()['id']}")
    answered = created.json()["placement_reports"][0]["verdicts"]
    assert answered == json.loads(json.dumps(report.rows)) and len(answered) == Node.objects.count()
    assert represented == []

    legacy = [{"node": "n1", "node_id": 1, "fit": True, "reason_code": None, "reason": None, "slots": 2}]
    PlacementReport.objects.filter(pk=report.pk).update(verdicts=legacy)
    again = operator.get(f"/api/leases/{created.json()['id']}/").json()["placement_reports"][0]["verdicts"]
    assert len(represented) == 1 and again[0]["node"] == "n1" and again[0]["slots"] == 2


def test_a_whole_fleet_reports_rows_read_every_name_in_one_plain_query_and_a_deleted_node_by_its_id():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.models import NAMES_BY_ID

    nodes = [
        Node.objects.create(
            name=f"w{i:03}", cpu_cores=4, mem_total_mib=8192, disk_total_gib=100, token_digest=f"t{i}"
        )
        for i in range(NAMES_BY_ID + 6)
    ]

    class V:
        def __init__(self, node):
            self.node, self.holds, self.code, self.dim = node, 1, None, "mem"
            self.need, self.free, self.allocatable = 1024, 2048, 2048
            self.rank, self.chosen, self.blockers, self.note = None, False, (), ""

    blob = reports.encode([V(n.pk) for n in nodes], start=1.8e9, end=1.8e9 + 60, summary="s")
    gone = nodes.pop()
    gone_id = gone.pk
    gone.delete()
    report = PlacementReport.objects.create(
        created_at=timezone.now(), subject="preview", request={}, outcome="placed", message="", verdicts=blob
    )
    report = PlacementReport.objects.get(pk=report.pk)
    with CaptureQueriesContext(connection) as queries:
        rows = report.rows
    assert len(queries) == 1 and " IN (" not in queries[0]["sql"]
    assert {r["node"] for r in rows} == {n.name for n in nodes} | {f"node {gone_id}"}


def test_a_decisions_report_page_says_the_request_as_it_was_asked(operator, client, fleet):
    """The console's report page words the stored request; a decision's is in the scheduler's form, which it
    showed as "1 × ()" before."""
    response = submit(operator, duration_s=1200, nodes=[vm(cores=2, mem=4096), vm(cores=2, mem=4096)])
    report = PlacementReport.objects.get(subject=f"lease:{response.json()['id']}")
    client.force_login(get_user_model().objects.get(username="otto"))  # the operator's own account, signed in
    page = client.get(f"/placement/{report.pk}/")
    assert page.status_code == 200
    assert "request: best-effort, 2 × (2 cores, 4 GiB) for 20 min" in page.content.decode()
