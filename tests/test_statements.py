"""slotkeeper/statements.py: a queryset compiled once per database, with plain parameters."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler

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
