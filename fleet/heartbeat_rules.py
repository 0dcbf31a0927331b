"""PURE: the heartbeat's body rules for its common shape, checked without a framework.

The HTTP fast path (slotkeeper/heartbeat_route.py) answers most heartbeats without Django's request cycle, and
fleet/api/serializers.py's HeartbeatSerializer costs about 130 us a call on this machine, a tenth of what the
whole fast path may spend. So the plain idle report (five numbers, no instances) is checked here, by the same
bounds, and anything else is left to the serializer: `plain_report` returns the serializer's own validated data
or None ("not decided here"), never an error of its own. tests/fleet/test_heartbeat_rules.py holds the two to
the same answers over a table of hostile and ordinary bodies.
"""

from __future__ import annotations

import math
from typing import Any

# Physical bounds of one machine, far above any real one (64 TiB of memory, 1 PiB of disk) and far below what the
# database columns hold (PostgreSQL `integer`: 2^31 - 1). The serializers take them from here.
MAX_MEM_MIB = 64 * 1024 * 1024
MAX_DISK_GIB = 1024 * 1024
MAX_CPU_CORES = 4096
# A load average or free disk beyond these is a broken agent, not a machine; 1e308 was shown on the board.
MAX_LOAD1 = 100_000

NUMBERS = ("mem_total_mib", "mem_used_mib", "disk_free_gib", "cpu_pct", "load1")
FIELDS = frozenset((*NUMBERS, "instances"))


def whole(value: Any, low: int, high: int) -> int | None:
    # StrictIntegerField: a JSON integer or an integral float, never a bool.
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    if not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def number(value: Any, low: float, high: float) -> float | None:
    # StrictFloatField: a finite JSON number, never a bool; the serializer returns it as a float.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer too large for a float: the serializer says so in its own words
        return None
    if not math.isfinite(value) or not low <= value <= high:
        return None
    return value


def plain_report(body: Any) -> dict | None:
    """The validated heartbeat when `body` is an idle report that HeartbeatSerializer accepts, in the serializer's
    shape (`instances` an empty list); None for anything else, valid or not, which the serializer then decides."""
    if not isinstance(body, dict) or not FIELDS.issuperset(body) or len(body) < len(NUMBERS):
        return None
    if body.get("instances", []) != [] or not isinstance(body.get("instances", []), list):
        return None
    total = whole(body.get("mem_total_mib"), 1, MAX_MEM_MIB)
    used = whole(body.get("mem_used_mib"), 0, MAX_MEM_MIB)
    disk = number(body.get("disk_free_gib"), 0, MAX_DISK_GIB)
    cpu = number(body.get("cpu_pct"), 0, 100)
    load1 = number(body.get("load1"), 0, MAX_LOAD1)
    if total is None or used is None or disk is None or cpu is None or load1 is None or used > total:
        return None
    return {
        "mem_total_mib": total,
        "mem_used_mib": used,
        "disk_free_gib": disk,
        "cpu_pct": cpu,
        "load1": load1,
        "instances": [],
    }
