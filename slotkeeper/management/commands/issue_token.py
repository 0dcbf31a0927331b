"""`manage.py issue_token USERNAME --role ROLE`: makes the user if needed, gives it the role, prints a new token
alone on the last line (so scripts can take `tail -n1`)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from slotkeeper.domain import DomainError
from slotkeeper.roles import ROLES
from slotkeeper.tokens import do_issue_token, grant_role

__all__ = ["Command", "grant_role", "issue"]


def issue(username: str, role: str, name: str = "") -> str:
    """The command's write, through the action (with its audit row); the demo and the tests call it too."""
    try:
        return do_issue_token(None, username, role, now=timezone.now(), name=name)
    except DomainError as exc:
        raise CommandError(str(exc)) from None


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
