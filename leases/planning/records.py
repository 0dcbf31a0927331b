"""The database's rows in the pure scheduler's terms: epoch seconds for datetimes, a node's allocatable capacity
as the slot table's Res, the live service's scheduler options, and a Lease as the scheduler's LeaseRequest and
LeaseRecord (with the nodes its capabilities and groups bar). Every other module of the plan applier, and the
callers that ask the scheduler something (previews, counter-offers, reschedules), convert through here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import lru_cache

from django.conf import settings

from fleet import affinity, capacity
from leases import vnodes
from leases.lifecycle import LeaseState
from leases.models import Lease, Reservation
from leases.scheduler import LeaseRecord, LeaseRequest, ReservationRecord, SchedulerConfig
from leases.slottable import Res


def to_epoch(dt: datetime) -> float:
    return dt.timestamp()


def from_epoch(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def node_capacity(node: capacity.NodeState) -> Res:
    """What the slot table plans with on a node: its allocatable capacity (docs/capacity.md)."""
    return _as_res(capacity.node_limits(node))


@lru_cache(maxsize=4096)  # every pass asks for every node's; a fleet has few distinct figures
def _as_res(limits: capacity.Limits) -> Res:
    return Res(cpu=limits.cpu_cores * 100, mem=limits.mem_mib, disk=limits.disk_gib)


def scheduler_config() -> SchedulerConfig:
    """Haizea's options from settings, with the live service's own decisions (docs/scheduler.md)."""
    config = SchedulerConfig.from_options(getattr(settings, "SLOTKEEPER_SCHEDULING", {}))
    return replace(config, whole_window_retry=True, rank_by_slots=True)


def request_of(
    lease: Lease, groups: Sequence[affinity.GroupMembers] = (), nodes: Sequence[capacity.NodeState] = ()
) -> LeaseRequest:
    """The scheduler's view of a lease: its size and times, and what its capabilities and groups (reads.groups_by_lease)
    say about the nodes `nodes`: the ones it may never use, and how it spreads over the rest."""
    rules = affinity.spread(groups, [n.id for n in nodes]) if groups else affinity.Spread()
    return LeaseRequest(
        id=lease.pk,
        type=lease.type,
        submit=to_epoch(lease.submitted_at),
        start=to_epoch(lease.requested_start) if lease.requested_start else None,
        duration=lease.duration_s,
        vnodes=tuple(vnodes.as_res(v) for v in lease.vnodes),
        preemptible=lease.preemptible,
        real_duration=lease.real_duration_s,
        spread=rules.limit,
        taken=rules.taken,
        avoid=rules.avoid,
        barred=barred_nodes(lease.capabilities or (), groups, nodes),
        capabilities=frozenset(lease.capabilities or ()),
    )


def barred_nodes(
    capabilities, groups: Sequence[affinity.GroupMembers], nodes: Sequence[capacity.NodeState]
) -> tuple[tuple[int, str], ...]:
    """(node id, "code: sentence") for each node the lease may never use: a capability it lacks, or a hard group
    rule that forbids it (the same rule the approval and the agent's late check apply)."""
    need = set(capabilities)
    if not need and not any(group.members for group in groups):
        return ()  # most leases: nothing bars a node (was a dict of every node's name per lease)
    names = {n.id: n.name for n in nodes}
    out: dict[int, str] = {}
    for node in nodes:
        if need and not need <= node.capabilities:
            out[node.id] = f"missing_capability: lacks {', '.join(sorted(need - node.capabilities))}"
            continue
        for group in groups:
            unfit = affinity.unfit(group, node.id, names=names) if group.members else None
            if unfit is not None:
                out[node.id] = f"{unfit.code}: {unfit.reason}"
                break
    return tuple(sorted(out.items()))


def record_of(
    lease: Lease,
    reservations: list[Reservation],
    groups: Sequence[affinity.GroupMembers] = (),
    nodes: Sequence[capacity.NodeState] = (),
) -> LeaseRecord:
    return LeaseRecord(
        request=request_of(lease, groups, nodes),
        state=LeaseState(lease.state),
        reservations=[
            ReservationRecord(
                rid=r.rid,
                lease_id=lease.pk,
                kind=r.kind,
                start=to_epoch(r.start),
                end=to_epoch(r.end),
                nodes={int(k): v for k, v in r.nodes.items()},
                status=r.status,
                sources={int(k): v for k, v in (r.sources or {}).items()},
            )
            for r in reservations
        ],
        run_time=lease.run_time_s,
        first_start=to_epoch(lease.first_start) if lease.first_start else None,
        end=to_epoch(lease.ended_at) if lease.ended_at else None,
        lost_run_time=lease.lost_run_time_s,
        images={int(k): v for k, v in (lease.images or {}).items()},
        in_future=lease.in_future,
    )


@lru_cache(maxsize=4096)  # a pass's messages and reports name the same few instants thousands of times
def live_label(t: float) -> str:
    """A time in the live service's messages: the date as well, so a reservation next week does not read as
    "00:00–00:00" (UTC; the console shows times in the reader's zone)."""
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC" if moment.second == 0 else "%Y-%m-%d %H:%M:%S UTC")
