"""slotkeeper.bulk: one statement per table for a batch of rows, on SQLite and PostgreSQL alike, with every
object given its primary key and every value (JSON columns included) stored as bulk_create would store it."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import PlacementReport
from slotkeeper.bulk import Row, insert_many, pipelined, update_many

pytestmark = pytest.mark.django_db


def report(i: int) -> PlacementReport:
    return PlacementReport(
        created_at=timezone.now(),
        subject=f"lease:{i}",
        request={"type": "immediate", "vnodes": [{"cpu_cores": 1, "mem_mib": 512 * i}]},
        outcome="placed" if i % 2 else "rejected",
        message=f"message {i} ‘quoted’ \\ %s",
        chosen=[f"node-{i}"],
        verdicts={"v": 2, "free": list(range(i, i + 50)), "summary": "needs 1 × (1 core)"},
        requested_by="bulk-test",
    )


def stored(objs) -> list[tuple]:
    fields = ("subject", "request", "outcome", "message", "chosen", "verdicts", "requested_by")
    return [tuple(getattr(o, f) for f in fields) for o in objs]


def test_insert_many_gives_every_object_its_row():
    made = [report(i) for i in range(1, 8)]
    assert insert_many(made) is made
    assert all(o.pk is not None and not o._state.adding for o in made)
    rows = PlacementReport.objects.filter(pk__in=[o.pk for o in made]).order_by("pk")
    assert [r.pk for r in rows] == sorted(o.pk for o in made)
    by_pk = {r.pk: r for r in rows}
    assert stored(by_pk[o.pk] for o in made) == stored(made)


def test_insert_many_splits_a_batch_larger_than_one_statement_takes():
    count = 1700  # several statements on SQLite (bulk_batch_size) and more than one pass ever writes
    made = [report(i % 40 + 1) for i in range(count)]
    insert_many(made)
    assert len({o.pk for o in made}) == count
    assert PlacementReport.objects.filter(requested_by="bulk-test").count() == count
    sample = made[::97]
    fetched = {r.pk: r for r in PlacementReport.objects.filter(pk__in=[o.pk for o in sample])}
    assert stored(fetched[o.pk] for o in sample) == stored(sample)


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="counts statements through Django's cursor (SQLite)"
)
def test_insert_many_writes_a_pass_worth_of_reports_in_one_statement_on_sqlite():
    with CaptureQueriesContext(connection) as queries:
        insert_many([report(i) for i in range(1, 30)])
    assert len(queries.captured_queries) == 1
    assert queries.captured_queries[0]["sql"].startswith("INSERT INTO")


def test_update_many_writes_the_fields_named_and_nothing_else():
    made = insert_many([report(i) for i in range(1, 6)])
    for o in made:
        o.message = f"changed {o.pk}"
        o.outcome = "should-not-be-written"
    assert update_many(made, ["message"]) == len(made)
    for r in PlacementReport.objects.filter(pk__in=[o.pk for o in made]):
        assert r.message == f"changed {r.pk}"
        assert r.outcome in ("placed", "rejected")


class _Recording:
    """A cursor that records what it is asked to execute, and executes it."""

    def __init__(self, cursor, sent: list) -> None:
        self._cursor, self._sent = cursor, sent

    def __enter__(self):
        self._cursor.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cursor.__exit__(*exc)

    def execute(self, sql, params=None):
        self._sent.append((sql, params))
        return self._cursor.execute(sql, params)

    def fetchall(self):
        return self._cursor.fetchall()


def _recorded(monkeypatch) -> list:
    import slotkeeper.bulk as bulk

    sent: list = []
    real = bulk._server_cursor
    monkeypatch.setattr(bulk, "_server_cursor", lambda: _Recording(real(), sent))
    return sent


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL statement")
def test_a_batch_is_one_statement_with_a_parameter_per_column_whatever_its_rows_on_postgresql(monkeypatch):
    sent = _recorded(monkeypatch)
    made = insert_many([report(i % 40 + 1) for i in range(900)])
    for o in made:
        o.message = f"changed {o.pk}"
    update_many(made, ["message", "outcome"])
    columns = len([f for f in PlacementReport._meta.local_concrete_fields if not f.primary_key])
    # A statement whose text grows with the rows was split by a regex in Python at every batch, and never cached.
    assert [len(params) for _, params in sent] == [columns, 3]
    assert all("UNNEST(" in sql for sql, _ in sent)
    assert PlacementReport.objects.filter(message__startswith="changed ").count() == 900


def test_json_text_and_nulls_are_stored_as_written():
    odd = {
        "quote": 'say "hi"',
        "slash": "a\\b",
        "braces": "{1,2}",
        "nul": None,
        "uni": "‘é’ ✓",
        "n": [1.5, -2],
    }
    made = insert_many([report(1), report(2)])
    made[0].verdicts, made[0].chosen, made[0].message = odd, ["{x}", 'y"z'], "{a,b} NULL \\N"
    made[1].verdicts, made[1].chosen, made[1].message = [odd, odd], [], ""
    update_many(made, ["verdicts", "chosen", "message"])
    fetched = {r.pk: r for r in PlacementReport.objects.filter(pk__in=[o.pk for o in made])}
    assert stored(fetched[o.pk] for o in made) == stored(made)
    again = insert_many([PlacementReport(**{f: getattr(o, f) for f in ("subject", "request", "outcome",
        "message", "chosen", "verdicts", "requested_by")}, created_at=o.created_at) for o in made])  # fmt: skip
    fetched = {r.pk: r for r in PlacementReport.objects.filter(pk__in=[o.pk for o in again])}
    assert stored(fetched[o.pk] for o in again) == stored(made)


def test_update_many_writes_foreign_keys_times_and_nullable_columns(django_user_model):
    from datetime import timedelta

    from leases.models import Instance, Lease

    now = timezone.now()
    lease = Lease.objects.create(name="bulk", type="best_effort", duration_s=60, vnodes=[{"cpu_cores": 1}],
        submitted_at=now)  # fmt: skip
    made = insert_many([Instance(iid=f"bulk-{i}", lease=lease, vnode=1, generation=i, state="lost",
        created_at=now, state_changed_at=now) for i in range(3)])  # fmt: skip
    made[1].replaces = made[0]
    made[2].restart_not_before, made[2].last_exit_code = now + timedelta(seconds=5), -9
    for o in made:
        o.state, o.state_changed_at = "rescheduled", now + timedelta(seconds=1)
    update_many(made, ["state", "state_changed_at", "replaces", "restart_not_before", "last_exit_code"])
    rows = {r.iid: r for r in Instance.objects.filter(lease=lease)}
    assert rows["bulk-1"].replaces_id == made[0].pk and rows["bulk-0"].replaces_id is None
    assert rows["bulk-2"].restart_not_before == now + timedelta(seconds=5)
    assert rows["bulk-2"].last_exit_code == -9 and rows["bulk-0"].last_exit_code is None
    assert {r.state for r in rows.values()} == {"rescheduled"}
    assert {r.state_changed_at for r in rows.values()} == {now + timedelta(seconds=1)}


def test_rows_write_a_model_s_fields_as_its_instances_would_and_nothing_else():
    """update_many(..., model=M) with Rows (a pass's lease states, times and messages): the same statement as
    for model instances, times, JSON and a primary key read as `pk` included."""
    from datetime import timedelta

    from leases.models import Lease

    now = timezone.now()
    leases = [Lease.objects.create(name=f"row-{i}", type="best_effort", duration_s=60,
        vnodes=[{"cpu_cores": 1}], submitted_at=now, message="before") for i in range(3)]  # fmt: skip
    rows = [
        Row(pk=lease.pk, state="queued", first_start=now + timedelta(seconds=i), images={"1": f"img-{i}"})
        for i, lease in enumerate(leases)
    ]
    rows[2].first_start = None
    assert update_many(rows, ["state", "first_start", "images"], model=Lease) == 3
    got = {lease.pk: lease for lease in Lease.objects.filter(pk__in=[lease.pk for lease in leases])}
    for i, lease in enumerate(leases):
        assert got[lease.pk].state == "queued"
        assert got[lease.pk].images == {"1": f"img-{i}"}
        assert got[lease.pk].message == "before", "a field not named is not written"
    assert got[leases[0].pk].first_start == now
    assert got[leases[2].pk].first_start is None


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL columns")
def test_plain_values_skip_the_fields_preparation_and_the_rest_do_not(monkeypatch):
    """A column of str in a CharField, of int in an integer field or key, ... is handed on as it is; JSON, times,
    and a column holding an enum member or anything else still go through get_db_prep_save (and are stored as the
    other tests check)."""
    from django.db.models import Field

    from leases.instances.models import RescheduleStatus

    prepared: list[str] = []
    real = Field.get_db_prep_save
    monkeypatch.setattr(
        Field, "get_db_prep_save", lambda self, v, c: prepared.append(self.name) or real(self, v, c)
    )
    made = insert_many([report(i) for i in range(1, 11)])
    # Aware times are handed on as they are, plain JSON as text (_json_text); the reports' text JSON column has
    # an encoder of its own.
    assert sorted(set(prepared)) == ["verdicts"]
    assert len(prepared) == 10
    prepared.clear()
    made[0].outcome = RescheduleStatus.APPLIED  # a TextChoices member: not exactly a str
    update_many(made, ["outcome", "message"])
    assert prepared == ["outcome"] * len(made), "a column with one value not plain is prepared whole"
    assert PlacementReport.objects.get(pk=made[0].pk).outcome == "applied"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL columns")
@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime")
def test_a_naive_time_and_an_auto_now_time_are_still_prepared(monkeypatch, django_user_model):
    from datetime import datetime, timedelta

    from django.db.models import Field

    from slotkeeper.models import ApiToken

    prepared: list[str] = []
    real = Field.get_db_prep_save
    monkeypatch.setattr(
        Field, "get_db_prep_save", lambda self, *a, **k: prepared.append(self.name) or real(self, *a, **k)
    )
    rows = [report(1), report(2)]
    rows[1].created_at = datetime(
        2026, 1, 2, 3, 4, 5
    )  # naive: made aware in the current time zone, as before
    made = insert_many(rows)
    assert prepared.count("created_at") == 2, "a column with one naive time is prepared whole"
    stored_at = PlacementReport.objects.get(pk=made[1].pk).created_at
    assert stored_at == timezone.make_aware(datetime(2026, 1, 2, 3, 4, 5))
    assert PlacementReport.objects.get(pk=made[0].pk).created_at == rows[0].created_at
    prepared.clear()
    user = django_user_model.objects.create(username="bulk-token")
    before = timezone.now()
    (token,) = insert_many([ApiToken(user=user, digest="d" * 64)])
    assert "created_at" in prepared, "auto_now_add sets the time in pre_save"
    assert before <= ApiToken.objects.get(pk=token.pk).created_at <= timezone.now() + timedelta(seconds=1)


def test_rows_insert_as_model_instances_would_with_the_defaults_they_leave_out(django_user_model):
    """insert_many(..., model=M) with Rows (a pass's history rows): each gets its primary key, and a field a row
    does not set is stored at the model's default, as a model instance would store it."""
    from leases.models import Lease, LeaseEvent

    now = timezone.now()
    lease = Lease.objects.create(name="rows", type="best_effort", duration_s=60, vnodes=[{"cpu_cores": 1}],
        submitted_at=now)  # fmt: skip
    rows = [Row(lease_id=lease.pk, at=now, from_state="new", to_state=s) for s in ("pending", "queued")]
    rows[1].message = "with words"
    assert insert_many(rows, model=LeaseEvent) is rows
    assert all(isinstance(r.pk, int) for r in rows) and rows[0].pk != rows[1].pk
    got = {e.pk: e for e in LeaseEvent.objects.filter(lease=lease)}
    assert [(got[r.pk].to_state, got[r.pk].message, got[r.pk].at) for r in rows] == [
        ("pending", "", now),
        ("queued", "with words", now),
    ]
    made = insert_many([report(1)])  # model instances, as before
    assert made[0]._state.adding is False


def test_json_written_as_text_reads_back_as_django_writes_it():
    """A plain JSONField's values go to PostgreSQL as JSON text cast to jsonb (bulk._json_text), not through
    Django's adapter: every kind of value reads back as the same value saved by Django itself, and what orjson
    refuses (an integer past 64 bits) is still written."""
    odd_values = [
        {"a": [1, 2.5, None, True], "b": {"c": "‘é’ ✓", "d": 'q"\\'}},
        {1: "int key", 2.5: "float key", False: "bool key"},
        [2**70, -(2**70)],
        "just a string",
        0,
        [],
        {},
        ("a", "tuple"),
    ]
    now = timezone.now()
    by_django = []
    for i, value in enumerate(odd_values):
        r = report(i + 1)
        r.request, r.chosen = value, [value]
        r.save()
        by_django.append(r)
    rows = [
        Row(created_at=now, subject=f"json-{i}", request=value, outcome="", message="", chosen=[value],
            verdicts=[], requested_by="")
        for i, value in enumerate(odd_values)
    ]  # fmt: skip
    insert_many(rows, model=PlacementReport)
    fetched = PlacementReport.objects.in_bulk([r.pk for r in by_django] + [r.pk for r in rows])
    for saved, row in zip(by_django, rows, strict=True):
        expected = fetched[saved.pk]
        got = fetched[row.pk]
        assert (got.request, got.chosen) == (expected.request, expected.chosen)


def test_rows_inserted_without_returning_are_written_and_keep_no_key():
    made = [report(i) for i in range(1, 6)]
    assert insert_many(made, returning=False) is made
    assert all(o.pk is None for o in made)
    rows = PlacementReport.objects.filter(requested_by="bulk-test").order_by("subject")
    assert stored(rows) == stored(sorted(made, key=lambda o: o.subject))


def test_pipelined_writes_are_all_in_by_the_end_of_the_block():
    """Inside, the statements are sent without waiting for their answers (on PostgreSQL the connection is in
    pipeline mode); when the block ends every row is there, in the caller's transaction."""
    from psycopg import pq

    before = insert_many([report(1)])[0]
    with transaction.atomic():
        with pipelined():
            if connection.vendor == "postgresql":
                assert connection.connection.pgconn.pipeline_status == pq.PipelineStatus.ON
            for i in range(3):
                insert_many([report(10 * i + j) for j in range(1, 5)], returning=False)
            update_many([Row(pk=before.pk, message="changed")], ["message"], model=PlacementReport)
        if connection.vendor == "postgresql":
            assert connection.connection.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert PlacementReport.objects.filter(requested_by="bulk-test").count() == 13
        assert PlacementReport.objects.get(pk=before.pk).message == "changed"
        after = insert_many([report(99)])  # after the block, a write that reads its key back works as before
    assert after[0].pk is not None


def test_a_django_statement_inside_pipelined_is_refused_and_changes_nothing():
    with pytest.raises(RuntimeError, match=r"inside bulk\.pipelined"), transaction.atomic(), pipelined():
        insert_many([report(1)], returning=False)
        PlacementReport.objects.filter(subject="lease:1").update(message="changed")
    assert not PlacementReport.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's pipeline mode (PostgreSQL)")
def test_an_error_in_a_pipelined_write_surfaces_by_the_end_of_the_block_and_rolls_back():
    from psycopg import errors

    broken = report(2)
    broken.subject = None  # NOT NULL: the server refuses the INSERT, after this process has gone on
    with pytest.raises(errors.NotNullViolation), transaction.atomic(), pipelined():
        insert_many([report(1)], returning=False)
        insert_many([broken], returning=False)
        reached_the_end = True
    assert reached_the_end
    assert not PlacementReport.objects.exists()


def test_insert_one_stores_a_row_as_save_would_and_builds_its_statement_once(django_user_model):
    """insert_one (a lease request's row): every field as save() writes it, auto_now_add set, the key given back;
    the second row asks Django to build no statement."""
    from unittest.mock import patch

    from django.db.models.sql.compiler import SQLInsertCompiler

    from leases.models import Group
    from slotkeeper.bulk import insert_one

    first = insert_one(report(1))
    with patch.object(SQLInsertCompiler, "as_sql", side_effect=AssertionError("Django built it")):
        second = insert_one(report(2))
        group = insert_one(Group(name="g", policy="anti_affinity"))
    assert first.pk != second.pk and not second._state.adding and second._state.db == "default"
    assert stored(PlacementReport.objects.filter(pk__in=[first.pk, second.pk]).order_by("pk")) == stored(
        [first, second]
    )
    again = Group.objects.get(pk=group.pk)
    assert again.created_at is not None and again.created_at == group.created_at and again.name == "g"
