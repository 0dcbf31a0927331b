"""Reads of the lease core, apart from its writes: a lease by id, the scheduler's health for /readyz, and the
groups a lease belongs to as the pure group rules take them (fleet/affinity.py)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Sum

from fleet import affinity
from fleet.models import PlacementReport
from leases.lifecycle import LIVE_INSTANCE_STATES
from leases.models import Allocation, Group, Instance, Lease, Reservation, SchedulerState
from slotkeeper import statements
from slotkeeper.domain import NotFound

LIVE = [s.value for s in LIVE_INSTANCE_STATES]


def get_lease(lease_id: int) -> Lease:
    try:
        return lease_row(lease_id)
    except Lease.DoesNotExist:
        raise NotFound(f"lease {lease_id} does not exist") from None


def lease_row(lease_id: int) -> Lease:
    """`Lease.objects.get(pk=lease_id)` from a statement compiled once (slotkeeper/statements.py): a lease
    request reads its row once decided, and the queryset's building was most of that read. Raises
    Lease.DoesNotExist as get() does."""
    found = statements.instances(Lease, "leases.by_id", _lease_by_id, -1, lease_id)
    if not found:
        raise Lease.DoesNotExist(f"lease {lease_id} does not exist")
    return found[0]


def _lease_by_id(lease_id: int):
    return Lease.objects.filter(pk=lease_id)


def first_report(subject: str) -> PlacementReport | None:
    """The first placement report about `subject`, from a statement compiled once (as `lease_row`)."""
    found = statements.instances(PlacementReport, "reports.first", _first_report, "\x00subject", subject)
    return found[0] if found else None


def _first_report(subject: str):
    return PlacementReport.objects.filter(subject=subject).order_by("id")[:1]


def cache_groups(lease: Lease, groups: list[Group]) -> None:
    """Keeps on `lease` the groups it belongs to, as prefetch_related("groups") would: for a lease whose groups
    the caller knows already (it has just set them), so that reading `lease.groups.all()` asks nothing."""
    cached = Group.objects.filter(pk__in=[g.pk for g in groups])  # never evaluated: its rows are these
    cached._result_cache = list(groups)
    cached._prefetch_done = True
    lease._prefetched_objects_cache = {**getattr(lease, "_prefetched_objects_cache", {}), "groups": cached}


def scheduler_health() -> str:
    """For /readyz: "ok", or how the tick is failing (counts and times only, no reasons: probes are public)."""
    state = SchedulerState.objects.filter(pk=1).first()
    if state is None or not state.tick_failures:
        return "ok"
    return f"tick failing: {state.tick_failures} in a row, last at {state.tick_failed_at:%Y-%m-%dT%H:%M:%SZ}"


def group_rule(group: Group) -> affinity.GroupRule:
    return affinity.GroupRule(group.name, group.policy, group.hard, group.max_per_node)


def group_members(group: Group) -> dict[int, list[tuple[int, str]]]:
    """Where the group's live members run: node id -> [(instance pk, iid)]."""
    rows = Instance.objects.filter(lease__groups=group, state__in=LIVE).values_list("node_id", "pk", "iid")
    by_node: dict[int, list[tuple[int, str]]] = {}
    for node_id, pk, iid in rows:
        by_node.setdefault(node_id, []).append((pk, iid))
    return by_node


def committed_now(now: datetime, node_ids=None) -> dict[int, tuple[float, int, int]]:
    """What the slot table holds on each node at `now` (cores, MiB, GiB), one query for any number of nodes:
    the `committed` figure of the node API, the board and the node page (docs/capacity.md)."""
    rows = Allocation.objects.filter(live=True, start__lte=now, end__gt=now)
    if node_ids is not None:
        rows = rows.filter(node_id__in=node_ids)
    sums = rows.values("node_id").annotate(cpu=Sum("cpu"), mem=Sum("mem_mib"), disk=Sum("disk_gib"))
    return {r["node_id"]: (r["cpu"] / 100, r["mem"], r["disk"]) for r in sums}


def groups_by_lease(lease_ids) -> dict[int, list[affinity.GroupMembers]]:
    """Each lease's groups with their live members and the room held for lost ones, as the rules take them: three
    queries for any number of leases (the scheduler's reload, a pass's intents, counter-offers)."""
    links = list(
        Lease.groups.through.objects.filter(lease_id__in=lease_ids).values_list("lease_id", "group_id")
    )
    if not links:
        return {}
    groups = {g.pk: g for g in Group.objects.filter(pk__in={gid for _, gid in links})}
    members: dict[int, dict[int, list[str]]] = {gid: {} for gid in groups}
    rows = Instance.objects.filter(lease__groups__in=list(groups), state__in=LIVE).values_list(
        "lease__groups", "node_id", "iid"
    )
    for gid, node_id, iid in rows:
        if gid in members and node_id is not None:
            members[gid].setdefault(node_id, []).append(iid)
    # Room held for a member's lost VM (a reschedule proposal's target) counts as the member standing there: the
    # group's rules hold for held room as for placed room.
    held = Reservation.objects.filter(
        lease__groups__in=list(groups), kind="hold", status__in=["scheduled", "active"]
    ).values_list("lease__groups", "lease_id", "nodes")
    for gid, lease_id, nodes in held:
        for vnode, node_id in (nodes or {}).items():
            if gid in members:
                members[gid].setdefault(int(node_id), []).append(f"{lease_id}-{vnode} (held)")
    out: dict[int, list[affinity.GroupMembers]] = {}
    for lease_id, gid in links:
        out.setdefault(lease_id, []).append(affinity.GroupMembers(group_rule(groups[gid]), members[gid]))
    return out
