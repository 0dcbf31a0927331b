"""What Daphne's HTTP server does with a request before the application has it.

Twisted's `Request` parses the body of every POST that says it is a form (`application/x-www-form-urlencoded` or
`multipart/form-data`) into `request.args`, on the reactor's one thread, before the request is handed on, and
answers a body it cannot parse with a bare 400 of its own. Daphne never reads `request.args` (ASGI passes the raw
body; Django parses forms itself, bounded by DATA_UPLOAD_MAX_NUMBER_FIELDS), so that work was wasted on every form
post and, worse, free to anyone: one unauthenticated 9 MB multipart POST held a Daphne's event loop for about two
seconds (measured: /healthz waited 1.8 s), heartbeats and websockets included. Twisted 25.5 lets a request turn
that off (`parsePOSTFormSubmission`); Daphne does not, so Daphne's request class is replaced with one that does.
The Content-Type check alone was also 50 us of every POST (the email package parses the header), JSON ones too.
"""

from __future__ import annotations

from daphne import http_protocol


class RawBodyRequest(http_protocol.WebRequest):
    """Daphne's request, leaving a POST body to the application as it came."""

    def __init__(self, *args, **kwargs):
        kwargs["parsePOSTFormSubmission"] = False
        super().__init__(*args, **kwargs)


def keep_post_bodies_raw() -> None:
    """Makes Daphne build every HTTP request as a RawBodyRequest (its factory looks the class up per connection)."""
    http_protocol.WebRequest = RawBodyRequest  # type: ignore[misc]


def _line_too_long(channel, line) -> None:
    """Twisted's HTTP channel, given a line longer than its MAX_LENGTH (16 KiB), closed the connection without a
    word: a client with a long URL never learnt why. It answers 414 for the request line, 431 for a header line,
    and then closes the connection, as HTTP asks."""
    first = getattr(channel, "_HTTPChannel__first_line", True)
    status = b"414 URI Too Long" if first else b"431 Request Header Fields Too Large"
    detail = b"the request line" if first else b"a header line"
    body = b'{"detail": "' + detail + b' is longer than the server reads (16 KiB)."}'
    channel.transport.write(
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    channel.transport.loseConnection()


def answer_lines_too_long() -> None:
    """Makes every HTTP channel answer a line too long (see `_line_too_long`) instead of hanging up on it. Checked
    against Twisted 25.5: HTTPChannel is a LineReceiver whose `lineLengthExceeded` only closed the connection, and
    which marks its first line in `_HTTPChannel__first_line` (tests/test_serving.py holds both)."""
    from twisted.web import http

    http.HTTPChannel.lineLengthExceeded = _line_too_long  # type: ignore[method-assign]
