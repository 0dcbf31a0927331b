"""The console's lease forms, validated by the API's serializers (slotkeeper/forms.py says how): submitting a lease
and cancelling one. The writes stay in leases/actions.py; these only turn a posted form into the API's request."""

from __future__ import annotations

from datetime import datetime

from django.http import QueryDict

from leases.api.serializers import CancelSerializer, LeaseCreateSerializer
from leases.models import LeaseType
from slotkeeper.forms import Checked, check, number, words

# Several VMs of one size: the common case (Haizea's leases are N identical vnodes). More than the API takes (1000)
# is still passed on, so the refusal is the API's own message.
MAX_VMS = 1001
SIZE_FIELDS = ("cpu_cores", "mem_mib", "disk_gib")
DEFAULTS = {
    "type": LeaseType.BEST_EFFORT,
    "vms": "1",
    "copies": "1",
    "cpu_cores": "1",
    "mem_mib": "1024",
    "disk_gib": "0",
    "duration_s": "3600",
    "preemptible": True,
}


def lease_field(path: str) -> str:
    """The form field an API error belongs to: a VM's size fields are the form's size fields (every VM has the
    same size), anything else about the VMs belongs to the VM count and sizes as a whole ("nodes")."""
    parts = path.split(".")
    if parts[0] == "nodes" and len(parts) >= 3 and parts[2] in SIZE_FIELDS:
        return parts[2]
    return parts[0]


def check_lease(post: QueryDict, *, now: datetime | None = None) -> Checked:
    """The posted form as the API's request; `now`, the request's arrival, is what "in the past" is judged by."""
    values = {
        name: post.get(name, "").strip()
        for name in ("name", "type", "start", "duration_s", "vms", "copies", "capabilities", *SIZE_FIELDS)
    }
    values["groups"] = post.getlist("groups")
    values["preemptible"] = bool(post.get("preemptible"))
    body: dict = {
        "name": values["name"],
        "type": values["type"],
        "capabilities": words(values["capabilities"]),
        "groups": values["groups"],
        "preemptible": values["preemptible"],
    }
    if values["duration_s"]:
        body["duration_s"] = number(values["duration_s"])
    if values["start"]:
        body["start"] = values["start"]  # ISO; without a zone it is UTC, as in the API
    vnode = {name: number(values[name]) for name in SIZE_FIELDS if values[name]}
    context = {"now": now} if now is not None else None
    count = number(values["vms"] or "1")
    if not isinstance(count, int) or count < 1:
        out = check(
            LeaseCreateSerializer, {**body, "nodes": [vnode]}, values, field_of=lease_field, context=context
        )
        out.add("vms", "A whole number of VMs, at least 1.")
        return out
    body["nodes"] = [dict(vnode) for _ in range(min(count, MAX_VMS))]
    out = check(LeaseCreateSerializer, body, values, field_of=lease_field, context=context)
    copies = number(values["copies"] or "1")
    if not isinstance(copies, int) or not 1 <= copies <= MAX_COPIES:
        out.add("copies", f"A whole number of copies, from 1 to {MAX_COPIES}.")
    elif out.ok:
        out.data["copies"] = copies
    return out


# The most copies the form submits at once: a lease array's limit (leases/api/serializers.py MAX_BATCH_ITEMS).
MAX_COPIES = 1000


def check_cancel(post: QueryDict) -> Checked:
    values = {"reason": post.get("reason", "")}
    return check(CancelSerializer, {"reason": values["reason"]}, values)
