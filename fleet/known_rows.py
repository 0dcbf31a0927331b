"""The fleet's node rows as this process last read them, so that a read on PostgreSQL fetches again only the rows
that changed since: every preview reads all 1,000 rows, and between two previews a heartbeating fleet changes a
few dozen. A row version is known by its `xmin` (the transaction that wrote it): one narrow statement lists every
row's id and xmin, a second fetches the rows whose xmin this process has not seen.

The answer is always what a full read would give:
- only reads in autocommit ask it (fleet/placement.py): inside a transaction that has written (a planning pass,
  which locks the scheduler's row, or a caller's own changes) a row it wrote more than once keeps one xmin while
  its contents change; were such a read to come here all the same, it fetches every row and remembers none;
- a row deleted is gone from the list of versions, a row added is new to it;
- at least every FULL_EVERY_S a read fetches every row, whatever the versions say (transaction ids wrap around
  after 2^32, and start again in a restored cluster).
Rows come from two statements, so a row changed between them is read as the first one found it, or as it became,
each as committed: the same as a full read taken a moment earlier or later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FULL_EVERY_S = 60.0

Statement = tuple[str, tuple]


@dataclass(frozen=True)
class _Known:
    key: tuple
    since: float  # monotonic time of the last full read
    rows: dict[int, tuple[str, tuple]] = field(repr=False)  # id -> (xmin, row)


@dataclass
class Stats:
    """How this process's reads went (tests read it)."""

    full: int = 0
    partial: int = 0
    fetched: int = 0  # rows fetched again by partial reads


stats = Stats()
_known: _Known | None = None


def forget() -> None:
    global _known
    _known = None


def read(
    connection: Any, versions: Statement, every: Statement, some: Callable[[list[int]], Statement]
) -> list:
    """The fleet's rows in id order. `versions` lists (id, xmin, whether this transaction has written) in id order;
    `every` and `some(ids)` select the rows, each with its xmin as the last column."""
    global _known
    settings = connection.settings_dict
    key = (connection.alias, settings.get("NAME"), settings.get("HOST"), settings.get("PORT"))
    known = _known
    with connection.cursor() as cursor:
        cursor.execute(*versions)
        listed = cursor.fetchall()
        written = bool(listed) and bool(listed[0][2])
        current = (
            not written
            and known is not None
            and known.key == key
            and time.monotonic() - known.since < FULL_EVERY_S
        )
        old = known.rows if current and known is not None else {}
        changed = {node for node, xmin, _ in listed if (old.get(node) or ("",))[0] != xmin}
        # Most rows changed (a fleet heartbeating faster than it is read): one plain statement beats a list of ids.
        if not current or 2 * len(changed) > len(listed):
            cursor.execute(*every)
            got = cursor.fetchall()
            stats.full += 1
            if not written:
                _known = _Known(key, time.monotonic(), {row[0]: (row[-1], row[:-1]) for row in got})
            return [row[:-1] for row in got]
        stats.partial += 1
        if not changed and len(listed) == len(old):
            return [old[node][1] for node, _, _ in listed]
        fresh: dict[int, tuple[str, tuple]] = {}
        if changed:
            cursor.execute(*some(sorted(changed)))
            fresh = {row[0]: (row[-1], row[:-1]) for row in cursor.fetchall()}
            stats.fetched += len(fresh)
    rows: dict[int, tuple[str, tuple]] = {}
    for node, _, _ in listed:
        # A changed row the second statement did not find was deleted in between: gone, as it now is.
        got = fresh.get(node) if node in changed else old.get(node)
        if got is not None:
            rows[node] = got
    _known = _Known(key, known.since if known is not None else time.monotonic(), rows)
    return [row for _, row in rows.values()]
