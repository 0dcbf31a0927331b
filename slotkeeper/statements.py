"""Statements compiled once per process and database: a query asked on every planning pass or preview is the same
SQL each time, and compiling a queryset cost more CPU than the database spent answering it (0.65 ms against
0.12 ms for the scheduler's version check, measured on PostgreSQL). Only for querysets whose parameters are
constants: the first compilation's are kept."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from django.db.models import QuerySet

Statement = tuple[str, tuple]

_compiled: dict[tuple[str, str], Statement] = {}


def compiled(alias: str, name: str, build: Callable[[], QuerySet]) -> Statement:
    """`build()`'s SQL and parameters for database `alias`, compiled the first time `name` is asked for."""
    got = _compiled.get((alias, name))
    if got is None:
        query = build()
        sql, params = query.query.get_compiler(using=alias).as_sql()
        got = _compiled[(alias, name)] = (sql, tuple(_plain(p) for p in params))
    return got


def _plain(value: Any) -> Any:
    # An enum member (a TextChoices state) as its value: the driver adapts plain values only.
    return value.value if isinstance(value, Enum) else value
