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
import signal
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
    """Under Daphne: SIGTERM drains the server before it stops (`drain`), and shutdown begins the moment the
    reactor starts stopping (SIGINT, or the drain's end): before Daphne cancels its application instances and stops
    the loop, so no request thread queues a broadcast on a loop that is about to stop. Call it from code running
    under Daphne, on its loop (the first request); elsewhere (tests, Celery) it does nothing."""
    global _watching_daphne
    reactor = sys.modules.get("twisted.internet.reactor")
    if _watching_daphne or reactor is None or not getattr(reactor, "running", False):
        return
    _watching_daphne = True
    reactor.addSystemEventTrigger("before", "shutdown", begin, "the server is stopping")
    if threading.current_thread() is threading.main_thread():
        # In place of Twisted's own SIGTERM handler, which stops the reactor at once: the requests in flight then
        # lost their answers though their writes had committed, and a client that retried made a second lease.
        signal.signal(signal.SIGTERM, lambda *_: reactor.callFromThread(drain, reactor))


# How long a SIGTERM waits for the requests in flight to be answered before the reactor stops anyway: inside
# EXIT_DEADLINE_S, which is counted from the same SIGTERM.
DRAIN_S = 6.0
_in_flight = 0
_in_flight_lock = threading.Lock()


def request_began() -> None:
    global _in_flight
    with _in_flight_lock:
        _in_flight += 1


def request_ended() -> None:
    global _in_flight
    with _in_flight_lock:
        _in_flight -= 1


def in_flight() -> int:
    return _in_flight


def drain(reactor, *, within_s: float = DRAIN_S) -> None:
    """SIGTERM under Daphne, on the reactor's thread: stop accepting connections (a client is refused at once and
    goes to another server), answer every HTTP request already in flight, then stop the reactor, which closes
    the idle connections and the websockets (consoles reconnect elsewhere). A request that has not finished by
    `within_s` loses its answer as before; every write is one transaction, so it committed or did not."""
    from twisted.internet import tcp

    if begun():
        return
    begin("SIGTERM: draining the requests in flight")  # the exit deadline counts from here
    for reader in list(reactor.getReaders()):
        if isinstance(reader, tcp.Port):
            reader.stopListening()
    deadline = time.monotonic() + within_s

    def check() -> None:
        if in_flight() <= 0 or time.monotonic() >= deadline:
            log.info("drained: stopping", extra={"in_flight": in_flight()})
            reactor.stop()
        else:
            reactor.callLater(0.02, check)

    check()


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
