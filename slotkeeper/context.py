"""Template context shared by every console page: the role, the go-to keys of the nav and the `?` sheet, and whether
this person has the single-key shortcuts on (slotkeeper/preferences.py). No query: the role is cached on the user,
the preference is the session's copy."""

from __future__ import annotations

from typing import NamedTuple

from slotkeeper.preferences import shortcuts_on
from slotkeeper.roles import RANK, role_of


class GoTo(NamedTuple):
    """A page `g` then `key` goes to (console.js follows the first `a[data-goto=key]`): the nav draws the ones marked
    `nav`, the `?` sheet lists them all, so the keys, the nav and the sheet come from this one list."""

    key: str
    url_name: str
    label: str
    nav: bool = True
    role: str = "viewer"


GO_TO = (
    GoTo("f", "fleet-board", "Fleet"),
    GoTo("s", "slot-table", "Slot table"),
    GoTo("l", "lease-list", "Leases"),
    GoTo("i", "instance-list", "Instances"),
    GoTo("r", "reschedule-list", "Reschedules"),
    GoTo("a", "alert-list", "Alerts"),
    GoTo("u", "audit-feed", "Audit"),
    GoTo("d", "api-docs", "API"),
    GoTo("n", "lease-new", "New lease", nav=False, role="operator"),
    GoTo("w", "placement-preview-form", "What if… (placement preview)", nav=False, role="operator"),
)


def console(request):
    role = role_of(getattr(request, "user", None))
    return {
        "role": role,
        "can_operate": role in {"operator", "admin"},
        "is_admin": role == "admin",
        "go_to": [g for g in GO_TO if RANK[role or "viewer"] >= RANK[g.role]],
        "shortcuts_on": shortcuts_on(request),
    }
