"""Writing the audit feed. Called from inside an action's transaction, so the row commits with the change."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from slotkeeper.bulk import Row
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
    return AuditEntry(**_fields(at, actor, action, target, reason, details))


def entry_row(
    *, at: datetime, actor, action: str, target, reason: str = "", details: dict[str, Any] | None = None
) -> Row:
    """`entry` as a bulk.Row of AuditEntry (`insert_many(rows, model=AuditEntry)`), without building a model
    instance: a planning pass writes one for every request it decides."""
    return Row(**_fields(at, actor, action, target, reason, details))


def _fields(
    at: datetime, actor, action: str, target, reason: str, details: dict[str, Any] | None
) -> dict[str, Any]:
    real_user = actor if getattr(actor, "pk", None) and not getattr(actor, "is_node_agent", False) else None
    return {
        "at": at,
        "actor_id": real_user.pk if real_user is not None else None,
        "actor_label": actor_label(actor),
        "action": action,
        # No target: an action on many things at once (a lease array), which its details list.
        "target_type": target._meta.model_name if target is not None else "",
        "target_id": str(target.pk) if target is not None else "",
        "target_label": str(target) if target is not None else "",
        "reason": reason,
        "details": details or {},
    }


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
