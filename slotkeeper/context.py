"""Template context shared by every console page."""

from __future__ import annotations

from slotkeeper.roles import role_of


def console(request):
    role = role_of(getattr(request, "user", None))
    return {
        "role": role,
        "can_operate": role in {"operator", "admin"},
        "is_admin": role == "admin",
    }
