"""Daphne leaves POST bodies to the application (slotkeeper/serving.py): Twisted no longer parses a form body on the
event loop before anyone is authenticated, nor answers one it cannot parse with a 400 of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from daphne import http_protocol

from slotkeeper.serving import RawBodyRequest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def daphne(tmp_path_factory):
    """A real Daphne serving the project's ASGI application (the probes need no database)."""
    tmp = tmp_path_factory.mktemp("serving")
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}",
        "SECRET_KEY": "test-only",
        "EMBEDDED_LOOP": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "WARNING",
    }
    port = free_port()
    log = (tmp / "daphne.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "slotkeeper.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        else:
            raise AssertionError(f"Daphne did not start: {(tmp / 'daphne.log').read_text()[-2000:]}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_a_form_body_twisted_cannot_parse_reaches_the_application(daphne):
    # Twisted parsed this as multipart and, failing, answered a bare 400 and hung up before Django had the request.
    response = requests.post(
        f"{daphne}/api/leases/",
        data=b"not a multipart body",
        headers={"Content-Type": "multipart/form-data; boundary=xx"},
        timeout=10,
    )
    assert response.status_code == 401  # Django's answer to a request without credentials
    assert response.headers["X-Request-ID"]  # through the middleware, not Twisted's own 400


def test_daphne_builds_its_requests_as_raw_body_requests():
    import slotkeeper.asgi  # noqa: F401  (what Daphne imports before it listens)

    assert http_protocol.WebRequest is RawBodyRequest


def test_the_application_loads_every_view_before_it_serves_and_freezes_them(tmp_path):
    """Django imports the URLconf at the first request it resolves; the ASGI module does it at start-up instead,
    so the first request after a start is not the one that pays for it, and the collector's freeze covers the views."""
    probe = (
        "import gc, sys\n"
        "import slotkeeper.asgi\n"
        "from django.urls import get_resolver\n"
        "resolver = get_resolver()\n"
        "print('slotkeeper.urls' in sys.modules, 'leases.api.views' in sys.modules, 'url_patterns' in vars(resolver))\n"
        "print(any(o is resolver for o in gc.get_objects()))\n"
    )
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SECRET_KEY": "test-only",
        "EMBEDDED_LOOP": "0",
        "LOG_LEVEL": "WARNING",
        "SLOTKEEPER_GC_THRESHOLD": "10000",
    }
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded, walked = done.stdout.split("\n")[:2]
    assert loaded == "True True True"
    assert walked == "False"  # built at start-up, so frozen out of the collector's walks


def _raw(daphne: str, request: bytes) -> bytes:
    host, port = daphne.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        out = b""
        while chunk := conn.recv(65536):
            out += chunk
    return out


def test_a_request_line_over_16_kib_is_answered_414_not_hung_up_on(daphne):
    answer = _raw(daphne, b"GET /api/leases/?q=" + b"x" * 20_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 414 "), answer[:200]
    assert b"request line" in answer


def test_a_header_line_over_16_kib_is_answered_431(daphne):
    answer = _raw(
        daphne, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"y" * 20_000 + b"\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_twisted_still_has_what_the_long_line_answer_relies_on():
    """The answer to a line too long replaces HTTPChannel.lineLengthExceeded and reads its first-line mark: a
    Twisted that renames either would silently go back to hanging up."""
    from twisted.web import http

    channel = http.HTTPChannel()
    assert hasattr(channel, "_HTTPChannel__first_line")
    assert channel.MAX_LENGTH == 16384
