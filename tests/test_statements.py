"""slotkeeper/statements.py: a queryset compiled once per database, with plain parameters."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.utils import timezone

from leases.lifecycle import LeaseState
from leases.models import Lease
from slotkeeper import statements
from slotkeeper.management.commands.issue_token import issue
from tests.conftest import requires_postgres

pytestmark = pytest.mark.django_db


def test_a_statement_is_compiled_once_and_its_enum_parameters_are_plain_values():
    def build():
        return Lease.objects.filter(state=LeaseState.NEW).values_list("id")

    sql, params = statements.compiled("default", "test.new_leases", build)
    assert params == ("new",) and type(params[0]) is str
    with patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        assert statements.compiled("default", "test.new_leases", build) == (sql, params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        assert cursor.fetchall() == []


def _lease(name: str, **extra) -> Lease:
    return Lease.objects.create(
        name=name,
        type="best_effort",
        submitted_at=timezone.now(),
        duration_s=60.0,
        vnodes=[{"cpu_cores": 1, "mem_mib": 512, "disk_gib": 1}],
        capabilities=["gpu"],
        **extra,
    )


def _by_id(pk):
    return Lease.objects.filter(pk=pk)


def test_a_template_is_compiled_once_and_reads_each_calls_row_as_the_queryset_does():
    first, second = _lease("a"), _lease("b", restart_policy={"max_restarts": 2})
    fields = [f.attname for f in Lease._meta.concrete_fields]
    template = statements.template("default", "test.lease_by_id", _by_id, -1)
    with patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        got = [
            statements.template("default", "test.lease_by_id", _by_id, -1).models(Lease, "default", lease.pk)
            for lease in (first, second)
        ]
        assert template.models(Lease, "default", 10**12) == []
    for (row,), lease in zip(got, (first, second), strict=True):
        stored = Lease.objects.get(pk=lease.pk)
        # Datetimes aware and JSON decoded on SQLite too: the queryset's converters applied.
        assert [getattr(row, f) for f in fields] == [getattr(stored, f) for f in fields]
        assert not row._state.adding and row._state.db == "default"
    assert got[1][0].submitted_at.tzinfo is not None and got[1][0].restart_policy == {"max_restarts": 2}


def test_a_values_template_gives_converted_rows_and_no_models():
    lease = _lease("c")
    template = statements.template(
        "default",
        "test.lease_values",
        lambda name: Lease.objects.filter(name=name).values_list("id", "vnodes"),
        "\0n",
    )
    assert template.attnames is None
    assert [tuple(row) for row in template.rows("default", "c")] == [(lease.pk, lease.vnodes)]
    with pytest.raises(AssertionError, match="not a queryset of model instances"):
        template.models(Lease, "default", "c")


def test_a_template_whose_marker_is_not_one_of_its_parameters_is_refused():
    with pytest.raises(ValueError, match="is 0 of the compiled parameters"):
        statements.template("default", "test.no_marker", lambda pk: Lease.objects.filter(pk=1), -1)
    with pytest.raises(ValueError, match="is 2 of the compiled parameters"):
        statements.template(
            "default", "test.twice", lambda pk: Lease.objects.filter(pk=pk) | Lease.objects.filter(pk=pk), -1
        )


# --- prepared on PostgreSQL (settings DB_PREPARED_STATEMENTS) ----------------------------------------------------


def _prepared() -> list[str]:
    """The statements this session has prepared, as PostgreSQL lists them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [row[0] for row in cursor.fetchall()]


@requires_postgres
def test_a_tokens_lookup_is_prepared_once_on_its_connection_and_answers_as_the_unprepared_one():
    from slotkeeper import auth

    raw = issue("prepared-op", "operator")
    assert not any("slotkeeper_apitoken" in s for s in _prepared())
    user, token = auth.authenticate_token(raw)
    assert [s for s in _prepared() if "slotkeeper_apitoken" in s and "$1" in s]
    before = len(_prepared())
    for _ in range(6):  # past PostgreSQL's five custom plans: the same statement, not a new one each call
        assert auth.authenticate_token(raw)[0].pk == user.pk
    assert len(_prepared()) == before
    # Turned off (DB_PREPARED_STATEMENTS=0 leaves prepare_threshold None): Django's own cursor, same answer.
    with patch.dict(connection.settings_dict["OPTIONS"], {"prepare_threshold": None}):
        again, row = auth.authenticate_token(raw)
    assert (again.pk, again.username, row.pk, row.digest) == (user.pk, user.username, token.pk, token.digest)
    assert auth.authenticate_token("skt_unknown") is None


@requires_postgres
def test_where_queries_are_logged_a_template_is_bound_on_the_client_so_the_log_shows_its_values():
    from django.test.utils import CaptureQueriesContext

    lease = _lease("logged")
    with CaptureQueriesContext(connection) as captured:
        (row,) = statements.instances(Lease, "test.logged_by_id", _by_id, -1, lease.pk)
    assert row.pk == lease.pk
    assert len(captured) == 1 and f"= {lease.pk}" in captured[0]["sql"]


@requires_postgres
def test_a_pass_that_finds_the_plan_lock_held_keeps_the_connections_prepared_statements():
    # A transaction left by an exception ends in a rollback, after which the driver forgets (and deallocates)
    # every statement it prepared on the connection: a burst then planned the token's lookup again on about one
    # request in four. The pass that finds the lock held now leaves by a commit.
    import psycopg

    from leases.planning import passes
    from slotkeeper import auth, planlock

    raw = issue("prepared-pass", "operator")
    auth.authenticate_token(raw)
    assert [s for s in _prepared() if "slotkeeper_apitoken" in s]
    params = connection.get_connection_params()
    other = psycopg.connect(
        dbname=params.get("dbname"),
        user=params.get("user"),
        host=params.get("host"),
        port=params.get("port"),
        autocommit=True,
    )
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [planlock.PLAN_LOCK_ID])
        with pytest.raises(passes.LockTaken), passes.planning(timezone.now(), try_lock=True):
            pytest.fail("planned without the lock")
    finally:
        other.execute("SELECT pg_advisory_unlock(%s)", [planlock.PLAN_LOCK_ID])
        other.close()
    assert [s for s in _prepared() if "slotkeeper_apitoken" in s]
