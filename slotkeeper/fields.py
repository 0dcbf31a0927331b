"""Strict JSON number fields: DRF's own accept "12" and NaN, which a health report must never contain."""

from __future__ import annotations

import math
import re

from rest_framework import serializers


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A whole number is required (got {kind})."}

    def to_internal_value(self, data):
        if (
            isinstance(data, bool)
            or not isinstance(data, int | float)
            or (isinstance(data, float) and not data.is_integer())
        ):
            self.fail("invalid", kind=type(data).__name__)
        return super().to_internal_value(int(data))


class StrictFloatField(serializers.FloatField):
    default_error_messages = {
        "invalid": "A number is required (got {kind}).",
        "not_finite": "A finite number is required (got {value}).",
    }

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid", kind=type(data).__name__)
        if not math.isfinite(data):
            self.fail("not_finite", value=data)
        return super().to_internal_value(data)


CAPABILITY_RE = re.compile(r"^[a-z0-9][a-z0-9_.:/-]{0,99}$")


class CapabilityField(serializers.CharField):
    default_error_messages = {
        "pattern": "A capability is lower-case letters, digits and . : / _ - (e.g. backend:claude, sensor.camera0).",
    }

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not CAPABILITY_RE.match(value):
            self.fail("pattern")
        return value
