"""Fast many-row updates: one UPDATE for a whole set of rows, whatever their number.

Django's bulk_update builds a CASE WHEN expression per field and row; at a few hundred rows that expression
building cost more than the database work (3.7 s of a 7.5 s bulk approval of 320 moves, measured). One
parameterised UPDATE per row sent with executemany came next; on PostgreSQL that is still a statement (parsed,
planned, executed, answered) per row, a dozen round trips' worth of server work for every hundred moves. On
PostgreSQL the rows now go as one `UPDATE ... FROM (VALUES ...)`: each value cast to its column's type, joined on
the primary key. SQLite, in the same process and without a network, keeps executemany.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connection, models

# PostgreSQL takes at most 65,535 parameters in one statement.
MAX_PARAMS = 60_000


def update_many(objs: Iterable[models.Model], fields: Sequence[str]) -> int:
    """Writes `fields` of every object in `objs` (all of one model, each with a primary key). Returns the count."""
    rows = list(objs)
    if not rows:
        return 0
    meta = type(rows[0])._meta
    concrete = [meta.get_field(name) for name in fields]
    params = [
        [obj.pk] + [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in concrete] for obj in rows
    ]
    if connection.vendor == "postgresql":
        _update_from_values(meta, concrete, params)
    else:
        quote = connection.ops.quote_name
        sets = ", ".join(f"{quote(f.column)} = %s" for f in concrete)
        # Only quoted names from the model's own metadata are formatted in; every value is a parameter.
        sql = f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {quote(meta.pk.column)} = %s"  # noqa: S608
        with connection.cursor() as cursor:
            cursor.executemany(sql, [row[1:] + row[:1] for row in params])
    return len(rows)


def _update_from_values(meta, concrete: list, params: list[list]) -> None:
    quote = connection.ops.quote_name
    casts = [meta.pk.db_type(connection)] + [f.db_type(connection) for f in concrete]
    names = ["pk"] + [f"c{i}" for i in range(len(concrete))]
    sets = ", ".join(f"{quote(f.column)} = v.c{i}" for i, f in enumerate(concrete))
    row = "(" + ", ".join(f"%s::{cast}" for cast in casts) + ")"
    per_statement = max(1, MAX_PARAMS // len(casts))
    with connection.cursor() as cursor:
        for i in range(0, len(params), per_statement):
            chunk = params[i : i + per_statement]
            # Names and types come from the model's own metadata; every value is a parameter.
            sql = (
                f"UPDATE {quote(meta.db_table)} AS t SET {sets} "  # noqa: S608
                f"FROM (VALUES {', '.join([row] * len(chunk))}) AS v({', '.join(names)}) "
                f"WHERE t.{quote(meta.pk.column)} = v.pk"
            )
            cursor.execute(sql, [value for values in chunk for value in values])
