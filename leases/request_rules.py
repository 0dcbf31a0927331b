"""PURE: a lease request's body rules for its common shape, checked without a framework.

Every `POST /api/leases/` is validated before its pass, and building DRF's LeaseCreateSerializer alone (a deep
copy of its declared fields, the nested vnode serializer's among them) was about a tenth of a minimal answer's
Daphne time (docs/benchmarks/burst-http.md, "A lease request's body checked without building its serializer"). Most
requests are the plain shape: a name, a type, a duration, a few VMs, perhaps capabilities, groups and flags. This
module checks that shape by the serializer's own bounds and returns the serializer's validated data, in the
serializer's key order and types; anything else (a restart policy, a driver spec, the process driver, a
capability or group with spaces to trim, any refusal) returns None, "not decided here", and the serializer
decides and words its refusal. Nothing here ever refuses a body. The fleet checks (a VM larger than every node, unknown groups)
need the database and stay in leases/api/serializers.py, shared by both ways.

tests/leases/test_request_rules.py holds the two to the same answers over a table of ordinary and hostile bodies
and over generated ones.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from fleet.heartbeat_rules import MAX_CPU_CORES, MAX_DISK_GIB, MAX_MEM_MIB, number, whole

MAX_DURATION_S = 366 * 24 * 3600
# A before-end notice at most a day ahead: the tick looks that far for leases to warn (actions.notify_ending).
MAX_NOTIFY_BEFORE_S = 86_400
# How far ahead an advance reservation may start. The scheduler adds durations and overheads to a start; a start in
# year 9999 overflowed `datetime` (a 500), and no one books a machine a century ahead.
MAX_START_AHEAD = timedelta(days=10 * 366)
MAX_NAME = 200
MAX_VMS = 1000
MAX_CAPABILITIES = 50
MAX_GROUPS = 20
MAX_RESCHEDULES = 1000
# leases.models.LeaseType's values (a test holds them equal); the advance reservation is the one with a start.
LEASE_TYPES = frozenset(("advance_reservation", "best_effort", "immediate"))
ADVANCE_RESERVATION = "advance_reservation"

CAPABILITY_RE = re.compile(r"[a-z0-9][a-z0-9_.:/-]{0,99}")
GROUP_RE = re.compile(r"[-a-zA-Z0-9_]{1,100}")  # a SlugField of at most 100 characters, with nothing to trim
PLAIN = frozenset(
    (
        "name",
        "type",
        "start",
        "duration_s",
        "nodes",
        "capabilities",
        "preemptible",
        "groups",
        "migratable",
        "max_reschedules",
        "auto_approve_reschedules",
        "driver",
        "real_duration_s",
        "notify_before_s",
    )
)
VM_FIELDS = frozenset(("cpu_cores", "mem_mib", "disk_gib"))
_SKIP = object()  # "not decided here"


def plain_lease(body: Any, now: datetime, parse_time: Callable[[str], datetime | None]) -> dict | None:
    """The validated lease request when `body` is of the plain shape and LeaseCreateSerializer's field rules
    accept it, as that serializer's `validated_data` (fleet checks aside); None for anything else, valid or not.

    `now` is the request's arrival, as the serializer's context gives it; `parse_time` reads an ISO time as the
    serializer's start field does, or gives None where that field would refuse it."""
    if not isinstance(body, dict) or not PLAIN.issuperset(body):
        return None
    name = _name(body.get("name"))
    kind = body.get("type")
    duration = number(body.get("duration_s"), 1, MAX_DURATION_S)
    vms = _vms(body.get("nodes"))
    if (
        name is None
        or not isinstance(kind, str)
        or kind not in LEASE_TYPES
        or duration is None
        or vms is None
    ):
        return None
    start = _start(body.get("start"), kind, now, parse_time)
    capabilities = _texts(body.get("capabilities", []), CAPABILITY_RE, MAX_CAPABILITIES)
    groups = _texts(body.get("groups", []), GROUP_RE, MAX_GROUPS)
    flags = [_flag(body, key, default) for key, default in FLAGS]
    most = body.get("max_reschedules", 5)
    max_reschedules = whole(most, 0, MAX_RESCHEDULES)
    real = body.get("real_duration_s")
    real_duration = None if real is None else number(real, 0, MAX_DURATION_S)
    notice = body.get("notify_before_s")
    notify_before = None if notice is None else whole(notice, 0, MAX_NOTIFY_BEFORE_S)
    if (
        start is _SKIP
        or capabilities is None
        or groups is None
        or _SKIP in flags
        or max_reschedules is None
        or (real is not None and real_duration is None)
        or (notice is not None and notify_before is None)
        or body.get("driver", "sim") != "sim"  # the process driver needs a spec, which this shape has not
    ):
        return None
    preemptible, migratable, auto_approve = flags
    # The serializer's declared order, defaults included (restart_policy and spec default to empty objects).
    return {
        "name": name,
        "type": kind,
        "start": start,
        "duration_s": duration,
        "nodes": vms,
        "capabilities": capabilities,
        "preemptible": preemptible,
        "groups": groups,
        "migratable": migratable,
        "restart_policy": {},
        "max_reschedules": max_reschedules,
        "auto_approve_reschedules": auto_approve,
        "driver": "sim",
        "spec": {},
        "real_duration_s": real_duration,
        "notify_before_s": notify_before,
    }


FLAGS = (("preemptible", True), ("migratable", True), ("auto_approve_reschedules", False))


# Characters that change how the text around them is shown, not what it says: the bidirectional embeddings,
# overrides and isolates and the direction marks ("Trojan Source", CVE-2021-42574). A lease named "\u202eevil"
# was accepted and shown reversed on the console.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def unprintable(name: str) -> list[str]:
    """The characters a name a person reads may not hold, as U+XXXX: control characters (a newline, a tab, an
    escape) and text-direction controls. Letters of any script, marks and emoji (a zero-width joiner too) are fine."""
    bad = sorted({c for c in name if c in BIDI_CONTROLS or unicodedata.category(c) == "Cc"})
    return [f"U+{ord(c):04X}" for c in bad]


def _name(value: Any) -> str | None:
    # A CharField: at most MAX_NAME characters as sent (slotkeeper/serializers.py), trimmed, not blank, no NUL and
    # no lone surrogate.
    if not isinstance(value, str) or len(value) > MAX_NAME:
        return None
    name = value.strip()
    if not name or "\x00" in name:
        return None
    if not name.isprintable() and unprintable(name):  # isprintable: a fast pass for every everyday name
        return None
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            return None
    return name


def _vms(value: Any) -> list[dict] | None:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_VMS:
        return None
    vms = []
    for vm in value:
        if not isinstance(vm, dict) or "mem_mib" not in vm or not VM_FIELDS.issuperset(vm):
            return None
        cores = vm.get("cpu_cores")
        mem = whole(vm["mem_mib"], 1, MAX_MEM_MIB)
        disk = vm.get("disk_gib")
        cpu_cores = 1 if cores is None and "cpu_cores" not in vm else number(cores, 0, MAX_CPU_CORES)
        disk_gib = 0 if disk is None and "disk_gib" not in vm else whole(disk, 0, MAX_DISK_GIB)
        if cpu_cores is None or mem is None or disk_gib is None:
            return None
        vms.append({"cpu_cores": cpu_cores, "mem_mib": mem, "disk_gib": disk_gib})
    return vms


def _start(value: Any, kind: str, now: datetime, parse_time: Callable[[str], datetime | None]) -> Any:
    if kind != ADVANCE_RESERVATION:
        return None if value is None else _SKIP  # only an advance reservation takes a start
    if not isinstance(value, str):
        return _SKIP
    start = parse_time(value)
    if start is None or not now <= start <= now + MAX_START_AHEAD:
        return _SKIP
    return start


def _texts(value: Any, pattern: re.Pattern, most: int) -> list[str] | None:
    if not isinstance(value, list) or len(value) > most:
        return None
    if not all(isinstance(item, str) and pattern.fullmatch(item) for item in value):
        return None
    return list(value)


def _flag(body: dict, key: str, default: bool) -> Any:
    value = body.get(key, default)
    return value if isinstance(value, bool) else _SKIP
