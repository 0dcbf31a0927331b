"""Writing the audit feed. Called from inside an action's transaction, so the row commits with the change."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from slotkeeper.models import AuditEntry


def actor_label(actor) -> str:
    if actor is None:
        return "system"
    if getattr(actor, "is_node_agent", False):
        return f"agent:{actor.node_name}"
    return actor.get_username()


def entry(
    *, at: datetime, actor, action: str, target, reason: str = "", details: dict[str, Any] | None = None
):
    """An unsaved audit row, for actions that write many at once (bulk_create)."""
    real_user = actor if getattr(actor, "pk", None) and not getattr(actor, "is_node_agent", False) else None
    return AuditEntry(
        at=at,
        actor=real_user,
        actor_label=actor_label(actor),
        action=action,
        target_type=target._meta.model_name,
        target_id=str(target.pk),
        target_label=str(target),
        reason=reason,
        details=details or {},
    )


def record(
    *,
    at: datetime,
    actor,
    action: str,
    target,
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEntry:
    row = entry(at=at, actor=actor, action=action, target=target, reason=reason, details=details)
    row.save()
    return row
