"""Groups: create, change, delete. Each one transaction with its audit row, from the API and the admin alike (no
page shows groups live, so there is no event to send). A hard rule is refused when the members it names already break it (fleet/affinity.py,
the rule every placement applies)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import IntegrityError, transaction

from fleet import affinity
from fleet.models import Node
from leases.instance_rows import LIVE
from leases.models import Group, Instance, Lease
from slotkeeper import audit
from slotkeeper.domain import DomainError

FIELDS = ("name", "policy", "hard", "max_per_node")


def violation(policy: str, max_per_node: int, lease_ids: Iterable[int]) -> str:
    """Why these leases' live instances already break the hard rule, or "" when they do not."""
    per_node: dict[int, list[str]] = {}
    rows = Instance.objects.filter(lease_id__in=list(lease_ids), state__in=LIVE).values_list("node_id", "iid")
    for node_id, iid in rows:
        per_node.setdefault(node_id, []).append(iid)
    names = dict(Node.objects.filter(pk__in=per_node).values_list("id", "name"))
    return affinity.violation(affinity.GroupRule("", policy, True, max_per_node), per_node, names)


def do_create_group(actor, *, now: datetime, leases: Iterable[Lease] = (), **fields) -> Group:
    try:
        with transaction.atomic():
            group = Group.objects.create(**{k: v for k, v in fields.items() if k in FIELDS})
            group.leases.set(list(leases))
            audit.record(at=now, actor=actor, action="group.create", target=group)
    except IntegrityError:
        raise DomainError(f"a group named {fields.get('name')!r} already exists") from None
    return group


def do_update_group(
    actor, group: Group, *, now: datetime, leases: Iterable[Lease] | None = None, **fields
) -> Group:
    try:
        with transaction.atomic():
            changed = [k for k in fields if k in FIELDS]
            for name in changed:
                setattr(group, name, fields[name])
            if changed:
                group.save(update_fields=changed)
            if leases is not None:
                group.leases.set(list(leases))
            audit.record(at=now, actor=actor, action="group.update", target=group)
    except IntegrityError:
        raise DomainError(f"a group named {fields.get('name')!r} already exists") from None
    return group


def do_delete_group(actor, group: Group, *, now: datetime) -> None:
    with transaction.atomic():
        audit.record(at=now, actor=actor, action="group.delete", target=group)
        group.delete()
