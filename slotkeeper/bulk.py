"""Fast many-row writes: one UPDATE or one INSERT for a whole set of rows, whatever their number.

Django's bulk_update builds a CASE WHEN expression per field and row; at a few hundred rows that expression
building cost more than the database work (3.7 s of a 7.5 s bulk approval of 320 moves, measured). One
parameterised UPDATE per row sent with executemany came next; on PostgreSQL that is still a statement (parsed,
planned, executed, answered) per row, a dozen round trips' worth of server work for every hundred moves. On
PostgreSQL the rows now go as one statement over `UNNEST` of one array parameter per column (`INSERT ... SELECT`,
`UPDATE ... FROM`), each array cast to its column's type; an UPDATE joins on the primary key. SQLite, in the same
process and without a network, keeps executemany (updates) and a multi-row VALUES (inserts).

On PostgreSQL the statements go through a server-binding cursor on the same connection (and transaction), with
the arrays dumped in binary: a multi-row VALUES of a few thousand placeholders was split by a regex in Python at
every batch, too long for psycopg's statement cache, and text-format arrays escape every JSON document element by
element (why Django 5.2's own UNNEST inserts were no faster). Statements sent this way are not seen by Django's
execute_wrappers (query counting, debug logs).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import SimpleNamespace
from typing import TypeVar

import orjson
from django.conf import settings
from django.db import connection, models


class Row(SimpleNamespace):
    """A row for `update_many(..., model=M)` (its primary key as `pk` and each written field by attribute name)
    or `insert_many(..., model=M)` (the fields by attribute name, the rest taking their defaults; given its `pk`).
    Building a model instance sets every one of its fields (a default each): 40-55 µs for a lease, against well
    under one for this, and a pass writes the state and the times of every lease it decides, and a history row
    for each of its steps."""

    pk: object


_Obj = TypeVar("_Obj", bound="models.Model | Row")


def update_many(
    objs: Iterable[models.Model | Row], fields: Sequence[str], *, model: type[models.Model] | None = None
) -> int:
    """Writes `fields` of every object in `objs` (all of one model, each with a primary key): model instances,
    or `Row`s of `model`. Returns the count."""
    rows = list(objs)
    if not rows:
        return 0
    meta = (model or type(rows[0]))._meta
    concrete = [meta.get_field(name) for name in fields]
    if _off():
        meta.model.objects.bulk_update([_instance(meta.model, obj, concrete) for obj in rows], fields)
        return len(rows)
    quote = connection.ops.quote_name
    if connection.vendor == "postgresql":
        names = ["pk"] + [f"c{i}" for i in range(len(concrete))]
        sets = ", ".join(f"{quote(f.column)} = v.c{i}" for i, f in enumerate(concrete))
        types = [meta.pk.db_type(connection)] + [f.db_type(connection) for f in concrete]
        # Names and types come from the model's own metadata; every value is in a parameter.
        sql = (
            f"UPDATE {quote(meta.db_table)} AS t SET {sets} "  # noqa: S608
            f"FROM {_unnest(types)} AS v({', '.join(names)}) WHERE t.{quote(meta.pk.column)} = v.pk"
        )
        with _server_cursor() as cursor:
            cursor.execute(sql, _columns([meta.pk, *concrete], rows, insert=False))
        return len(rows)
    sets = ", ".join(f"{quote(f.column)} = %s" for f in concrete)
    # Only quoted names from the model's own metadata are formatted in; every value is a parameter.
    sql = f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {quote(meta.pk.column)} = %s"  # noqa: S608
    params = [
        [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in concrete] + [obj.pk] for obj in rows
    ]
    with _own_statements(), connection.cursor() as cursor:
        cursor.executemany(sql, params)
    return len(rows)


def insert_many(
    objs: Sequence[_Obj], *, model: type[models.Model] | None = None, returning: bool = True
) -> Sequence[_Obj]:
    """`bulk_create` for rows of one model with an auto primary key, set on each object as it is inserted: one
    multi-row INSERT ... RETURNING, server-bound on PostgreSQL. On SQLite the same statement through Django's
    cursor: a pass writes its reports this way, and bulk_create's query building cost a third of writing one
    1,000-node report (0.27 ms against 0.18, measured). Model instances, or `Row`s of `model` (a field a row
    does not set takes its default).

    `returning=False`: rows nobody reads back (a pass's reports and audit rows) are inserted without asking for
    their keys, so nothing waits for the statement's answer: inside `pipelined()` the server writes them while
    this process goes on. Their `pk` stays unset."""
    if not objs:
        return objs
    if model is None:
        model = type(objs[0])
    meta = model._meta
    fields = [f for f in meta.local_concrete_fields if not f.primary_key]
    if isinstance(objs[0], Row):
        _defaults(objs, fields)
    if (
        connection.vendor not in ("postgresql", "sqlite")
        or not connection.features.can_return_rows_from_bulk_insert
        or _off()
    ):
        made = model.objects.bulk_create(
            [model(**vars(o)) if isinstance(o, Row) else o for o in objs]  # type: ignore[arg-type]
        )
        for obj, row in zip(objs, made, strict=True):
            obj.pk = row.pk
        return objs
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    if connection.vendor == "postgresql":
        # A column per parameter (UNNEST of arrays), whatever the row count: see _columns.
        sql = (
            f"INSERT INTO {quote(meta.db_table)} ({columns}) "  # noqa: S608
            f"SELECT * FROM {_unnest([f.db_type(connection) for f in fields])}"
        )
        with _server_cursor() as cursor:
            if not returning:
                cursor.execute(sql, _columns(fields, objs, insert=True))
                return objs
            cursor.execute(f"{sql} RETURNING {quote(meta.pk.column)}", _columns(fields, objs, insert=True))
            _set_pks(objs, cursor.fetchall())
        return objs
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    per_statement = max(1, connection.ops.bulk_batch_size(fields, objs))
    with _own_statements(), connection.cursor() as cursor:
        for i in range(0, len(objs), per_statement):
            chunk = objs[i : i + per_statement]
            params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for obj in chunk for f in fields]
            # Names come from the model's own metadata; every value is a parameter.
            sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {', '.join([row] * len(chunk))}"  # noqa: S608
            if not returning:
                cursor.execute(sql, params)
                continue
            cursor.execute(f"{sql} RETURNING {quote(meta.pk.column)}", params)
            _set_pks(chunk, cursor.fetchall())
    return objs


_insert_one_sql: dict[tuple[str, type], str] = {}


def insert_one(obj: models.Model) -> models.Model:
    """`obj.save(force_insert=True)` for a model with an auto primary key and no save() of its own, without
    Django's statement building: its INSERT ... RETURNING text is kept per model and database, so a row costs
    only its values' preparation (each field's pre_save and get_db_prep_save, as save() does) and the round trip.
    A lease request stores its row this way (0.6 ms of CPU against 0.8-0.9 ms, measured). Sends no model
    signals: for models nobody listens to."""
    model, alias = type(obj), connection.alias
    meta = model._meta
    fields = [f for f in meta.local_concrete_fields if not f.primary_key]
    if not connection.features.can_return_columns_from_insert or _off():
        obj.save(force_insert=True)
        return obj
    sql = _insert_one_sql.get((alias, model))
    if sql is None:
        quote = connection.ops.quote_name
        sql = _insert_one_sql[(alias, model)] = (
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
            f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quote(meta.pk.column)}"
        )
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        _set_pks([obj], [cursor.fetchone()])
    return obj


@contextmanager
def pipelined() -> Iterator[None]:
    """Statements sent inside are not waited for one by one (psycopg's pipeline mode, on PostgreSQL): the server
    executes each while this process goes on to the next, and a statement whose rows are fetched waits only for
    those before it. Leaving the block waits for every answer and raises the first error, inside the caller's
    transaction as before. Elsewhere (SQLite, in process) a plain block.

    For a pass's reports and audit rows, built in chunks: the server writes one chunk while the next is built on
    the other core, instead of this process waiting for each INSERT at the end (docs/benchmarks/burst.md,
    the eighteenth session).

    Only this module's writes belong inside. A statement through Django's cursor is refused, on every database
    so that what passes on SQLite passes on PostgreSQL: in pipeline mode a cursor's row count reads -1 until
    the answers arrive, and Django acts on it at once (a `save()` that updated no row inserts one, or raises)."""
    if _off():  # Django's bulk_create and bulk_update run inside, through Django's cursor
        yield
        return
    with connection.execute_wrapper(_refuse_inside_pipeline):
        if connection.vendor != "postgresql":
            yield
            return
        connection.ensure_connection()
        with connection.connection.pipeline():
            yield


def _off() -> bool:
    """SLOTKEEPER_OVERRIDES_OFF=bulk: Django's own bulk_create, bulk_update and save(), on model instances built
    from the Rows, and no pipeline; only to measure what this module saves (docs/overrides.md)."""
    return "bulk" in settings.OVERRIDES_OFF


def _instance(model: type[models.Model], obj: models.Model | Row, fields: Sequence) -> models.Model:
    if isinstance(obj, models.Model):
        return obj
    instance = model(pk=obj.pk)
    for f in fields:
        setattr(instance, f.attname, getattr(obj, f.attname))
    return instance


# Set while this module writes through Django's cursor (SQLite), which `pipelined()` lets through.
_writing = threading.local()


@contextmanager
def _own_statements() -> Iterator[None]:
    was = getattr(_writing, "on", False)
    _writing.on = True
    try:
        yield
    finally:
        _writing.on = was


def _refuse_inside_pipeline(execute, sql, params, many, context):
    if getattr(_writing, "on", False):
        return execute(sql, params, many, context)
    raise RuntimeError(
        f"a statement through Django's cursor inside bulk.pipelined(), whose row counts it cannot trust: {sql[:80]}"
    )


def _set_pks(objs: Sequence[models.Model | Row], rows: list) -> None:
    if isinstance(objs[0], Row):
        for obj, (pk,) in zip(objs, rows, strict=True):
            obj.pk = pk
        return
    alias = connection.alias  # read once: each read goes through the connection proxy's thread-local lookup
    for obj, (pk,) in zip(objs, rows, strict=True):
        obj.pk = pk
        obj._state.adding = False  # type: ignore[union-attr]
        obj._state.db = alias  # type: ignore[union-attr]


def _defaults(rows: Sequence[Row], fields: Sequence) -> None:
    """Each field a row does not set, at its default (a callable default called for each row, as a model
    instance's would be)."""
    for f in fields:
        name = f.attname
        if all(name in vars(row) for row in rows):
            continue
        for row in rows:
            if name not in vars(row):
                setattr(row, name, f.get_default())


def _unnest(types: Sequence[str]) -> str:
    """`UNNEST(%b::t0[], %b::t1[], ...)`: one binary array parameter per column, cast to the column's type."""
    return "UNNEST(" + ", ".join(f"%b::{t}[]" for t in types) + ")"


def _columns(fields: Sequence, objs: Sequence[models.Model | Row], *, insert: bool) -> list[list]:
    """The rows' values as one list per column, each value as the field prepares it for the database.

    Sent as arrays in binary: a statement's text and parameter count stay the same whatever the row count, so
    psycopg converts it once (a multi-row VALUES of a few thousand placeholders was split by a regex in Python at
    every batch, and too long for its statement cache: 1.0 s of a 1,600-approval run's 2.5 s of writes,
    measured), and binary arrays carry JSON documents without the per-element escaping of the text format.

    A column of values a plain field would hand on unchanged (see _PLAIN_TYPES) skips the field's preparation: a
    call per value was the most of what was left of a batch's client time (120,000 calls in 1,600 approvals,
    measured). A column with any other value is prepared whole, as before, so no array mixes the two."""
    prep = connection
    out = []
    for f in fields:
        # A primary key is read as `pk`: a model's property for it, a Row's own attribute.
        attname = "pk" if f.primary_key else f.attname
        if _plain_json(f):
            column = [getattr(obj, attname) for obj in objs]
            if not any(hasattr(value, "resolve_expression") for value in column):
                out.append([None if value is None else _json_text(value) for value in column])
                continue
        unchanged = _unchanged(f)
        if unchanged is not None:
            # The plain fields' pre_save is Field.pre_save: the attribute itself.
            column = [getattr(obj, attname) for obj in objs]
            if all(value is None or unchanged(value) for value in column):
                out.append(column)
                continue
        if insert:
            out.append([f.get_db_prep_save(f.pre_save(obj, True), prep) for obj in objs])
        else:
            out.append([f.get_db_prep_save(getattr(obj, attname), prep) for obj in objs])
    return out


# Field classes (exactly these, not subclasses) whose preparation hands on None and a value of exactly this type
# unchanged (to_python of a str is the str, int() of an int the int, ...). A subclass, an enum member (a
# TextChoices value is a str subclass) or any other type goes through get_db_prep_save as before.
_PLAIN_TYPES: dict[type, type] = {
    models.CharField: str,
    models.TextField: str,
    models.AutoField: int,
    models.BigAutoField: int,
    models.SmallAutoField: int,
    models.IntegerField: int,
    models.BigIntegerField: int,
    models.SmallIntegerField: int,
    models.PositiveIntegerField: int,
    models.PositiveBigIntegerField: int,
    models.PositiveSmallIntegerField: int,
    models.BooleanField: bool,
    models.FloatField: float,
}


def _plain(field) -> type | None:
    if type(field) in (models.ForeignKey, models.OneToOneField):
        return _PLAIN_TYPES.get(type(field.target_field)) if field.target_field.primary_key else None
    return _PLAIN_TYPES.get(type(field))


def _unchanged(field) -> Callable[[object], bool] | None:
    """A test of the values `field` hands on to PostgreSQL unchanged (None is always handed on), or None.

    Besides the plain types: an aware `datetime` in a DateTimeField without auto_now(_add), which the field only
    checks for awareness and PostgreSQL's operations hand on as they are (a naive one is made aware, with a
    warning, so it is prepared); every row of a pass carries one or two, and preparing them was about a seventh
    of writing a pass's rows (docs/benchmarks/burst.md, the eighth session's "In the pass")."""
    plain = _plain(field)
    if plain is not None:
        return lambda value: type(value) is plain
    if type(field) is models.DateTimeField and not (field.auto_now or field.auto_now_add) and settings.USE_TZ:
        return lambda value: type(value) is datetime and value.tzinfo is not None
    return None


def _plain_json(field) -> bool:
    """A JSONField with no encoder of its own: its values are written as JSON text (_json_text)."""
    return type(field) is models.JSONField and field.encoder is None


def _json_text(value: object) -> str:
    """A plain JSONField's value as the JSON text PostgreSQL casts to jsonb (the statement's `::jsonb[]`), as
    Django's preparation would write it (None, SQL NULL, is left to the caller). orjson, with Python's json for
    what it refuses (integers past 64 bits). Django wraps every value in an adapter that psycopg then dumps with
    Python's json: inserting a pass's 500 placement reports (their request and chosen nodes are JSON) took a fifth
    more client CPU that way (bench/bench_bulk.py)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value)


def _server_cursor():
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    return ServerBindingCursor(connection.connection)
