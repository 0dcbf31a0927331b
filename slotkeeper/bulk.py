"""Fast many-row updates: one parameterised UPDATE per row sent with executemany (psycopg pipelines them).

Django's bulk_update builds a CASE WHEN expression per field and row; at a few hundred rows that expression
building cost more than the database work (3.7 s of a 7.5 s bulk approval of 320 moves, measured).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connection, models


def update_many(objs: Iterable[models.Model], fields: Sequence[str]) -> int:
    rows = list(objs)
    if not rows:
        return 0
    model = type(rows[0])
    meta = model._meta
    concrete = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    sets = ", ".join(f"{quote(f.column)} = %s" for f in concrete)
    # Only quoted names from the model's own metadata are formatted in; every value is a parameter.
    sql = f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {quote(meta.pk.column)} = %s"  # noqa: S608
    params = [
        [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in concrete] + [obj.pk] for obj in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
    return len(rows)
