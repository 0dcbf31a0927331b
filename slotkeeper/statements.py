"""Statements compiled once per process and database: a query asked on every planning pass or preview is the same
SQL each time, and compiling the queryset again each time is Python work the database's answer does not need.
Only for querysets whose parameters are constants: the first compilation's are kept."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from django.db import connections
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


def commit_without_flush(alias: str = "default") -> None:
    """Inside a transaction on PostgreSQL: its commit returns without waiting for the write-ahead log to reach the
    disk (`SET LOCAL synchronous_commit = off`). For records only, never for a decision: a server crash within
    the WAL writer's delay (a fraction of a second) may lose the transaction whole, never half of it, and never
    corrupts anything. The disk's slowest flushes were most of a preview's p99 (bench/bench_preview.py, "whole,
    flushed commit"; docs/operations.md says what it may lose). No-op elsewhere."""
    connection = connections[alias]
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
