"""The client sorts server answers into back off / stop / log, and backs off with capped full jitter."""

import random

import pytest
import requests

from fleet.agent.client import (
    Backoff,
    NodeRefused,
    RequestRejected,
    ServerClient,
    ServerUnavailable,
    register,
)


class Answer:
    def __init__(self, status_code: int, body=None, text: bool = False):
        self.status_code = status_code
        self._body = body
        self._text = text

    def json(self):
        if self._text:
            raise ValueError("not JSON")
        return self._body


class Scripted:
    """A transport that returns (or raises) a fixed answer and remembers what it was asked."""

    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def request(self, method, url, *, headers, json, timeout):
        self.calls.append(
            {"method": method, "url": url, "headers": headers, "json": json, "timeout": timeout}
        )
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def client(answer) -> tuple[ServerClient, Scripted]:
    transport = Scripted(answer)
    return ServerClient("http://console:8000/", 5, "node-secret", transport), transport


def test_a_heartbeat_posts_with_the_node_token_and_a_timeout():
    c, transport = client(Answer(200, {"status": "draining", "server_time": "2025-01-01T00:00:00Z"}))
    reply = c.heartbeat({"mem_total_mib": 1})
    assert reply.status == "draining"
    call = transport.calls[0]
    assert (call["method"], call["url"]) == ("POST", "http://console:8000/api/nodes/5/heartbeat")
    assert call["headers"]["Authorization"] == "Bearer node-secret"
    assert call["timeout"] is not None, "a hung server must not hang the agent"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (401, "token revoked or invalid for node 5"),
        (403, "the token belongs to another node, not node 5"),
        (404, "node 5 is unknown to the server"),
    ],
)
def test_a_refusal_of_this_node_is_final(status, message):
    c, _ = client(Answer(status, {"detail": "no"}))
    with pytest.raises(NodeRefused, match=message):
        c.heartbeat({})


@pytest.mark.parametrize(
    "answer",
    [
        requests.ConnectionError("connection refused"),
        requests.Timeout("read timed out"),
        Answer(503, {}),
        Answer(429, {}),
        Answer(200, text=True),
        Answer(200, {"unexpected": True}),
    ],
    ids=["refused", "timeout", "503", "429", "not json", "no status"],
)
def test_an_absent_or_confused_server_is_transient(answer):
    c, _ = client(answer)
    with pytest.raises(ServerUnavailable):
        c.heartbeat({})


def test_a_400_names_the_fields_the_server_rejected():
    c, _ = client(Answer(400, {"cpu_pct": ["Ensure this value is less than or equal to 100."]}))
    with pytest.raises(RequestRejected, match="cpu_pct"):
        c.heartbeat({"cpu_pct": 900})


def test_an_assignments_answer_without_instances_is_transient_not_an_empty_node():
    # Treating a garbled answer as "nothing assigned" would stop every instance on the node.
    c, _ = client(Answer(200, {"node": 5}))
    with pytest.raises(ServerUnavailable, match="no 'instances' list"):
        c.assignments("process")


def test_registration_uses_the_operator_token_and_returns_the_node_token():
    transport = Scripted(Answer(201, {"id": 12, "name": "tank", "token": "shown-once"}))
    done = register(transport, "http://console:8000", "op-secret", {"name": "tank", "cpu_cores": 16})
    assert (done.id, done.name, done.token) == (12, "tank", "shown-once")
    assert transport.calls[0]["url"] == "http://console:8000/api/nodes/"
    assert transport.calls[0]["headers"]["Authorization"] == "Bearer op-secret"


def test_a_rejected_operator_token_says_so():
    with pytest.raises(NodeRefused, match="operator token revoked or invalid"):
        register(Scripted(Answer(401, {})), "http://console:8000", "bad", {"name": "tank"})


def test_backoff_ceilings_double_from_the_base_up_to_the_cap():
    backoff = Backoff(base_s=1.0, cap_s=60.0, rng=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(9)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


@pytest.mark.parametrize("failures", [0, 1, 5, 6, 50, 5000])
def test_every_backoff_delay_stays_within_zero_and_its_ceiling(failures):
    backoff = Backoff(base_s=0.5, cap_s=30.0, rng=random.Random(failures).random)
    backoff.failures = failures
    ceiling = min(30.0, 0.5 * 2.0 ** min(failures, 64))
    delays = []
    for _ in range(200):
        backoff.failures = failures
        delays.append(backoff.next_delay())
    assert all(0.0 <= d <= ceiling for d in delays)
    assert max(delays) > ceiling / 2, "full jitter spreads over the whole range, not a sliver of it"


def test_a_success_resets_the_backoff():
    backoff = Backoff(base_s=1.0, cap_s=60.0, rng=lambda: 1.0)
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_a_fenced_answer_is_its_own_error_not_a_rejected_request():
    from fleet.agent.client import NodeFenced

    c, _ = client(Answer(409, {"detail": "node 5 was declared dead (PSU)", "code": "fenced"}))
    with pytest.raises(NodeFenced, match="PSU"):
        c.heartbeat({"mem_total_mib": 1})
