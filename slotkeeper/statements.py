"""Statements compiled once per process and database: a query asked on every planning pass or preview is the same
SQL each time, and compiling the queryset again each time is Python work the database's answer does not need.
`compiled` is for querysets whose parameters are constants: the first compilation's are kept. `template` is for
those with a value per call (a token's digest, a lease's id): compiled once with a marker in each such place, and
given that call's values; its rows come converted as the queryset's own would be."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from django.db import connections, router
from django.db.models import Model, QuerySet

Statement = tuple[str, tuple]

_compiled: dict[tuple[str, str], Statement] = {}


def compiled(alias: str, name: str, build: Callable[[], QuerySet]) -> Statement:
    """`build()`'s SQL and parameters for database `alias`, compiled the first time `name` is asked for."""
    got = None if _off() else _compiled.get((alias, name))
    if got is None:
        query = build()
        sql, params = query.query.get_compiler(using=alias).as_sql()
        got = (sql, tuple(_plain(p) for p in params))
        if not _off():
            _compiled[(alias, name)] = got
    return got


def _off() -> bool:
    """SLOTKEEPER_OVERRIDES_OFF=statements: every call compiles its queryset anew, as Django would (whether the
    statement is then prepared is `prepared`'s switch); only to measure what compiling once saves
    (docs/overrides.md)."""
    from django.conf import settings

    return "statements" in settings.OVERRIDES_OFF


@dataclass(frozen=True)
class Template:
    """A statement compiled once, with a value per call in `slots` (indices into `params`)."""

    sql: str
    params: tuple
    slots: tuple[int, ...]
    # (column, converter functions, expression): what Django's compiler applies to the column's values (a
    # datetime made aware and a JSON document decoded on SQLite, a field's from_db_value anywhere).
    converters: tuple[tuple[int, tuple, Any], ...]
    # A queryset of model instances: the attnames of its columns, in order (None for values_list).
    attnames: tuple[str, ...] | None

    def rows(self, alias: str, *values: Any) -> list:
        """The statement's rows with `values` in its slots, each a list (tuple when nothing converts)."""
        params = list(self.params)
        for slot, value in zip(self.slots, values, strict=True):
            params[slot] = value
        connection = connections[alias]
        with _cursor(connection) as cursor:
            cursor.execute(self.sql, params)
            rows = cursor.fetchall()
        if not self.converters:
            return rows
        converted = []
        for row in rows:
            row = list(row)
            for pos, convs, expression in self.converters:
                value = row[pos]
                for converter in convs:
                    value = converter(value, expression, connection)
                row[pos] = value
            converted.append(row)
        return converted

    def models(self, model: type[Model], alias: str, *values: Any) -> list:
        """The rows as instances of `model`, as the queryset would give them."""
        assert self.attnames is not None, "not a queryset of model instances"
        return [model.from_db(alias, self.attnames, row) for row in self.rows(alias, *values)]


_templates: dict[tuple[str, str], Template] = {}


def template(alias: str, name: str, build: Callable[..., QuerySet], *markers: Any) -> Template:
    """`build(*markers)` compiled for database `alias` the first time `name` is asked for. Each marker is a value
    of the parameter's own type that no real call passes (an id of -1, a text no digest can be) and must land
    exactly once among the compiled parameters; a call's values then take the markers' places. A queryset whose
    SQL depends on the value itself (None, an empty list for `__in`) cannot be a template."""
    got = None if _off() else _templates.get((alias, name))
    if got is None:
        compiler = build(*markers).query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        params = tuple(_plain(p) for p in params)
        slots = []
        for marker in markers:
            found = [i for i, p in enumerate(params) if type(p) is type(marker) and p == marker]
            if len(found) != 1:
                raise ValueError(
                    f"{name}: marker {marker!r} is {len(found)} of the compiled parameters, not one"
                )
            slots.append(found[0])
        columns = [s[0] for s in compiler.select[: compiler.col_count]]
        converters = tuple(
            (pos, tuple(convs), expression)
            for pos, (convs, expression) in compiler.get_converters(columns).items()
        )
        klass = compiler.klass_info
        attnames = None
        if (
            klass is not None
            and not compiler.query.values_select
            and not klass.get("related_klass_infos")
            and list(klass["select_fields"]) == list(range(len(columns)))
        ):
            # A model's own columns and nothing else (no select_related, no annotation): its instances.
            attnames = tuple(column.target.attname for column in columns)
        got = Template(sql, params, tuple(slots), converters, attnames)
        if not _off():
            _templates[(alias, name)] = got
    return got


def instances(
    model: type[Model], name: str, build: Callable[[Any], QuerySet], marker: Any, value: Any
) -> list:
    """The instances of `model` that `build(value)` would give, through the template `name` compiled for the
    database the router reads `model` from."""
    alias = router.db_for_read(model)
    return template(alias, name, build, marker).models(model, alias, value)


def _cursor(connection: Any) -> Any:
    """A cursor whose statements PostgreSQL prepares once per connection and plans once (settings
    DB_PREPARED_STATEMENTS), made and wrapped as Django makes its own (the time zone's loader, execute wrappers,
    errors translated). Django's own cursor elsewhere, and where queries are logged (DEBUG, a test capturing
    them): Django's log shows a statement with its values only when they were bound on the client."""
    options = connection.settings_dict["OPTIONS"]
    if (
        connection.vendor != "postgresql"
        or options.get("prepare_threshold") is None
        or connection.queries_logged
    ):
        return connection.cursor()
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg.pq import Format

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor = _prepared_class()(connection.connection)
        loader = connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
        if connection.timezone != loader.timezone:
            register_tzloader(connection.timezone, cursor)
        return connection._prepare_cursor(cursor)


@functools.cache
def _prepared_class() -> type:
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):
        """Server-side binding, and every statement prepared on its first run on the connection."""

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs["prepare"] = True
            return super().execute(query, params, **kwargs)  # type: ignore[misc]

    return PreparedCursor


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
