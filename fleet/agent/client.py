"""The agent's side of the server API: requests with timeouts, errors sorted by what to do next, backoff.

Every failure is one of three kinds, because each asks for a different reaction: the server is away (back off
and retry, instances keep running), the server refuses this node for good (401/403/404: stop with a message a
person can act on, since retrying a revoked token forever only fills logs), or the server rejected one request
(400: log its field messages and carry on).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import requests

from fleet.agent.assignments import AssignmentBatch, MalformedAssignment, parse_batch

# (connect, read): a server that accepts the connection and then hangs must not hold the loop longer than a
# few heartbeat intervals.
DEFAULT_TIMEOUT = (3.05, 10.0)


class Response(Protocol):
    status_code: int

    def json(self) -> Any: ...


class Transport(Protocol):
    """What the agent needs of `requests.Session`; tests pass a fake with the same method."""

    def request(
        self, method: str, url: str, *, headers: Mapping[str, str], json: Any, timeout: Any
    ) -> Response: ...


class ServerUnavailable(Exception):
    """Transient: no answer, a timeout, 5xx/429, or an answer that is not the JSON we expect."""


class NodeRefused(Exception):
    """Permanent for this token and node id: the agent stops."""


class RequestRejected(Exception):
    """400: the server named what it did not like in this one request."""


class NodeFenced(Exception):
    """409 with `"code": "fenced"`: an operator declared this node dead. Its work was (or will be) moved, so the
    agent stops every instance and keeps asking, without starting anything, until an admin re-admits the node."""


@dataclass(frozen=True)
class HeartbeatReply:
    status: str
    server_time: str


@dataclass(frozen=True)
class Registration:
    id: int
    name: str
    token: str


class Backoff:
    """Full jitter, capped: delay n is uniform in [0, min(cap, base * 2**n)].

    Jitter over the whole range (not around the exponential value) is what spreads a fleet that lost the
    server at the same moment; without it every agent retries in lockstep and the recovering server meets
    them all at once.
    """

    def __init__(
        self, base_s: float = 1.0, cap_s: float = 60.0, rng: Callable[[], float] = random.random
    ) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._rng = rng
        self.failures = 0

    def ceiling(self, failures: int) -> float:
        # The exponent is clamped because an agent cut off for a day counts thousands of failures, and
        # 2.0**2000 raises OverflowError: the backoff that protects the server would crash the agent.
        return min(self.cap_s, self.base_s * 2.0 ** min(failures, 64))

    def next_delay(self) -> float:
        delay = self._rng() * self.ceiling(self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class ServerClient:
    def __init__(
        self, server: str, node_id: int, token: str, transport: Transport | None = None, timeout: Any = None
    ) -> None:
        self.base = server.rstrip("/")
        self.node_id = node_id
        self._token = token
        self._transport: Transport = transport if transport is not None else requests.Session()
        self._timeout = timeout if timeout is not None else DEFAULT_TIMEOUT

    def heartbeat(self, payload: Mapping[str, Any]) -> HeartbeatReply:
        body = self._call("POST", f"/api/nodes/{self.node_id}/heartbeat", payload)
        if not isinstance(body, dict) or not isinstance(body.get("status"), str):
            raise ServerUnavailable("heartbeat answer has no 'status'")
        return HeartbeatReply(body["status"], str(body.get("server_time", "")))

    def assignments(self, default_driver: str) -> AssignmentBatch:
        body = self._call("GET", f"/api/nodes/{self.node_id}/assignments", None)
        try:
            return parse_batch(body, default_driver)
        except MalformedAssignment as exc:
            raise ServerUnavailable(str(exc)) from exc

    def _call(self, method: str, path: str, payload: Any) -> Any:
        return call(
            self._transport, method, self.base + path, self._token, payload, self._timeout, self.node_id
        )


def register(
    transport: Transport, server: str, operator_token: str, fields: Mapping[str, Any], timeout: Any = None
) -> Registration:
    """Create this node on the server with an operator token; the answer's node token is shown only once."""
    url = server.rstrip("/") + "/api/nodes/"
    body = call(transport, "POST", url, operator_token, dict(fields), timeout or DEFAULT_TIMEOUT, None)
    try:
        return Registration(int(body["id"]), str(body["name"]), str(body["token"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ServerUnavailable(f"registration answer is missing {exc}") from exc


def call(
    transport: Transport, method: str, url: str, token: str, payload: Any, timeout: Any, node_id: int | None
) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    try:
        response = transport.request(method, url, headers=headers, json=payload, timeout=timeout)
    except requests.RequestException as exc:
        raise ServerUnavailable(f"{method} {url}: {exc}") from exc
    refusal = _refusal(response.status_code, node_id)
    if refusal:
        raise NodeRefused(refusal)
    if response.status_code == 400:
        raise RequestRejected(f"{method} {url} rejected: {_json_or_none(response)}")
    if response.status_code == 409:
        body = _json_or_none(response)
        if isinstance(body, dict) and body.get("code") == "fenced":
            raise NodeFenced(str(body.get("detail") or "this node is fenced"))
    if not 200 <= response.status_code < 300:
        raise ServerUnavailable(f"{method} {url}: HTTP {response.status_code}")
    body = _json_or_none(response)
    if body is None:
        raise ServerUnavailable(f"{method} {url}: answer is not JSON")
    return body


def _refusal(status: int, node_id: int | None) -> str | None:
    if node_id is None:
        return {
            401: "operator token revoked or invalid",
            403: "the operator token may not register nodes",
            404: "the server has no /api/nodes/: check --server",
        }.get(status)
    return {
        401: f"token revoked or invalid for node {node_id}",
        403: f"the token belongs to another node, not node {node_id}",
        404: f"node {node_id} is unknown to the server (deleted?); register again",
    }.get(status)


def _json_or_none(response: Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
