"""Wakes the requests that wait for a planning pass (the plan applier's group commit, leases/planning/).

A lease request stores its intent and waits for whoever holds the plan lock to plan it. It must not poll the
database in a tight loop while it waits (a burst of a thousand waiters would make a thousand queries every few
milliseconds), so every committed pass announces itself:

- to the waiters of its own process through a condition variable, after commit;
- to the other processes through PostgreSQL's NOTIFY, sent inside the pass's transaction (so it is delivered on
  commit, never for a pass that rolled back). One listener thread per process holds a connection that LISTENs
  and wakes that process's waiters.

A waiter takes a ticket (the count of passes it has heard of) before it looks at its lease, and sleeps only until
the count moves past that ticket, so a pass that commits between the look and the sleep is never missed. Every
sleep is still bounded (FALLBACK_POLL_S): a lost notification or a listener that died costs a poll, not a hang.

Each announcement names the requests its pass decided (in the NOTIFY payload after the version, "*" when the
list would not fit), and a woken waiter looks at its lease again only when a pass it has not yet looked after
named it (`named_since`), or named nothing it could read. Before, every waiter read its lease at every pass:
a burst's waiters asked the database again and again for rows still waiting, a quarter of the submitting
processes' GIL time (docs/benchmarks/burst.md, "Lease burst: a victims search that cannot stall, a cheaper pass, fewer
looks"). An announcement from a process that names
nothing (an older release) counts as naming everyone.

It lives in the project kernel beside planlock, because it is transport, not lease logic.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterable

from django.db import connection, transaction

log = logging.getLogger(__name__)

CHANNEL = "slotkeeper_plan"
# The longest a waiter sleeps without a signal before it looks at the database again.
FALLBACK_POLL_S = 0.5

_cond = threading.Condition()
_seq = 0
# The passes heard of most recently: (ticket it raised the count to, the requests it decided, or None when unknown).
_named: collections.deque[tuple[int, frozenset[int] | None]] = collections.deque(maxlen=256)
# NOTIFY payloads must stay under 8,000 bytes; a longer list is sent as "*".
MAX_PAYLOAD = 7900
_state = {"notified": 0}  # passes heard of from other processes (tests check a waiter was woken this way)
_listener: threading.Thread | None = None
_listening = threading.Event()
_stop = threading.Event()
_start_lock = threading.Lock()


def ticket() -> int:
    with _cond:
        return _seq


def heard_from_others() -> int:
    return _state["notified"]


def hears_all() -> bool:
    """Whether every pass that commits, in any process, is heard of here, so that `named_since` can be trusted:
    on SQLite (one process) always; on PostgreSQL while the listener is connected and listening."""
    if connection.vendor != "postgresql":
        return True
    return _listener is not None and _listener.is_alive() and _listening.is_set()


def named_since(after: int, lease_id: int) -> bool:
    """Whether a pass heard of after the ticket `after` may have decided `lease_id`: it named it, or named
    nothing readable, or it is too far back to know."""
    with _cond:
        if _seq == after:
            return False
        if not _named or _named[0][0] > after + 1:
            return True  # passes after `after` were dropped from the window: unknown
        return any(seq > after and (ids is None or lease_id in ids) for seq, ids in _named)


def _bump(decided: frozenset[int] | None = None, *, remote: bool = False) -> None:
    global _seq
    with _cond:
        _seq += 1
        _named.append((_seq, decided))
        if remote:
            _state["notified"] += 1
        _cond.notify_all()


def payload(version: int, decided: Iterable[int]) -> str:
    ids = ",".join(map(str, decided))
    return f"{version} {ids}" if len(ids) <= MAX_PAYLOAD else f"{version} *"


def parse(text: str) -> frozenset[int] | None:
    """The requests a payload names; None when it does not name them readably (too many, an older release)."""
    _, sep, ids = text.partition(" ")
    if not sep or ids == "*":
        return None
    if not ids:
        return frozenset()
    try:
        return frozenset(int(x) for x in ids.split(","))
    except ValueError:
        return None


def wait(after: int, timeout: float) -> bool:
    """Sleeps until a pass commits after the ticket `after` was taken, or `timeout` seconds; True if one did."""
    _ensure_listener()
    with _cond:
        return _cond.wait_for(lambda: _seq != after, timeout)


def announce(version: int, decided: Iterable[int] = ()) -> None:
    """Called inside a pass's transaction, with the requests it decided: every waiter hears of it once the
    transaction commits."""
    decided = tuple(decided)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload(version, decided)])
    named = frozenset(decided)
    transaction.on_commit(lambda: _bump(named))


def _ensure_listener() -> None:
    global _listener
    if connection.vendor != "postgresql":
        return  # SQLite serves one process: the condition variable reaches every waiter
    with _start_lock:
        if _listener is not None and _listener.is_alive():
            return
        _stop.clear()
        _listening.clear()
        _listener = threading.Thread(
            target=_listen, args=(_conninfo(connection.settings_dict),), daemon=True, name="planwake"
        )
        _listener.start()
    # A waiter that starts before the LISTEN is in place could miss a pass; give it a moment, then rely on the
    # fallback poll.
    _listening.wait(1.0)


def _conninfo(settings_dict: dict) -> dict:
    keys = {"NAME": "dbname", "USER": "user", "PASSWORD": "password", "HOST": "host", "PORT": "port"}
    return {arg: settings_dict[key] for key, arg in keys.items() if settings_dict.get(key)}


def _listen(conninfo: dict) -> None:
    import psycopg

    while not _stop.is_set():
        try:
            with psycopg.connect(**conninfo, autocommit=True) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                _listening.set()
                while not _stop.is_set():
                    for note in conn.notifies(timeout=1.0):
                        _bump(parse(note.payload), remote=True)
        except Exception:
            _listening.clear()
            log.warning(
                "the plan-pass listener lost its connection; waiters poll until it is back", exc_info=True
            )
            _stop.wait(1.0)


def stop() -> None:
    """Stops this process's listener (tests, before their database is dropped)."""
    global _listener
    _stop.set()
    if _listener is not None:
        _listener.join(5)
    _listener = None
