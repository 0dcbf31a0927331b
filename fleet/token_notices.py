"""Node tokens forgotten in every web process within milliseconds, not at the next heartbeat flush.

A token rotation, a fence (declare-dead) or a node's deletion drops the node's remembered token in the process that
made it (fleet/actions.py `_forget_tokens`). The other processes used to find out when they next wrote for that
node: at once in the per-request heartbeat, but one flush interval later for a buffered one
(slotkeeper/heartbeat_route.py), during which that node's heartbeats were answered 200 (and written nothing). On
PostgreSQL the change now also sends a NOTIFY in its own transaction (delivered when it commits, never when it rolls
back), and each web process that buffers heartbeats listens on its own connection and forgets the node's token as
it arrives. The flush's guard stays the rule; this only narrows the window. A listener that loses its connection
forgets every token when it is back, since it may have missed some.
"""

from __future__ import annotations

import logging
import threading

from django.db import connection

from slotkeeper.auth import node_tokens

log = logging.getLogger(__name__)

CHANNEL = "slotkeeper_node_tokens"


def announce(node_id: int) -> None:
    """Tells every listening process to forget the node's token when the caller's transaction commits."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(node_id)])


class Listener:
    """One thread and one connection per process, started with the process's first buffered heartbeat."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # listening (tests wait for it)

    def start(self) -> None:
        if self._thread is None and connection.vendor == "postgresql":
            params = connection.get_connection_params()
            self._thread = threading.Thread(
                target=self._run, args=(params,), name="token-notices", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, params: dict) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if self.ready.is_set():
                        node_tokens.clear()  # back after a gap: any notice may have been missed
                    self.ready.set()
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            if notice.payload.isdigit():
                                node_tokens.forget_node(int(notice.payload))
            except Exception:
                log.warning("token notices: connection lost; retrying in 1 s", exc_info=True)
                self._stop.wait(1.0)
