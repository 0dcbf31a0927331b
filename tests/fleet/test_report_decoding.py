"""A stored report read back as rows (fleet/reports.py `decode`): exactly the rows the per-node decoder gave, field
for field and in the same order, and each distinct sentence written once. No database."""

from __future__ import annotations

import dataclasses
import random
from unittest.mock import patch

import numpy as np
import orjson
import pytest

from fleet import reports
from fleet.reports import Verdict
from tests.fleet.decode_reference import decode as reference_decode

CODES = ("at_capacity", "no_disk", "too_small", "reserved", "anti_affinity", "draining", "dead")
NOTES = ("", "", "", "lacks accel.gpu", "an operator cordoned this node; undrain it to place work here")


def random_verdicts(rng: random.Random, n: int) -> list[Verdict]:
    """A fleet's verdicts in every shape a report holds: fit and unfit, each dimension, sentences of their own,
    blockers, ranks, a chosen node, figures that repeat and figures that do not, names some readers lack."""
    out = []
    for node in sorted(rng.sample(range(1, 3 * n), n)):
        fit = rng.random() < 0.6
        dim = rng.choice(("cpu", "mem", "mem", "disk"))
        out.append(
            Verdict(
                node=node,
                holds=rng.randint(1, 4) if fit else 0,
                code=None if fit else rng.choice(CODES),
                dim=dim,
                need=rng.choice((150, 200)) if dim == "cpu" else rng.choice((8192, 12)),
                free=rng.choice((-1109, 0, 4096, rng.randint(-5000, 200000))),
                allocatable=rng.choice((-1, 52586, 122148, rng.randint(0, 200000))),
                rank=rng.randint(1, n) if fit or rng.random() < 0.1 else None,
                chosen=fit and rng.random() < 0.05,
                blockers=tuple(rng.sample(range(1, 9000), rng.randint(1, 3))) if rng.random() < 0.1 else (),
                note="" if fit else rng.choice(NOTES),
            )
        )
    return out


@pytest.mark.parametrize("seed", range(12))
def test_rows_read_back_exactly_as_the_per_node_decoder_gave_them(seed):
    rng = random.Random(seed)
    verdicts = random_verdicts(rng, rng.choice((1, 7, 300, 1000)))
    names = {v.node: f"node-{v.node:04d}" for v in verdicts if rng.random() < 0.95}
    names[verdicts[0].node] = ""  # a name that is empty is still the node's name
    window = rng.choice(((1.8e9, 1.8e9 + 3600), (None, None)))
    headroom = [rng.choice((None, 0.25, 3.0)) for _ in verdicts] if seed % 3 == 0 else None
    stored = reports.encode(verdicts, start=window[0], end=window[1], summary="s", headroom=headroom)
    # As the database gives it back: JSON, not the numpy-built lists encode made.
    stored = orjson.loads(orjson.dumps(stored, option=orjson.OPT_SERIALIZE_NUMPY))
    got, want = reports.decode(stored, names), reference_decode(stored, names)
    assert got == want
    assert orjson.dumps(got) == orjson.dumps(want)  # the same bytes: 1 and 1.0, True and 1 differ here


def test_a_report_with_sentences_stored_per_node_reads_back_as_before():
    """Reports stored before exclusion sentences were indexed kept them by node id, in `notes`."""
    verdicts = random_verdicts(random.Random(99), 50)
    stored = orjson.loads(orjson.dumps(reports.encode(verdicts, start=None, end=None, summary="s")))
    stored.pop("texts", None)
    stored.pop("note", None)
    stored["notes"] = {str(v.node): "lacks accel.gpu" for v in verdicts[::3]}
    names = {v.node: f"n{v.node}" for v in verdicts}
    assert reports.decode(stored, names) == reference_decode(stored, names)


def test_each_distinct_refusal_sentence_is_written_once():
    """500 nodes full in the same way share one sentence: written once, not 500 times (most of decoding a
    1,000-node report was writing sentences)."""
    verdicts = [Verdict(n, 0, "at_capacity", "mem", 8192, 4096, 52586, None, False) for n in range(1, 501)]
    stored = reports.encode(verdicts, start=1.8e9, end=1.8e9 + 60, summary="s")
    with patch.object(reports, "sentence", wraps=reports.sentence) as sentence:
        rows = reports.decode(stored, {})
    assert sentence.call_count == 1
    assert {r["reason"] for r in rows} == {
        "4 GiB of memory free now of 52,586 MiB allocatable; one VM needs 8 GiB"
    }


@pytest.mark.parametrize(
    ("dim", "said"),
    [
        ("cpu", "2 cores free now of 16 cores allocatable; one VM needs 4 cores"),
        ("mem", "782 MiB of memory free now of 16 GiB allocatable; one VM needs 4 GiB"),
    ],
)
def test_a_node_busy_now_says_what_is_free_once(dim, said):
    # Seen on the demo's board: "2 cores of cores free now".
    figures = {"cpu": (400, 200, 1600), "mem": (4096, 782, 16384)}[dim]
    assert reports.sentence("at_capacity", dim, *figures, (), (None, None)) == said


def test_columns_of_read_only_fleets_pack_their_own_node_ids_every_time():
    """A pass's reports share the slot table's read-only node column, whose packing is kept between reports:
    another fleet's column (or the same ids in a new object) is packed afresh, and a caller changing one stored
    report changes no other."""
    rng = random.Random(7)

    def columns(nodes: list[int]) -> reports.Columns:
        cols = reports.Columns.of(random_verdicts(rng, len(nodes)))
        ids = np.array(nodes, dtype=np.int64)
        ids.setflags(write=False)
        return dataclasses.replace(cols, node=ids)

    contiguous, gappy = list(range(1, 301)), [*range(1, 101), *range(500, 700)]  # as many nodes each
    fleet = columns(contiguous)
    first = reports.encode(fleet, start=None, end=None, summary="s")
    first["node"]["steps"] += [900, 2]  # a caller's change stays in its own report
    assert reports.node_ids(reports.encode(fleet, start=None, end=None, summary="s")) == contiguous
    other = reports.encode(columns(gappy), start=None, end=None, summary="s")
    assert reports.node_ids(other) == gappy
    assert (
        reports.node_ids(reports.encode(columns(contiguous), start=None, end=None, summary="s")) == contiguous
    )


def test_free_and_allocatable_figures_are_packed_when_they_repeat_and_older_lists_read_back_the_same():
    """A fleet of one node size shows one allocatable figure per dimension: stored as runs, not 1,000 numbers
    (half of a placed lease's report). Reports stored before, with both columns as plain lists, read the same."""
    verdicts = [
        Verdict(node=n, holds=2 if n > 600 else 0, code=None if n > 600 else "reserved", dim="mem",
            need=8192, free=16384 if n > 600 else 0, allocatable=118784, rank=None, chosen=False)
        for n in range(1, 1001)
    ]  # fmt: skip
    stored = orjson.loads(orjson.dumps(reports.encode(verdicts, start=None, end=None, summary="s")))
    assert stored["alloc"] == {"runs": [118784, 1000]}
    assert stored["free"] == {"runs": [0, 600, 16384, 400]}  # the 600 full nodes, then the rest
    names = {n: f"n{n}" for n in range(1, 1001)}
    before = dict(stored, free=[v.free for v in verdicts], alloc=[v.allocatable for v in verdicts])
    assert reports.decode(stored, names) == reports.decode(before, names) == reference_decode(before, names)


@pytest.mark.parametrize("seed", range(4))
def test_decoded_rows_are_marked_as_the_apis_shape_and_every_row_has_exactly_its_fields(seed):
    """The answer passes `reports.Rows` on whole, without looking at a row (fleet/api/serializers.py,
    `VerdictRows`): that is right only while every row `decode` writes has exactly the serializer's fields. A
    field added to one side and not the other fails here. Rows stored before reports were compact are a plain
    list, which the serializer still looks at row by row."""
    from fleet.api.serializers import VerdictSerializer

    rng = random.Random(seed)
    verdicts = random_verdicts(rng, rng.choice((1, 40, 300)))
    names = {v.node: f"node-{v.node:04d}" for v in verdicts}
    stored = orjson.loads(orjson.dumps(reports.encode(verdicts, start=1.8e9, end=1.8e9 + 60, summary="s")))
    rows = reports.decode(stored, names)
    assert type(rows) is reports.Rows
    fields = set(VerdictSerializer().fields)
    assert all(row.keys() == fields for row in rows)
    assert VerdictSerializer(many=True).to_representation(rows) is rows

    legacy = [{"node": "n1", "node_id": 1, "fit": True, "reason_code": None, "reason": None, "slots": 2}]
    assert type(reports.decode(legacy, names)) is list
