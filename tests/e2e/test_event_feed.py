"""Following the event feed through a restart and an outage (issue 47): a client follows `/api/events/` as a
Server-Sent Events stream from seq 0 while 2,000 leases are submitted as lease arrays through both Daphnes, the
Daphne it reads from is restarted (SIGTERM) and Redis is stopped for 25 s. It must see every event exactly once and
in order (nothing the outbox numbered is missing, nothing repeated, the seqs strictly increasing), every lease's own
events beginning with its `lease.submitted`, and it must resume with `Last-Event-ID` where its stream ended."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict

import pytest
import requests

from tests.e2e.harness import Cluster, lease_body, say, wait_for
from tests.e2e.test_faults import TERMINAL, assert_invariants, queue_drains

# One cluster and one e2e database for all of them: under pytest-xdist they run on one worker, in turn.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e"), pytest.mark.timeout(420)]

LEASES = 2000
ARRAY = 100
REDIS_DOWN_S = 25


class Follower:
    """A feed client as an integration writes one: it reads the stream, and when the stream ends or breaks it
    reconnects (to the other Daphne) with `Last-Event-ID` set to the last seq it saw."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.events: list[dict] = []
        self.received_at: list[float] = []
        self.resumed_from: list[tuple[int, int]] = []  # (which Daphne, Last-Event-ID sent)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def last(self) -> int:
        return self.events[-1]["seq"] if self.events else 0

    def start(self) -> Follower:
        self.thread.start()
        return self

    def _run(self) -> None:
        which = 0
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.cluster.token}"
        first = True
        while not self.stop.is_set():
            headers = {"Accept": "text/event-stream"}
            url = self.cluster.daphne_urls[which] + "/api/events/"
            if first:
                url += "?after=0"
            else:
                headers["Last-Event-ID"] = str(self.last)
                self.resumed_from.append((which, self.last))
            try:
                with session.get(url, headers=headers, stream=True, timeout=(3, 30)) as response:
                    if response.status_code == 200:
                        first = False
                        self._read(response)
            except (requests.ConnectionError, requests.Timeout, OSError):
                pass
            which = 1 - which  # the stream ended or broke: resume on the other Daphne
            time.sleep(0.2)

    def _read(self, response: requests.Response) -> None:
        data = None
        for line in response.iter_lines(decode_unicode=True):
            if self.stop.is_set():
                return
            if line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
            elif line == "" and data is not None:
                self.events.append(data)
                self.received_at.append(time.monotonic())
                data = None


def submit_arrays(cluster: Cluster, start: int, stop: int, via: tuple[int, ...] = (0, 1)) -> list[int]:
    ids = []
    for first in range(start, stop, ARRAY):
        items = []
        for i in range(first, min(first + ARRAY, stop)):
            body = lease_body(f"e2e-feed-{i}", driver="sim", type="best_effort", duration_s=1)
            body["nodes"] = [{"cpu_cores": 0.05, "mem_mib": 16}]
            items.append(body)
        response = cluster.api(via[(first // ARRAY) % len(via)]).post(
            "/api/leases/batch", {"leases": items}, headers={"Prefer": "return=minimal"}
        )
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["status"] for r in results] == [201] * len(items), results
        ids += [r["id"] for r in results]
    return ids


def test_a_follower_sees_every_event_once_and_in_order_through_a_restart_and_a_redis_outage(cluster: Cluster):
    follower = Follower(cluster).start()
    try:
        ids = submit_arrays(cluster, 0, 600)
        wait_for(lambda: follower.last > 0, 30, "the follower to read its first events")

        # The Daphne the follower reads from is restarted: its stream ends, the follower resumes on the other.
        streams_before = len(follower.resumed_from)
        cluster.procs["daphne1"].stop()
        ids += submit_arrays(cluster, 600, 1000, via=(1,))
        cluster.bring_back("daphne1")
        wait_for(lambda: len(follower.resumed_from) > streams_before, 30, "the follower to resume")
        say(f"daphne1 restarted; follower resumed with Last-Event-ID {follower.resumed_from[-1][1]}")

        cluster.procs["redis"].stop()
        down_from = time.monotonic()
        ids += submit_arrays(cluster, 1000, 1600)
        time.sleep(max(0.0, REDIS_DOWN_S - (time.monotonic() - down_from)))
        down_until = time.monotonic()
        cluster.restart_redis()
        say(f"redis back after {down_until - down_from:.0f} s")
        ids += submit_arrays(cluster, 1600, LEASES)
        assert len(ids) == LEASES

        # Every lease ends (1 s each); the follower reads up to the outbox's last number at that moment.
        wait_for(
            lambda: all(
                s in TERMINAL
                for (s,) in cluster.sql("SELECT state FROM leases_lease WHERE id = ANY(%s)", ids)
            ),
            240,
            "every lease of the run to end",
            interval=2,
        )
        (head,) = cluster.sql("SELECT COALESCE(MAX(seq), 0) FROM slotkeeper_event")[0]
        wait_for(lambda: follower.last >= head, 60, f"the follower to reach seq {head}")
    finally:
        follower.stop.set()
        follower.thread.join(35)

    seen = [e["seq"] for e in follower.events if e["seq"] <= head]
    assert seen == sorted(set(seen)), "an event was seen twice or out of order"
    numbered = [
        seq for (seq,) in cluster.sql("SELECT seq FROM slotkeeper_event WHERE seq <= %s ORDER BY seq", head)
    ]
    missing = sorted(set(numbered) - set(seen))
    assert not missing, f"{len(missing)} events never reached the follower, e.g. {missing[:10]}"
    assert seen == numbered

    # Every lease's events: once each, in the order the outbox holds them, the first its submission.
    by_lease: dict[int, list[str]] = defaultdict(list)
    ours = set(ids)
    for e in follower.events:
        if e["lease"] in ours and e["type"].startswith("lease."):
            by_lease[e["lease"]].append(e["type"])
    stored: dict[int, list[str]] = defaultdict(list)
    for lease, type_ in cluster.sql(
        "SELECT lease_id, type FROM slotkeeper_event WHERE lease_id = ANY(%s) AND type LIKE 'lease.%%' "
        "ORDER BY seq",
        ids,
    ):
        stored[lease].append(type_)
    assert set(by_lease) == set(ids)
    assert by_lease == stored
    assert Counter(types[0] for types in by_lease.values()) == {"lease.submitted": LEASES}
    ends = {
        "done": "lease.ended",
        "failed": "lease.failed",
        "cancelled": "lease.cancelled",
        "rejected": "lease.rejected",
    }
    final = dict(cluster.sql("SELECT id, state FROM leases_lease WHERE id = ANY(%s)", ids))
    assert all(by_lease[i].count("lease.submitted") == 1 and by_lease[i][-1] == ends[final[i]] for i in ids)

    # It resumed with Last-Event-ID after its stream ended, and events kept coming while Redis was away.
    assert follower.resumed_from and all(after > 0 for _, after in follower.resumed_from)
    assert any(down_from <= t <= down_until for t in follower.received_at), (
        "no event reached it while Redis was down"
    )
    say(
        f"follower: {len(seen):,} events to seq {head}, {len(follower.resumed_from)} resumptions, "
        f"{sum(len(v) for v in by_lease.values()):,} lease events of {LEASES:,} leases"
    )
    queue_drains(cluster)
    assert_invariants(cluster)
