"""Strict JSON fields for the API: numbers that are numbers, booleans that are booleans, times and blobs with bounds.

DRF's own fields accept "12" for a number, NaN and 1e308 for a float, "yes" for a boolean and any int however large;
the database then refuses what the serializer let through, and the client gets a 500 instead of a 400.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

# The database columns behind the API: PositiveIntegerField / IntegerField are PostgreSQL `integer`, ids `bigint`.
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# A float the API stores is a physical quantity; this is far above any real one and far below where float
# arithmetic (sums, products with 1024) overflows to infinity.
FLOAT_MAX = 1e12
# Times the API stores or computes with: beyond these, adding a lease's duration or a window overflows `datetime`
# (year 9999) and the request ended in a 500.
EARLIEST_TIME = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(9000, 1, 1, tzinfo=UTC)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer (or an integral float), bounded by default to what a PostgreSQL `integer` column holds."""

    default_error_messages = {"invalid": "A whole number is required (got {kind})."}

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", INT32_MIN)
        kwargs.setdefault("max_value", INT32_MAX)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if (
            isinstance(data, bool)
            or not isinstance(data, int | float)
            or (isinstance(data, float) and not data.is_integer())
        ):
            self.fail("invalid", kind=type(data).__name__)
        return super().to_internal_value(int(data))


class StrictFloatField(serializers.FloatField):
    """A finite JSON number, bounded by default to ±FLOAT_MAX."""

    default_error_messages = {
        "invalid": "A number is required (got {kind}).",
        "not_finite": "A finite number is required (got {value}).",
    }

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", -FLOAT_MAX)
        kwargs.setdefault("max_value", FLOAT_MAX)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid", kind=type(data).__name__)
        if isinstance(data, int) and abs(data) > FLOAT_MAX:
            # A JSON integer of 400 digits: math.isfinite and float() raise OverflowError for it (a 500).
            self.fail(
                "max_value" if data > 0 else "min_value", max_value=self.max_value, min_value=self.min_value
            )
        if not math.isfinite(data):
            self.fail("not_finite", value=data)
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """Only JSON true or false: DRF's own takes "yes", "on", 1 and "0", and a typo then silently means something."""

    default_error_messages = {"invalid": "Must be true or false (got {kind})."}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", kind=type(data).__name__)
        return data


# The date-time the schema states (RFC 3339, ASCII digits), the offset optional (then UTC). Python's
# `fromisoformat`, which DRF's parsing reaches, also reads a date alone, an ISO week ("2031-W01-1"), the basic
# format ("20310103T000000Z") and other scripts' digits, and Django's pattern lets a trailing newline or NUL through:
# an outsider's requests had all of them stored.
DATE_TIME_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:[0-9]{2})?"
)


# The schema's word for a BoundedDateTimeField: DATE_TIME_RE with its year inside the bounds, a day from each (an
# offset moves a time by up to a day): what the server refuses, the schema refuses too (Schemathesis checks it).
DATE_TIME_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "pattern": r"^(200[1-9]|20[1-9][0-9]|2[1-9][0-9]{2}|[3-7][0-9]{3}|8[0-8][0-9]{2}|89[0-8][0-9]|899[0-8])-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}"
    r"(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:[0-9]{2})?$",
    "description": "RFC 3339, in the years 2001-8998; without an offset, UTC.",
}


@extend_schema_field(DATE_TIME_SCHEMA)
class BoundedDateTimeField(serializers.DateTimeField):
    """An RFC 3339 time between EARLIEST_TIME and LATEST_TIME, so that arithmetic on it can never overflow."""

    default_error_messages = {
        "out_of_range": "Must be between 2000-01-01 and 9000-01-01 (UTC).",
    }

    def to_internal_value(self, value):
        if isinstance(value, str) and not DATE_TIME_RE.fullmatch(value):
            self.fail("invalid", format="YYYY-MM-DDThh:mm[:ss[.uuuuuu]][Z|±hh:mm]")
        try:
            parsed = super().to_internal_value(value)
        except OverflowError:  # a time near year 1 or 9999 whose offset pushes it past the calendar
            self.fail("out_of_range")
        if not EARLIEST_TIME <= parsed < LATEST_TIME:
            self.fail("out_of_range")
        return parsed


CAPABILITY_RE = re.compile(r"^[a-z0-9][a-z0-9_.:/-]{0,99}$")


class _AsSent:
    """A text field whose pattern holds for the text as sent, as the schema states it: not trimmed first (DRF
    trimmed " web" to "web" and accepted it), and matched whole. DRF's RegexValidator uses `search`, where the
    pattern's `$` also matches before a final newline, so without trimming "db\n" would pass; `fullmatch` does not
    let it. The pattern and its error message stay DRF's (the schema reads them from the validator)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(*args, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        for validator in self.validators:
            regex = getattr(validator, "regex", None)
            if regex is not None and not validator.inverse_match and not regex.fullmatch(value):
                self.fail("invalid")
        return value


class AsSentRegexField(_AsSent, serializers.RegexField):
    pass


class AsSentSlugField(_AsSent, serializers.SlugField):
    pass


@extend_schema_field({"type": "string", "pattern": CAPABILITY_RE.pattern, "maxLength": 100})
class CapabilityField(AsSentRegexField):
    """A capability as sent: " gpu" was trimmed and accepted as "gpu" (see `_AsSent`)."""

    default_error_messages = {
        "invalid": "A capability is lower-case letters, digits and . : / _ - (e.g. backend:claude, sensor.camera0).",
    }

    def __init__(self, **kwargs):
        super().__init__(CAPABILITY_RE, **kwargs)


def json_blob_problem(value, *, max_bytes: int, max_depth: int) -> str | None:
    """Why a free-form JSON value may not be stored, or None. PostgreSQL's jsonb refuses the NUL character (a 500
    when it reached the database), and an unbounded blob would be copied into every read of its row."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return f"Nested deeper than {max_depth} levels."
        if isinstance(item, str) and "\x00" in item:
            return "Strings may not contain the NUL character."
        if isinstance(item, float) and not math.isfinite(item):
            return "Numbers must be finite."
        if isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in str(key):
                    return "Keys may not contain the NUL character."
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > max_bytes:
        return f"At most {max_bytes} bytes of JSON (got {size})."
    return None


class BoundedJSONDictField(serializers.DictField):
    """A free-form JSON object with a size and depth bound (the driver spec's `sim` section)."""

    def __init__(self, *, max_bytes: int, max_depth: int = 4, **kwargs):
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if problem := json_blob_problem(value, max_bytes=self.max_bytes, max_depth=self.max_depth):
            raise serializers.ValidationError(problem)
        return value


# The path pattern of an integer id in the API's routes (a viewset's lookup_value_regex): DRF's default, [^/.]+,
# let int() read "٣" (Arabic-Indic), "+3" and "1_0" as ids, so an object answered to several paths.
ID_PATH = r"[0-9]+"


# Python refuses to read an integer of more digits than this from text (ValueError: a 500 where it was trusted).
MAX_DIGITS = 4300


def whole_number(value: str) -> int | None:
    """A query or form value as a whole number, or None: ASCII digits only ("²".isdigit() is True and int("²")
    raises, a 500 in every view that trusted isdigit), and not more than int() reads."""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= MAX_DIGITS else None


def is_id(value: str) -> bool:
    """Whether a path or query value is a database id: ASCII digits within `bigint` ("²".isdigit() is True and
    int("²") raises; an id past 2^63 - 1 overflowed the database driver: both were 500s)."""
    number = whole_number(value)
    return number is not None and 1 <= number <= INT64_MAX


class IdQueryField(serializers.IntegerField):
    """An id in a query string, read as `is_id` reads it: DRF's IntegerField took "+1", "1.0", " 1", "0_1" and
    "١" (Arabic-Indic) as node 1."""

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", INT64_MAX)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not (isinstance(data, str) and is_id(data)):
            self.fail("invalid")
        return int(data)


class BoundedListField(serializers.ListField):
    """A ListField whose length is checked before its items: DRF validates every item first and only then the
    length, so a heartbeat of 655,000 instance ids took 122 s to be refused, and 600,000 bad capabilities were
    answered with one message each (40 MB). Same message as DRF's own check."""

    def to_internal_value(self, data):
        if self.max_length is not None and isinstance(data, list | tuple) and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)
