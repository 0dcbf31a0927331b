"""The plan lock: one writer at a time for everything that decides where work goes, with a bounded wait.

Every change that can invalidate a placement takes it: the plan applier (submissions, cancels, approvals, the
tick), declaring a node dead, the sweep marking one dead, deleting a node. Without it an approval committed 157 ms
after a declare-dead put an instance on the dead node, because each checked the node before the other committed.

On PostgreSQL it is a transaction-scoped advisory lock; on SQLite every write transaction is IMMEDIATE, so the
database's single write lock already serialises them. Waits are bounded in both (PLAN_LOCK_TIMEOUT_S): a caller
that cannot have the lock in time gets `PlanBusy`, which the API answers 503 with Retry-After, instead of hanging.

It lives in the project kernel, not in `leases`, because `fleet` needs it and must not import `leases`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import OperationalError, connection
from psycopg_pool import PoolTimeout

from slotkeeper.domain import DomainError

# An arbitrary constant: the advisory lock id every plan applier takes on PostgreSQL.
PLAN_LOCK_ID = 0x5107_4EE9


class PlanBusy(DomainError):
    """The plan lock (or the database's write lock) could not be had in time: try again shortly (503)."""

    retry_after_s = 2


def timeout_s() -> float:
    return float(settings.SLOTKEEPER["PLAN_LOCK_TIMEOUT_S"])


def take() -> None:
    """Takes the plan lock for the rest of the current transaction, waiting at most PLAN_LOCK_TIMEOUT_S."""
    if connection.vendor != "postgresql":
        return
    if not connection.in_atomic_block:
        raise RuntimeError("the plan lock is transaction-scoped: take it inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (previous,) = cursor.fetchone()
        # SET LOCAL bounds only this transaction's waits, and only until it is set back below.
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(timeout_s() * 1000)}ms"])
        try:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PLAN_LOCK_ID])
        except OperationalError as exc:
            if getattr(getattr(exc, "__cause__", None), "sqlstate", None) == "55P03":
                raise PlanBusy(
                    f"the scheduler is busy: the plan lock was not free within {timeout_s():g} s; try again"
                ) from None
            raise
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def try_take() -> bool:
    """Takes the plan lock for the rest of the current transaction if it is free now; False if another holds it.
    On SQLite there is nothing to try: the IMMEDIATE write transaction is the lock, and waits as `take` does."""
    if connection.vendor != "postgresql":
        return True
    if not connection.in_atomic_block:
        raise RuntimeError("the plan lock is transaction-scoped: take it inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [PLAN_LOCK_ID])
        (taken,) = cursor.fetchone()
    return bool(taken)


def is_busy_error(exc: BaseException) -> bool:
    """SQLite's "database is locked" after its busy timeout: the same condition as PlanBusy, one level down. Also
    PostgreSQL's connection pool found empty for DB_POOL_TIMEOUT_S (psycopg-pool's PoolTimeout, which Django raises
    as its OperationalError): the request did nothing yet and may be sent again."""
    if not isinstance(exc, OperationalError):
        return False
    return "database is locked" in str(exc) or isinstance(exc.__cause__, PoolTimeout)
