"""The console's fleet forms, validated by the API's serializers (slotkeeper/forms.py says how): the "what if"
placement preview and the reason a node is declared dead or re-admitted with."""

from __future__ import annotations

from django.http import QueryDict

from fleet.api.serializers import PreviewSerializer, ReasonSerializer
from slotkeeper.forms import Checked, check, number, words

PREVIEW_DEFAULTS = {"mem_mib": "4096", "cpu_cores": "2", "disk_gib": "0", "count": "1", "duration_s": "3600"}


def check_preview(post: QueryDict) -> Checked:
    names = (
        "mem_mib",
        "cpu_cores",
        "disk_gib",
        "count",
        "duration_s",
        "start",
        "capabilities",
        "preferred_node",
    )
    values = {name: post.get(name, "").strip() for name in names}
    body: dict = {
        name: number(values[name])
        for name in ("mem_mib", "cpu_cores", "disk_gib", "count", "duration_s")
        if values[name]
    }
    body["capabilities"] = words(values["capabilities"])
    if values["preferred_node"]:
        body["preferred_node"] = values["preferred_node"]
    if values["start"]:
        body["start"] = values["start"]  # ISO; without a zone it is UTC, as in the API and the lease form
    return check(PreviewSerializer, body, values)


def check_reason(post: QueryDict) -> Checked:
    values = {"reason": post.get("reason", "")}
    return check(ReasonSerializer, {"reason": values["reason"]}, values)
