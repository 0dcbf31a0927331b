"""The base of every API serializer that reads a request body: unknown fields are refused, not dropped.

A field the server does not know is a client's mistake (a typo, or a feature this server lacks: a vnode's "gpus": 8
vanished and the lease ran without GPUs). Refusing it by name turns that into a 400 the client can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rest_framework import serializers


class RefuseUnknownFieldsMixin:
    """Mixed into a Serializer: any key of the input that is not one of its fields is a 400 naming that key, and so
    is a value of the wrong JSON type where DRF would convert it.

    Read-only fields are known, so a client may send back what it read (they are ignored, as before)."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(str(key) for key in data if key not in self.fields)  # type: ignore[attr-defined]
            if unknown:
                raise serializers.ValidationError(
                    {key: ["Unknown field: this API does not take it."] for key in unknown}
                )
            wrong = wrong_types(_kinds_of(self), data)
            if wrong:
                raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)  # type: ignore[misc]


NOT_TEXT = "Not a valid string."
NOT_LIST = "Expected a list of items."
TOO_LONG = serializers.CharField.default_error_messages["max_length"]


def _takes_text(field: serializers.Field) -> bool:
    if isinstance(field, serializers.MultipleChoiceField):
        return False
    if isinstance(field, serializers.ChoiceField):
        return all(isinstance(key, str) for key in field.choices)
    return isinstance(field, serializers.CharField)


@dataclass(frozen=True)
class _Kinds:
    """A serializer class's writable fields by the JSON type they take: worked out once per class, since the
    check runs for every heartbeat and every instance report in it, where walking every field each time was a
    measurable part of a heartbeat's validation."""

    text: tuple[str, ...]
    lists: tuple[str, ...]
    text_lists: tuple[str, ...]
    # The text fields with a length limit, and the limit: checked on the text as sent (see wrong_types).
    limits: tuple[tuple[str, int], ...] = ()


_kinds: dict[type, _Kinds] = {}


def _kinds_of(serializer) -> _Kinds:
    got = _kinds.get(type(serializer))
    if got is None:
        text, lists, text_lists, limits = [], [], [], []
        for name, field in serializer.fields.items():
            if field.read_only:
                continue
            if _takes_text(field):
                text.append(name)
                if getattr(field, "max_length", None) is not None:
                    limits.append((name, field.max_length))
            elif isinstance(field, serializers.ListField) and _takes_text(field.child):
                text_lists.append(name)
            elif isinstance(
                field, serializers.ListField | serializers.ManyRelatedField | serializers.ListSerializer
            ):
                lists.append(name)
        got = _kinds[type(serializer)] = _Kinds(tuple(text), tuple(lists), tuple(text_lists), tuple(limits))
    return got


def wrong_types(kinds: _Kinds, data: Mapping) -> dict[str, list | dict]:
    """The values DRF would quietly convert: a number where a string goes (`"capabilities": [0]` became "0", a node
    named 7), an object where a list goes (`"leases": {}` read as its keys). The schema says string and array; a
    client sending anything else has a bug this turns into a 400. null is each field's own rule (allow_null).

    And a text longer than its field's limit as sent: DRF trims surrounding whitespace first and measures what is
    left, so 301 characters starting with a space passed a limit of 300 that the schema states (`maxLength`) for
    the text as sent (found by Schemathesis against a running server)."""
    wrong: dict[str, list | dict] = {}
    for name in kinds.text:
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            wrong[name] = [NOT_TEXT]
    for name, limit in kinds.limits:
        value = data.get(name)
        if isinstance(value, str) and len(value) > limit:
            wrong[name] = [TOO_LONG.format(max_length=limit)]
    for name in (*kinds.lists, *kinds.text_lists):
        value = data.get(name)
        if value is not None and not isinstance(value, list):
            wrong[name] = [NOT_LIST]
    for name in kinds.text_lists:
        value = data.get(name)
        if isinstance(value, list):
            items = {i: [NOT_TEXT] for i, item in enumerate(value) if not isinstance(item, str)}
            if items:
                wrong[name] = items
    return wrong


class StrictSerializer(RefuseUnknownFieldsMixin, serializers.Serializer):
    pass


class StrictModelSerializer(RefuseUnknownFieldsMixin, serializers.ModelSerializer):
    pass
