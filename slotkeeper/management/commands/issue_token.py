"""`manage.py issue_token USERNAME --role ROLE`: makes the user if needed, gives it the role, prints a new token
alone on the last line (so scripts can take `tail -n1`)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from slotkeeper.models import ApiToken, hash_token, new_token
from slotkeeper.roles import ROLES


def grant_role(user, role: str) -> None:
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    user.is_staff = role == "admin"
    user.save(update_fields=["is_staff"])


def issue(username: str, role: str, name: str = "") -> str:
    if role not in ROLES:
        raise CommandError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    raw = new_token("skt")
    with transaction.atomic():
        user, _ = get_user_model().objects.get_or_create(username=username)
        grant_role(user, role)
        ApiToken.objects.create(user=user, name=name or f"{role} token", digest=hash_token(raw))
    return raw


class Command(BaseCommand):
    help = "Create (or reuse) a user with a role and print a new API token on the last line."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", choices=ROLES, default="viewer")
        parser.add_argument("--name", default="", help="a label for the token (e.g. the integration's name)")

    def handle(self, username, role, name, **options):
        raw = issue(username, role, name)
        self.stderr.write(f"Token for {username} ({role}). It is shown once; store it now.")
        self.stdout.write(raw)
