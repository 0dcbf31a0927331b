"""API authentication and the role permissions.

Two kinds of Bearer token: a person's or an integration's (`skt_…`, an ApiToken with a role through its user) and a
node agent's (`skn_…`, stored on the node). A node token authenticates a NodeAgent principal that has no role at all:
it may only call the agent endpoints of its own node, which check `node_id` themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from slotkeeper.models import ApiToken, hash_token
from slotkeeper.roles import has_role


@dataclass
class NodeAgent:
    node_id: int
    node_name: str
    is_node_agent: bool = True
    is_authenticated: bool = True
    is_active: bool = True
    is_staff: bool = False
    is_superuser: bool = False
    pk: None = None

    def get_username(self) -> str:
        return f"agent:{self.node_name}"


def bearer_from(header: str) -> str | None:
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return None
    return raw.strip()


def authenticate_token(raw: str):
    """Returns (principal, token row or node) for a raw Bearer token, or None when it is unknown or revoked."""
    # Imported here: this module is part of the kernel every app imports (fleet too), so importing fleet's
    # models at the top would make the kernel depend on the app above it; only a node's token needs them.
    from fleet.models import Node

    digest = hash_token(raw)
    if raw.startswith("skn_"):
        # The whole row: the heartbeat view works on it, so the node is read once per request, not twice.
        node = Node.objects.filter(token_digest=digest).first()
        return (NodeAgent(node_id=node.pk, node_name=node.name), node) if node else None
    token = ApiToken.objects.select_related("user").filter(digest=digest, revoked_at=None).first()
    if token is None or not token.user.is_active:
        return None
    return token.user, token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = request.headers.get("Authorization", "")
        if not header:
            return None
        raw = bearer_from(header)
        if raw is None:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        found = authenticate_token(raw)
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        principal, row = found
        if isinstance(row, ApiToken):
            now = timezone.now()
            # Touch at most once a minute: a write on every call would make every read a write.
            if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
                ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        return principal, row

    def authenticate_header(self, request):
        return self.keyword


class _RolePermission(permissions.BasePermission):
    role = "viewer"
    message = "This needs the viewer role."

    def has_permission(self, request, view):
        return has_role(request.user, self.role)


class IsViewer(_RolePermission):
    role = "viewer"
    message = "This needs the viewer role (or higher)."


class IsOperator(_RolePermission):
    role = "operator"
    message = "This needs the operator role (or admin)."


class IsAdmin(_RolePermission):
    role = "admin"
    message = "This needs the admin role."


class IsNodeAgent(permissions.BasePermission):
    """Only a node token; the view then checks that the token's node is the node in the URL (403 otherwise)."""

    message = "This endpoint takes a node token."

    def has_permission(self, request, view):
        return getattr(request.user, "is_node_agent", False)
