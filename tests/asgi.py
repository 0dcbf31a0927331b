"""One HTTP request through an ASGI application in the test's own event loop, as Daphne would hand it over: what the
handler tests (tests/test_handler.py) and the overrides' differential tests (tests/test_overrides.py) send."""

from __future__ import annotations

import asyncio


async def request(app, path, *, method="GET", headers=(), body=b"", host=b"testserver"):
    """Returns (status, the response's headers as sent, body). A query in `path` becomes the query string."""
    route, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", host), (b"content-length", str(len(body)).encode()), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    chunks = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive():
        if chunks:
            return chunks.pop(0)
        await asyncio.Event().wait()  # the client stays while the answer is made

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], start["headers"], content
