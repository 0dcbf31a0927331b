"""The API's only request body parser: JSON, bounded in size and in depth.

Unbounded, a 50,000-deep `[[[[…]]]]` blew Python's recursion limit inside the parser (a 500). The size bound is
DATA_UPLOAD_MAX_MEMORY_SIZE, enforced here with a 413 whichever way DRF hands over the body (when Django's own check
fires first, slotkeeper.api turns it into the same 413).
"""

from __future__ import annotations

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import JSONParser
from rest_framework.utils import json

from slotkeeper.api import RequestTooLarge

MAX_DEPTH = 32


def depth_of(value) -> int:
    """The nesting depth of parsed JSON (a scalar is 0, `[]` is 1), without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
        if deepest > MAX_DEPTH:
            break
    return deepest


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise RequestTooLarge(f"The request body is larger than {limit} bytes.")
        charset = _charset(media_type)
        if charset is not None and charset.replace("-", "").replace("_", "") != "utf8":
            # The docs say UTF-8; a UTF-16 or Latin-1 body was read all the same, and the schema never said so.
            raise exceptions.ParseError(f"JSON parse error - the body must be UTF-8, not {charset}.")
        try:
            data = json.loads(
                raw.decode("utf-8"),
                parse_constant=json.strict_constant if self.strict else None,
                object_pairs_hook=_refuse_repeated_keys,
            )
        except RecursionError:
            raise exceptions.ParseError(
                f"JSON parse error - nested deeper than {MAX_DEPTH} levels."
            ) from None
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError both are
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        if depth_of(data) > MAX_DEPTH:
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels.")
        return data


def _charset(media_type: str | None) -> str | None:
    """The `charset` parameter of a Content-Type, lower-cased, or None."""
    for part in (media_type or "").split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def _refuse_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object with one key twice is refused: read last-wins, `{"type": "immediate", "type": "best_effort"}`
    was a best-effort lease, whatever the client (or a proxy that rewrote it) meant."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return out
