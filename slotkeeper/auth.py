"""API authentication and the role permissions.

Two kinds of Bearer token: a person's or an integration's (`skt_…`, an ApiToken with a role through its user) and a
node agent's (`skn_…`, stored on the node). A node token authenticates a NodeAgent principal that has no role at all:
it may only call the agent endpoints of its own node, which check `node_id` themselves.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import router
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from slotkeeper import statements
from slotkeeper.models import ApiToken, hash_token
from slotkeeper.roles import has_role, remember_groups


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


@dataclass(frozen=True)
class NodeToken:
    """A node token this process resolved recently (`node_tokens`): who it belongs to and what the node row said
    then. Never trusted on its own: every use checks it against the row in the same statement (the heartbeat's
    guarded UPDATE, or the read by id and digest), so a token rotated or a node fenced in another process is
    refused at once there too; the cache only saves the lookup."""

    digest: str
    node_id: int
    node_name: str
    status: str
    last_sample_at: datetime | None


class NodeTokenCache:
    """Digest -> NodeToken, bounded (least recently used out first) and short-lived (`ttl_s`). Dropped for a node
    when its token is rotated, it is fenced or deleted (fleet/actions.py), so this process never even tries a stale
    entry; other processes find out through the check above and drop theirs."""

    def __init__(self, max_size: int, ttl_s: float) -> None:
        self.max_size, self.ttl_s = max_size, ttl_s
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, NodeToken]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, digest: str) -> NodeToken | None:
        with self._lock:
            found = self._entries.get(digest)
            if found is None or found[0] <= time.monotonic():
                if found is not None:
                    del self._entries[digest]
                self.misses += 1
                return None
            self._entries.move_to_end(digest)
            self.hits += 1
            return found[1]

    def put(self, entry: NodeToken) -> None:
        with self._lock:
            self._entries[entry.digest] = (time.monotonic() + self.ttl_s, entry)
            self._entries.move_to_end(entry.digest)
            while len(self._entries) > self.max_size:
                self._entries.popitem(last=False)

    def update(self, entry: NodeToken) -> None:
        """Replaces an entry that is still cached (keeping its expiry); never adds one."""
        with self._lock:
            found = self._entries.get(entry.digest)
            if found is not None:
                self._entries[entry.digest] = (found[0], entry)

    def refresh(self, entries) -> None:
        """Gives entries still cached a full TTL again (never adds one, so a token forgotten meanwhile stays
        forgotten): for tokens the node row has just confirmed, as the heartbeat flush's guarded UPDATE does.
        Without it a node beating every 5 s into two processes missed the cache one heartbeat in three."""
        expires = time.monotonic() + self.ttl_s
        with self._lock:
            for entry in entries:
                if entry.digest in self._entries:
                    self._entries[entry.digest] = (expires, self._entries[entry.digest][1])

    def forget(self, digest: str) -> None:
        with self._lock:
            self._entries.pop(digest, None)

    def forget_node(self, node_id: int) -> None:
        with self._lock:
            for digest in [d for d, (_, e) in self._entries.items() if e.node_id == node_id]:
                del self._entries[digest]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


node_tokens = NodeTokenCache(
    max_size=settings.SLOTKEEPER["NODE_TOKEN_CACHE_SIZE"], ttl_s=settings.SLOTKEEPER["NODE_TOKEN_CACHE_TTL_S"]
)


def node_token_of(node, digest: str | None = None) -> NodeToken:
    """What `node_tokens` remembers of a node row just read or written."""
    return NodeToken(
        digest=digest or node.token_digest,
        node_id=node.pk,
        node_name=node.name,
        status=node.status,
        last_sample_at=node.last_sample_at,
    )


def bearer_from(header: str) -> str | None:
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return None
    return raw.strip()


def authenticate_token(raw: str):
    """Returns (principal, credential) for a raw Bearer token, or None when it is unknown or revoked; the
    credential is the ApiToken row, the Node row, or a NodeToken. A node token seen recently comes from `node_tokens` without a query (a NodeToken, which its user
    checks against the row); otherwise the node row is read whole, since the agent views work on it."""
    # Imported here: this module is part of the kernel every app imports (fleet too), so importing fleet's
    # models at the top would make the kernel depend on the app above it; only a node's token needs them.
    from fleet.models import Node

    digest = hash_token(raw)
    if raw.startswith("skn_"):
        cached = node_tokens.get(digest)
        if cached is not None:
            return NodeAgent(node_id=cached.node_id, node_name=cached.node_name), cached
        node = Node.objects.filter(token_digest=digest).first()
        if node is None:
            return None
        if node.fenced_at is None:
            node_tokens.put(node_token_of(node))
        return NodeAgent(node_id=node.pk, node_name=node.name), node
    # The token, its user and the user's group names in one statement (a row per group): the role check that
    # follows every authentication then asks nothing more. Compiled once (slotkeeper/statements.py): building
    # and compiling the queryset was most of an API request's authentication (docs/benchmarks/burst-http.md,
    # the nineteenth session).
    alias = router.db_for_read(ApiToken)
    token_fields, user_fields = _token_columns()
    rows = statements.template(alias, "auth.api_token", _token_query, _DIGEST_MARKER).rows(alias, digest)
    if not rows:
        return None
    first, split = rows[0], len(token_fields)
    token = ApiToken.from_db(alias, token_fields, first[:split])
    user = get_user_model().from_db(alias, user_fields, first[split:-1])
    if not user.is_active:
        return None
    token.user = user
    remember_groups(user, (row[-1] for row in rows if row[-1]))
    return user, token


# No digest is this: hash_token gives 64 hex digits.
_DIGEST_MARKER = "\x00digest"


@functools.cache
def _token_columns() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The attnames of a token's columns and of its user's, in the order `_token_query` selects them."""
    user_model = get_user_model()
    return (
        tuple(f.attname for f in ApiToken._meta.concrete_fields),
        tuple(f.attname for f in user_model._meta.concrete_fields),
    )


def _token_query(digest: str):
    token_fields, user_fields = _token_columns()
    return ApiToken.objects.filter(digest=digest, revoked_at=None).values_list(
        *token_fields, *(f"user__{name}" for name in user_fields), "user__groups__name"
    )


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
