"""The three roles and how a user gets one.

A user's role is the highest of: superuser (admin), membership of the Django groups named "admin", "operator",
"viewer". Staff without a group are viewers, so a freshly made admin-site user can look but not act.
"""

from __future__ import annotations

ROLES = ("viewer", "operator", "admin")
RANK = {name: i for i, name in enumerate(ROLES)}


def role_of(user) -> str | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    if getattr(user, "is_node_agent", False):
        return None
    if user.is_superuser:
        return "admin"
    # Cached per request object: permission checks and the template context both ask.
    cached = getattr(user, "_slotkeeper_role", None)
    if cached is not None:
        return cached or None
    remember_groups(user, user.groups.values_list("name", flat=True))
    return user._slotkeeper_role or None


def remember_groups(user, names) -> None:
    """Keeps on `user` the role its group `names` give, for `role_of` (which then asks no query): for a caller
    that read them along with the user, as the API token check does."""
    names = set(names)
    user._slotkeeper_role = next(
        (r for r in reversed(ROLES) if r in names), "viewer" if user.is_staff else ""
    )


def has_role(user, needed: str) -> bool:
    role = role_of(user)
    return role is not None and RANK[role] >= RANK[needed]
