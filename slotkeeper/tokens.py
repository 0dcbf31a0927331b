"""Issuing API tokens and granting roles: the write path behind `manage.py issue_token` and the demo. One
transaction with its audit row; the raw token is returned once and stored only as a digest."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from slotkeeper import audit
from slotkeeper.domain import DomainError
from slotkeeper.models import ApiToken, hash_token, new_token
from slotkeeper.roles import ROLES


def grant_role(user, role: str) -> None:
    """Makes `role` the user's one role (admin is also staff, for the admin site). Inside the caller's transaction."""
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    user.is_staff = role == "admin"
    user.save(update_fields=["is_staff"])


def do_issue_token(actor, username: str, role: str, *, now: datetime, name: str = "") -> str:
    """Creates (or reuses) the user, gives it the role, and returns a new token, shown this once."""
    if role not in ROLES:
        raise DomainError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    raw = new_token("skt")
    with transaction.atomic():
        user, _ = get_user_model().objects.get_or_create(username=username)
        grant_role(user, role)
        token = ApiToken.objects.create(user=user, name=name or f"{role} token", digest=hash_token(raw))
        audit.record(
            at=now, actor=actor, action="token.issue", target=token, details={"user": username, "role": role}
        )
    return raw
