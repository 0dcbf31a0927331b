"""The API's JSON renderer writes what DRF's own renderer writes (slotkeeper/renderers.py)."""

import json
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.serializer_helpers import ReturnDict

from slotkeeper.renderers import FastJSONRenderer

PAYLOAD = {
    "at": datetime(2026, 11, 30, 19, 17, 53, 123456, tzinfo=UTC),
    "day": date(2026, 11, 30),
    "took": timedelta(seconds=90),
    "price": Decimal("1.50"),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "label": gettext_lazy("draining"),
    "by_node": {3: [1, 2], 7: []},
    "text": "line\u2028break\u2029and – ünïcode",
    "rows": [ReturnDict({"node": "n1", "fit": True, "free": 12.5, "none": None}, serializer=None)],
}


def test_the_fast_renderer_writes_the_same_bytes_as_drfs_renderer():
    fast = FastJSONRenderer().render(PAYLOAD, "application/json")
    assert fast == JSONRenderer().render(PAYLOAD, "application/json")
    assert json.loads(fast)["at"] == "2026-11-30T19:17:53.123456Z"
    assert b"\\u2028" in fast and "\u2028".encode() not in fast


def test_an_indented_answer_and_a_value_orjson_refuses_are_left_to_drf():
    assert FastJSONRenderer().render({"a": 1}, "application/json; indent=4") == b'{\n    "a": 1\n}'
    huge = {"n": 2**70}
    assert FastJSONRenderer().render(huge, "application/json") == JSONRenderer().render(
        huge, "application/json"
    )
    assert FastJSONRenderer().render(None) == b""


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii",
        "an en dash – shares U+2028's first byte",
        "café © è: bytes 0xA8 and 0xA9 without a separator",
        "only\u2028a line separator",
        "only\u2029a paragraph separator",
        "\u2028\u2029 both, and – a dash",
        "",
    ],
)
def test_line_separators_are_escaped_exactly_when_present(text):
    data = {"reason": text, "rows": [{"node": "n1", "reason": text}]}
    fast = FastJSONRenderer().render(data, "application/json")
    assert fast == JSONRenderer().render(data, "application/json")
    assert "\u2028".encode() not in fast and "\u2029".encode() not in fast
    assert json.loads(fast) == data
