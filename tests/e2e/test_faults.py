"""Fault injection in the distributed run (issue 6): `kill -9` of a Celery worker in the middle of a tick and of a
Daphne in the middle of a broadcast, several times each, and Redis stopped for 20 s. After each, SQL over the e2e
database proves nothing was overcommitted, run twice or left behind, and the run keeps making progress."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from tests.e2e.harness import Cluster, consoles, lease_body, say, wait_for

# One cluster and one e2e database for all of them: under pytest-xdist they run on one worker, in turn.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e"), pytest.mark.timeout(240)]

# A worker mid-tick: one of ours holds the plan applier's advisory lock (leases/planning/passes.py takes it per
# tick).
MID_TICK = """
    SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND a.datname = %s AND a.application_name = %s
"""
TERMINAL = {"done", "cancelled", "rejected", "failed"}


def burst(cluster: Cluster, tag: str, count: int) -> list[int]:
    """Best-effort sim leases of a few seconds each, through both Daphnes: enough to queue and keep ticks busy."""
    ids = []
    for i in range(count):
        body = lease_body(f"e2e-{tag}-{i}", driver="sim", type="best_effort", duration_s=6)
        body["nodes"] = [{"cpu_cores": 0.5, "mem_mib": 64}]
        response = cluster.api(i % 2).post("/api/leases/", body)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


def states(cluster: Cluster, ids: list[int]) -> dict[int, str]:
    return dict(cluster.sql("SELECT id, state FROM leases_lease WHERE id = ANY(%s)", ids))


def all_finished(cluster: Cluster, ids: list[int]) -> bool:
    return set(states(cluster, ids).values()) <= TERMINAL


def assert_invariants(cluster: Cluster, settle_s: float = 20) -> None:
    """Every invariant query comes back empty. Agents confirm stops within a second or two, so a violation has to
    persist for `settle_s` before it counts: "live instance of an ended lease" is true for a moment after any end."""
    deadline = time.monotonic() + settle_s
    while True:
        broken = {name: rows for name, rows in cluster.invariants().items() if rows}
        if not broken:
            return
        assert time.monotonic() < deadline, f"invariants broken for {settle_s:g} s: {broken}"
        time.sleep(2)


def queue_drains(cluster: Cluster) -> None:
    # Beat adds two tasks every 5 s; a queue that stays longer than that is not being worked.
    wait_for(lambda: int(cluster.redis_command("LLEN", "celery") or 0) <= 2, 30, "the Celery queue to drain")


def kill_mid_tick(cluster: Cluster, victim: str, conn: psycopg.Connection) -> bool:
    """Kills `victim` the moment it holds the plan lock (a tick half done), or at a random moment after 7 s."""
    deadline = time.monotonic() + 7
    caught = False
    while time.monotonic() < deadline and not caught:
        caught = bool(conn.execute(MID_TICK, (cluster.e2e_database, f"e2e-{victim}")).fetchall())
        time.sleep(0.005)
    cluster.procs[victim].kill9()
    return caught


def test_killing_a_worker_in_the_middle_of_a_tick_loses_nothing_and_runs_nothing_twice(cluster: Cluster):
    submitted: list[int] = []
    hits = 0
    with psycopg.connect(cluster.e2e_database_url, autocommit=True) as conn:
        for round_ in range(4):
            submitted += burst(cluster, f"tick{round_}", 6)
            victim = random.choice(["worker1", "worker2"])
            hits += kill_mid_tick(cluster, victim, conn)
            cluster.restart_worker(victim)
            say(f"round {round_}: killed {victim} ({hits} of {round_ + 1} kills mid-tick so far)")
    say(f"{hits} of 4 worker kills landed while the worker held the plan lock")

    wait_for(lambda: all_finished(cluster, submitted), 120, f"all {len(submitted)} burst leases to finish")
    assert set(states(cluster, submitted).values()) == {"done"}
    queue_drains(cluster)
    assert_invariants(cluster)


def submit_and_kill(cluster: Cluster, name: str) -> int | None:
    """Submits through the first Daphne and kills it 0-300 ms later, mid-request or mid-broadcast. Returns the
    lease id when the 201 arrived before the kill, None when the connection broke first."""
    answer: dict[str, int] = {}

    def send() -> None:
        try:
            response = cluster.api(0).post("/api/leases/", lease_body(name, driver="sim", duration_s=30))
        except OSError:
            return
        if response.status_code == 201:
            answer["id"] = response.json()["id"]

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(random.uniform(0, 0.3))
    cluster.procs["daphne1"].kill9()
    sender.join(25)
    return answer.get("id")


def test_killing_a_daphne_mid_broadcast_the_consoles_reconnect_and_resync(cluster: Cluster):
    with consoles(cluster) as (a, b):
        for round_ in range(3):
            mark = a.mark()
            wait_for(
                lambda m=mark: a.saw("node-changed", m), 10, "events flowing to the first Daphne's console"
            )
            name = f"e2e-daphne-kill-{round_}"
            acknowledged = submit_and_kill(cluster, name)
            # Submitted while the first Daphne is down: the console there must find it when it resyncs.
            missed = cluster.api(1).post(
                "/api/leases/", lease_body(f"{name}-missed", driver="sim", duration_s=30)
            )
            assert missed.status_code == 201, missed.text
            missed_id = missed.json()["id"]

            cluster.restart("daphne1")
            wait_for(lambda r=round_: a.hellos == r + 2, 30, "the first console to reconnect")
            after = a.mark()
            # Resync is a re-fetch over HTTP through the Daphne it reconnected to (what the page does).
            assert cluster.api(0).get(f"/api/leases/{missed_id}/")["state"] == "active"
            wait_for(lambda m=after: a.saw("node-changed", m), 10, "events again after the reconnect")

            rows = cluster.sql("SELECT id FROM leases_lease WHERE name = %s", name)
            assert len(rows) <= 1, f"lease {name} stored {len(rows)} times"
            if acknowledged is not None:
                assert rows == [(acknowledged,)], f"lease {acknowledged} was acknowledged and then lost"
            say(
                f"round {round_}: daphne1 killed ({'after' if acknowledged else 'before'} its 201), console back"
            )
        assert b.hellos == 1, "the console on the Daphne that was never killed reconnected"
        assert b.saw("lease-changed", lease=missed_id)
    assert_invariants(cluster)


def test_with_redis_stopped_for_20_s_scheduling_goes_on_and_consoles_resync_when_it_returns(cluster: Cluster):
    with consoles(cluster) as (a, b):
        cluster.procs["redis"].stop()
        down_at = time.monotonic()
        say("redis stopped")
        during = []
        for which in (0, 1):
            started = time.monotonic()
            response = cluster.api(which).post(
                "/api/leases/", lease_body(f"e2e-no-redis-{which}", driver="sim", duration_s=15)
            )
            took = time.monotonic() - started
            assert response.status_code == 201, response.text
            assert response.json()["state"] == "active"
            assert took < 5, f"a submit took {took:.1f} s while Redis was away"
            during.append(response.json()["id"])
        say(f"submits without redis: {during}")
        time.sleep(max(0, 20 - (time.monotonic() - down_at)))

        cluster.restart_redis()
        say("redis back")
        marks = a.mark(), b.mark()
        for console, mark in zip((a, b), marks, strict=True):
            # Without Redis a console cannot stay subscribed: it is closed with 4013 and refused until
            # Redis is back; the console must then be subscribed again, not left on a socket that hears nothing.
            wait_for(lambda c=console: c.hellos >= 2, 30, f"the console on {console.base} to reconnect")
            wait_for(
                lambda c=console, m=mark: c.saw("node-changed", m), 30, f"events again on {console.base}"
            )
        say(f"consoles back: {a.hellos - 1} and {b.hellos - 1} reconnections")
        # Ticks resume: the leases placed while Redis was away end on time.
        wait_for(
            lambda: all_finished(cluster, during), 60, "the leases submitted during the outage to finish"
        )
    queue_drains(cluster)
    assert_invariants(cluster)


# A pass mid-way: it holds the plan lock and waits on a lock of ours (its version row's insert, the last write
# before its commit), so it has planned and written everything else it will.
PASS_HELD = """
    SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND a.datname = %s AND a.wait_event_type = 'Lock'
"""


def test_killing_the_process_mid_pass_every_waiting_request_is_decided_once(cluster: Cluster):
    """Group commit under a kill: a Daphne's pass holds every waiting request of the batch (the other Daphne's
    too) when it is killed. Its transaction rolls back; the other Daphne's waiters must each still get one
    answer, the killed Daphne's orphaned intents must be decided by a later pass, and nothing is stored twice."""
    prefix = "e2e-midpass"
    answers: dict[str, int | None] = {}

    def body(name: str) -> dict:
        return lease_body(name, driver="sim", type="best_effort", duration_s=3)

    def send(which: int, name: str) -> None:
        try:
            # Each request named by its client (Idempotency-Key), so that one whose answer is lost can be retried.
            response = cluster.api(which).post("/api/leases/", body(name), headers={"Idempotency-Key": name})
        except OSError:
            answers[name] = None  # the Daphne it went to was killed before it answered
            return
        answers[name] = response.status_code

    def stored(state: str | None = None) -> int:
        rows = cluster.sql("SELECT state FROM leases_lease WHERE name LIKE %s", prefix + "-%")
        return sum(1 for (s,) in rows if state is None or s == state)

    senders: list[threading.Thread] = []

    def start(which: int, name: str) -> None:
        senders.append(threading.Thread(target=send, args=(which, name)))
        senders[-1].start()

    with psycopg.connect(cluster.e2e_database_url) as blocker:
        # Every pass ends by inserting its version row: holding that table stops each pass just before it commits.
        blocker.execute("LOCK TABLE leases_planversion IN EXCLUSIVE MODE")
        start(0, f"{prefix}-first")
        holders = wait_for(
            lambda: cluster.sql(PASS_HELD, cluster.e2e_database), 10, "a pass to hold the plan lock, mid-way"
        )
        victim = holders[0][0].removeprefix("e2e-")
        # More requests on both Daphnes while that pass is stuck: their intents wait for the next pass.
        for i in range(4):
            start(0, f"{prefix}-d1-{i}")
            start(1, f"{prefix}-d2-{i}")
        wait_for(lambda: stored("new") == 9, 10, "all nine requests stored as intents")
        cluster.procs[victim].kill9()
        blocker.rollback()
    say(f"killed {victim} while its pass held the plan lock and nine requests waited")

    for sender in senders:
        sender.join(30)
    survivor = {"daphne1": 1, "daphne2": 0}.get(victim)
    for name, status in answers.items():
        sent_to = 0 if name.startswith((f"{prefix}-first", f"{prefix}-d1")) else 1
        if survivor is None or sent_to == survivor:
            assert status == 201, f"{name}, sent to a Daphne that was not killed, was answered {status}"
    assert len(answers) == 9, f"only {len(answers)} of nine requests came back at all"
    # The killed process's waiters are gone, not their intents: a later pass (a waiter's, or the tick's) decides them.
    wait_for(lambda: stored("new") == 0, 20, "every stored intent to be decided")
    names = cluster.sql(
        "SELECT name, COUNT(*) FROM leases_lease WHERE name LIKE %s GROUP BY name", prefix + "-%"
    )
    assert all(count == 1 for _, count in names), f"a request stored twice: {names}"
    answered = {name for name, status in answers.items() if status == 201}
    assert answered <= {name for name, _ in names}, "a request answered 201 left no lease"
    # A client whose answer was lost with the killed Daphne retries with the same key, at the one still up: it is
    # answered with the decision the later pass made, and no second lease is stored.
    lost = [name for name, status in answers.items() if status is None]
    assert lost or survivor is None, "the killed Daphne's own requests lost their answers"
    for name in lost:
        retry = cluster.api(survivor if survivor is not None else 0).post(
            "/api/leases/", body(name), headers={"Idempotency-Key": name}
        )
        assert retry.status_code == 201, (name, retry.status_code, retry.text)
        assert retry.headers.get("Idempotent-Replayed") == "true" and retry.json()["name"] == name
    names = cluster.sql(
        "SELECT name, COUNT(*) FROM leases_lease WHERE name LIKE %s GROUP BY name", prefix + "-%"
    )
    assert len(names) == 9 and all(count == 1 for _, count in names), f"a retry stored again: {names}"

    cluster.bring_back(victim)
    ids = [lid for (lid,) in cluster.sql("SELECT id FROM leases_lease WHERE name LIKE %s", prefix + "-%")]
    wait_for(lambda: all_finished(cluster, ids), 90, f"the {len(ids)} leases to finish")
    assert set(states(cluster, ids).values()) == {"done"}
    queue_drains(cluster)
    assert_invariants(cluster)
