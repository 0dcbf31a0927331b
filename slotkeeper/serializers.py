"""The base of every API serializer that reads a request body: unknown fields are refused, not dropped.

A field the server does not know is a client's mistake (a typo, or a feature this server lacks: a vnode's "gpus": 8
vanished and the lease ran without GPUs). Refusing it by name turns that into a 400 the client can act on.
"""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework import serializers


class RefuseUnknownFieldsMixin:
    """Mixed into a Serializer: any key of the input that is not one of its fields is a 400 naming that key.

    Read-only fields are known, so a client may send back what it read (they are ignored, as before)."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(str(key) for key in data if key not in self.fields)  # type: ignore[attr-defined]
            if unknown:
                raise serializers.ValidationError(
                    {key: ["Unknown field: this API does not take it."] for key in unknown}
                )
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictSerializer(RefuseUnknownFieldsMixin, serializers.Serializer):
    pass


class StrictModelSerializer(RefuseUnknownFieldsMixin, serializers.ModelSerializer):
    pass
