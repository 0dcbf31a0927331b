"""The outbox: every change to a lease, an instance or a node appends its event in the transaction that makes the
change, so an event is never lost (the change committed, so did its event) nor invented (the change rolled back,
so did its event), whatever happens to the process or to Redis after. The event feed (`/api/events/`) reads it.

Numbering. Events are numbered (`seq`) after they commit, by `sequence()`, in one transaction at a time (an advisory
lock on PostgreSQL; SQLite's single writer): the rows committed and not numbered yet get the next numbers, in the
order they were written. Numbering at write time (the row's id) would let a reader that saw seq 12 miss seq 11,
committed a moment later by a slower transaction; numbered after commit, a reader never sees a later number before
an earlier one, so "everything after N" is exact and a resumed client misses nothing and sees nothing twice. Each
writer numbers its own events once it commits (on_commit), and every reader numbers what is left first (a writer
killed between its commit and its numbering), so nothing waits for long.

Events of one lease are in the order their changes were made: every change to a lease is made under the plan lock
(one writer at a time), and its events are written by that writer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from slotkeeper.bulk import Row, insert_many
from slotkeeper.models import Event, EventFeed

log = logging.getLogger(__name__)

# The advisory lock the sequencer holds on PostgreSQL (an arbitrary constant, not the plan lock's).
SEQUENCER_LOCK_ID = 0x5107_E7E7
# Rows numbered per sequencer transaction; it loops until none are left.
SEQUENCE_BATCH = 10_000
_MARK = "_slotkeeper_outbox_hooked"


def event(
    type_: str,
    at: datetime,
    *,
    lease: int | None = None,
    instance: str = "",
    node: int | None = None,
    data: dict[str, Any] | None = None,
) -> Row:
    """An event as a row to append (`append_many`), for writers that make many at once."""
    return Row(
        type=type_, at=at, lease_id=lease, instance=instance or "", node_id=node, data=data or {}, seq=None
    )


def append(
    type_: str,
    at: datetime,
    *,
    lease: int | None = None,
    instance: str = "",
    node: int | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Appends one event in the current transaction (numbered once it commits)."""
    append_many([event(type_, at, lease=lease, instance=instance, node=node, data=data)])


def append_many(rows: Iterable[Row]) -> None:
    rows = list(rows)
    if not rows:
        return
    insert_many(rows, model=Event, returning=False)
    _number_on_commit()


def _number_on_commit() -> None:
    """Once per transaction: number this transaction's events when it commits (outside any transaction: now)."""
    if not connection.in_atomic_block:
        sequence()
        return
    if any(getattr(func, _MARK, False) for _, func, _ in connection.run_on_commit):
        return

    def number() -> None:
        try:
            sequence()
        except Exception:  # the next reader or writer numbers them: never fail a commit that already happened
            log.warning("numbering the outbox's events failed; the next reader numbers them", exc_info=True)

    setattr(number, _MARK, True)
    transaction.on_commit(number)


def sequence() -> int:
    """Numbers every committed event that has no number yet, in the order they were written, one numberer at a
    time; returns the highest number given so far."""
    table = connection.ops.quote_name(Event._meta.db_table)
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SEQUENCER_LOCK_ID])
            cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {table}")  # noqa: S608 (our table's name)
            (top,) = cursor.fetchone()
            # Never below what retention deleted: a number is never given twice, even once its event is gone.
            top = max(int(top), pruned_through())
            cursor.execute(
                f"SELECT id FROM {table} WHERE seq IS NULL ORDER BY id LIMIT %s",  # noqa: S608
                [SEQUENCE_BATCH],
            )
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                return int(top)
            # One statement: each row's number is `top` plus its place among these ids.
            cursor.execute(
                f"UPDATE {table} SET seq = s.n FROM (SELECT id, %s + ROW_NUMBER() OVER (ORDER BY id) AS n "  # noqa: S608
                f"FROM {table} WHERE seq IS NULL AND id <= %s) AS s WHERE {table}.id = s.id",
                [top, ids[-1]],
            )
        if len(ids) < SEQUENCE_BATCH:
            return int(top) + len(ids)


def pruned_through() -> int:
    state = EventFeed.objects.filter(pk=1).first()
    return state.pruned_through if state is not None else 0


def prune(now: datetime) -> int:
    """Deletes numbered events older than EVENT_RETENTION_S (a bounded amount a call) and records the highest
    number deleted, so a client asking for anything after an older one is told to resync. Returns how many."""
    cutoff = now - timedelta(seconds=settings.SLOTKEEPER["EVENT_RETENTION_S"])
    sequence()  # only numbered events are deleted: their numbers say where the feed's kept part begins
    with transaction.atomic():
        doomed = list(
            Event.objects.filter(at__lt=cutoff, seq__isnull=False)
            .order_by("seq")
            .values_list("seq", flat=True)[:SEQUENCE_BATCH]
        )
        if not doomed:
            return 0
        deleted, _ = Event.objects.filter(seq__lte=doomed[-1]).delete()
        state, _ = EventFeed.objects.select_for_update().get_or_create(pk=1)
        state.pruned_through = max(state.pruned_through, doomed[-1])
        state.save(update_fields=["pruned_through"])
    return deleted
