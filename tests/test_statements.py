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
