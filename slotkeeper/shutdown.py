"""Process shutdown: one flag that says "this process is stopping", and a deadline after which it exits anyway.

Daphne stops its event loop on SIGTERM, but the threads that run Django's sync views outlive the loop: a request
cancelled in the middle of its transaction still commits, and Python waits for every such thread before the
process can exit. Before this module, those threads then sent their after-commit broadcast to the stopped loop
and waited for it forever (33 of them, the process alive 76 s after SIGTERM, until the orchestrator killed it).
Now the broadcast is skipped once shutdown has begun (slotkeeper/events.py), the embedded periodic loop ends
(slotkeeper/embedded.py), and if anything else still holds the process `EXIT_DEADLINE_S` after SIGTERM, it logs
what every thread is doing and exits: every write is one transaction, so the database rolls back what was not
committed, and a process that will not stop is worse than one request answered by a closed connection.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Inside the 10 s that deploy/ gives a web process between SIGTERM and SIGKILL, with room for the exit itself.
EXIT_DEADLINE_S = 8.0

_begun = threading.Event()
_callbacks: list[Callable[[], None]] = []
_watching_daphne = False


def begun() -> bool:
    return _begun.is_set()


def on_begin(callback: Callable[[], None]) -> Callable[[], None]:
    """Calls `callback` when shutdown begins (at once if it already has); returns the function that unsubscribes."""
    _callbacks.append(callback)
    if begun():
        _call(callback)
    return lambda: _callbacks.remove(callback) if callback in _callbacks else None


def begin(reason: str, *, exit_deadline_s: float | None = EXIT_DEADLINE_S) -> None:
    if _begun.is_set():
        return
    _begun.set()
    log.info("shutdown begun: %s", reason)
    for callback in list(_callbacks):
        _call(callback)
    if exit_deadline_s is not None:
        threading.Thread(
            target=_exit_after, args=(exit_deadline_s,), name="shutdown-deadline", daemon=True
        ).start()


def _call(callback: Callable[[], None]) -> None:
    # One subscriber failing (its loop already closed) must not keep the others from hearing about it.
    try:
        callback()
    except Exception:
        log.warning("shutdown callback failed", exc_info=True)


def _exit_after(deadline_s: float) -> None:
    time.sleep(deadline_s)
    busy = [t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    log.error("still running %.0f s after shutdown began, exiting; busy threads: %s", deadline_s, busy)
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(1)


def watch_daphne() -> None:
    """Begins shutdown the moment Daphne's reactor starts stopping (SIGTERM, SIGINT): before Daphne cancels its
    application instances and stops the loop, so no request thread queues a broadcast on a loop that is about to
    stop. Call it from code running under Daphne (the first request); elsewhere (tests, Celery) it does nothing."""
    global _watching_daphne
    reactor = sys.modules.get("twisted.internet.reactor")
    if _watching_daphne or reactor is None or not getattr(reactor, "running", False):
        return
    _watching_daphne = True
    reactor.addSystemEventTrigger("before", "shutdown", begin, "the server is stopping")


# The timeouts every Daphne of the project runs with (deploy/, `manage.py demo`, the e2e harness, the browser
# tests; tests/deploy checks deploy/). A closed connection's application gets 5 s to end before Daphne cancels it,
# instead of 10, so a stop never waits on it past the exit deadline; a websocket handshake gets 5 s; an idle console
# is pinged every 20 s and closed when it has not answered for 30, so a laptop that went to sleep does not keep
# a console (and its share of every broadcast) alive for a day.
DAPHNE_TIMEOUTS = (
    "--application-close-timeout",
    "5",
    "--websocket_connect_timeout",
    "5",
    "--ping-interval",
    "20",
    "--ping-timeout",
    "30",
)
