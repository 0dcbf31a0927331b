"""The tables a lease request writes carry each index once (PostgreSQL; see the note on text indexes in
leases/models.py): every index is an entry a planning pass writes for every row it inserts or moves to another
state, so an index no query needs is paid by every request of a burst."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.conftest import requires_postgres

pytestmark = [requires_postgres, pytest.mark.django_db]

# The tables a pass writes rows to for each lease request it decides.
PER_REQUEST = [
    "leases_lease",
    "leases_leaseevent",
    "leases_reservation",
    "leases_allocation",
    "leases_instance",
    "leases_instanceevent",
    "fleet_placementreport",
]


def indexes(table: str) -> list[tuple[str, list[str], bool, bool, str]]:
    """(name, columns in order, unique, partial, the definition) of each index on `table`."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT i.relname,
                   ARRAY(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
                         JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum ORDER BY k.n),
                   x.indisunique, x.indpred IS NOT NULL, pg_get_indexdef(x.indexrelid)
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
            WHERE x.indrelid = %s::regclass
            """,
            [table],
        )
        return [
            (name, list(cols), unique, partial, definition)
            for name, cols, unique, partial, definition in cursor
        ]


@pytest.mark.parametrize("table", PER_REQUEST)
def test_no_text_column_has_a_second_index_for_like(table):
    pattern = [name for name, _, _, _, definition in indexes(table) if "_pattern_ops" in definition]
    assert pattern == [], f"{table}: LIKE indexes no query uses, written for every row: {pattern}"


@pytest.mark.parametrize("table", PER_REQUEST)
def test_no_plain_index_is_the_leading_part_of_another(table):
    """An index on (a) beside one on (a, b) serves nothing the second does not, and costs every insert."""
    found = indexes(table)
    redundant = [
        (name, other)
        for name, cols, unique, partial, _ in found
        if not unique and not partial
        for other, other_cols, _, other_partial, _ in found
        if other != name and not other_partial and other_cols[: len(cols)] == cols
    ]
    assert redundant == [], (
        f"{table}: indexes covered by another that leads with the same columns: {redundant}"
    )


def test_the_lookups_those_indexes_served_still_use_an_index():
    """What the dropped indexes were for (an instance's iid, a lease's or an instance's state, a report's subject,
    an allocation's node and reservation) is still answered by an index, not a scan of the table."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in (
            "SELECT 1 FROM leases_instance WHERE iid = 'x'",
            "SELECT 1 FROM leases_instance WHERE state = 'running'",
            "SELECT 1 FROM leases_instance WHERE node_id = 1",
            "SELECT 1 FROM leases_lease WHERE state = 'new'",
            "SELECT 1 FROM leases_reservation WHERE status = 'active'",
            "SELECT 1 FROM fleet_placementreport WHERE subject = 'lease:1'",
            "SELECT 1 FROM leases_allocation WHERE node_id = 1",
            "SELECT 1 FROM leases_allocation WHERE reservation_id = 1",
        ):
            cursor.execute(f"EXPLAIN {query}")
            plan = " ".join(row[0] for row in cursor.fetchall())
            assert "Index" in plan and "Seq Scan" not in plan, (query, plan)
