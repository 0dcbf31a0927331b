"""Console forms validated by the API's own serializers, so a form and the API accept the same input and refuse it
with the same messages.

An HTML form posts strings; the API's strict fields want JSON types ("12" is not a number there). Each form turns
its strings into the JSON body the API would get (numbers parsed where they parse, blanks left out so the API's
defaults apply), runs the serializer, and gets back either the validated data or the serializer's messages keyed by
the form's own field names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rest_framework.exceptions import ErrorDetail

from slotkeeper.fields import MAX_DIGITS


@dataclass
class Checked:
    """The outcome of a form: `data` (the serializer's validated data) when `ok`, else `errors` per form field
    (`form` for what belongs to no one field), and always `values`, what was typed, to fill the form again."""

    values: dict
    data: dict = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, name: str, message: str) -> None:
        messages = self.errors.setdefault(name, [])
        if message not in messages:
            messages.append(message)


def flat_errors(detail, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested errors as dotted paths: {"nodes": [{}, {"mem_mib": ["…"]}]} → {"nodes.1.mem_mib": ["…"]}."""
    out: dict[str, list[str]] = {}

    def put(key: str, message) -> None:
        out.setdefault(key, []).append(str(message))

    if isinstance(detail, Mapping):
        for key, value in detail.items():
            for k, v in flat_errors(value, f"{prefix}.{key}" if prefix else str(key)).items():
                out.setdefault(k, []).extend(v)
    elif isinstance(detail, list) and all(isinstance(d, str | ErrorDetail) for d in detail):
        for message in detail:
            put(prefix, message)
    elif isinstance(detail, list):
        for i, value in enumerate(detail):
            for k, v in flat_errors(value, f"{prefix}.{i}").items():
                out.setdefault(k, []).extend(v)
    else:
        put(prefix, detail)
    return out


def number(raw: str):
    """A typed number as the JSON number it stands for; anything else unchanged, for the serializer to refuse
    with the API's message ("A number is required (got str).")."""
    text = raw.strip()
    # Past MAX_DIGITS int() raises; float() reads it as inf, which the serializer refuses by name.
    if re.fullmatch(r"[+-]?\d+", text) and len(text) <= MAX_DIGITS:
        return int(text)
    try:
        return float(text)
    except ValueError:
        return raw


def words(raw: str) -> list[str]:
    """A list typed as words separated by commas or spaces."""
    return [w for w in re.split(r"[\s,]+", raw.strip()) if w]


def check(
    serializer_class,
    body: dict,
    values: dict,
    *,
    field_of: Callable[[str], str] = lambda path: path.split(".")[0],
    context: dict | None = None,
) -> Checked:
    """Validates `body` with the API's serializer; its messages are keyed by `field_of(dotted path)`."""
    out = Checked(values=values)
    ser = serializer_class(data=body, context=context or {})
    if ser.is_valid():
        out.data = dict(ser.validated_data)
        return out
    for path, messages in flat_errors(ser.errors).items():
        name = "form" if path in {"", "non_field_errors"} else field_of(path)
        for message in messages:
            out.add(name, message)
    return out
