"""A node as the placer sees it, and the arithmetic of its memory. PURE: no Django, no clock.

A `NodeState` is a plain snapshot (fleet/placement.py reads it from the database); its `Claim`s are what the
server committed there, running and pending. This module owns what a node's memory is charged at (observed,
committed, and the worse of the two), the host's own footprint (seed 001: measured idle, or inferred), the host
and disk reserves, and the live CPU headroom that breaks ties. fleet/capacity.py (the placer) builds on it and
re-exports these names, so callers keep reading `capacity.NodeState`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

# Held back for the host: agent, OS, page cache, and the margin that keeps a node out of swap. A node in swap
# slows every instance on it at once, which costs more than the memory kept idle here.
HOST_RESERVE_MIB = 4096

# The least we believe a host's own footprint can be. Without it, a node reporting less used memory than its
# instances have claimed would infer a negative baseline and hand out memory the host is really using.
BASELINE_FLOOR_MIB = 2048

# Instance disk may never drive a node below this: images and collected outputs share the filesystem on some
# nodes, and a full disk fails every instance on the node, not just the newest.
DISK_RESERVE_GIB = 20

# A remembered idle footprint moves only when a new idle reading differs by at least this much. Allocatable
# memory (and so the slot table's capacity) follows the baseline; a few MiB of jitter per heartbeat would
# otherwise change a node's capacity, and reload the scheduler, on every heartbeat of every idle node.
BASELINE_STEP_MIB = 128

# CPU readings older than this rank as zero headroom. Headroom only breaks ties, so staleness demotes a node
# instead of excluding it; exclusion is the health check's job.
METRICS_MAX_AGE_S = 60.0


@dataclass(frozen=True)
class Claim:
    """A commitment on a node, identified so that running and pending are unioned by id."""

    id: str
    mem_mib: int
    disk_gib: int = 0
    cpu_cores: float = 0.0


@dataclass(frozen=True)
class NodeState:
    """A plain snapshot of one node, read from the database by fleet/placement.py."""

    id: int
    name: str
    status: str  # "online" | "draining" | "offline" | "dead"
    capabilities: frozenset[str]
    cpu_cores: int  # declared
    mem_total_mib: int  # declared
    disk_total_gib: int  # declared
    health_age_s: float | None  # seconds since the last heartbeat; None = never reported
    observed_mem_total_mib: int | None = None  # from the last heartbeat; None = unreadable
    observed_mem_used_mib: int | None = None
    disk_free_gib: float | None = None
    cpu_pct: float | None = None
    idle_baseline_mib: int | None = None  # remembered idle reading
    running: tuple[Claim, ...] = ()  # reported running by the agent
    pending: tuple[Claim, ...] = ()  # placed, not yet started
    # Age of cpu_pct when it comes from somewhere other than the heartbeat; None = it came with the heartbeat.
    metrics_age_s: float | None = None

    @classmethod
    def read(
        cls,
        id: int,
        name: str,
        status: str,
        capabilities: frozenset[str],
        cpu_cores: int,
        mem_total_mib: int,
        disk_total_gib: int,
        health_age_s: float | None,
        observed_mem_total_mib: int | None,
        observed_mem_used_mib: int | None,
        disk_free_gib: float | None,
        cpu_pct: float | None,
        idle_baseline_mib: int | None,
    ) -> NodeState:
        """A node as the fleet read gives it, with nothing claimed: built without the frozen dataclass's
        per-field `__setattr__`, which was a third of reading 1,000 nodes on every planning pass."""
        node = object.__new__(cls)
        node.__dict__.update(
            id=id,
            name=name,
            status=status,
            capabilities=capabilities,
            cpu_cores=cpu_cores,
            mem_total_mib=mem_total_mib,
            disk_total_gib=disk_total_gib,
            health_age_s=health_age_s,
            observed_mem_total_mib=observed_mem_total_mib,
            observed_mem_used_mib=observed_mem_used_mib,
            disk_free_gib=disk_free_gib,
            cpu_pct=cpu_pct,
            idle_baseline_mib=idle_baseline_mib,
            running=(),
            pending=(),
            metrics_age_s=None,
        )
        return node


class MemoryUse(NamedTuple):
    """A node's memory as the placer charges it, in MiB."""

    observed_mib: int
    committed_mib: int
    effective_mib: int


class Limits(NamedTuple):
    """The most one instance could ever get on a node with nothing else placed on it."""

    mem_mib: int
    disk_gib: int
    cpu_cores: int


# ------------------------------------------------------------------------------------------------------------
# Arithmetic


def split_claims(node: NodeState) -> tuple[tuple[Claim, ...], tuple[Claim, ...]]:
    """(running, pending not yet running), each id once: the union by id, kept in its two halves.

    Adding the two lists would shrink the fleet by the number of instances currently starting; ignoring
    pending would let two placements a second apart both take the last slot. The halves stay apart because
    only running instances show up in observed memory and disk.
    """
    if not node.pending:
        return node.running, ()
    ids = {c.id for c in node.running}
    return node.running, tuple(c for c in node.pending if c.id not in ids)


def committed_claims(node: NodeState) -> tuple[Claim, ...]:
    """Running and pending unioned by id: an instance placed and since started is one claim, not two."""
    running, pending = split_claims(node)
    return running + pending


def host_baseline_mib(observed_used_mib: int, running_mib: int, remembered_mib: int | None) -> int:
    """What the host itself costs, excluding the instances running on it.

    With nothing running it is simply what the node reports. With instances running it can only be
    remembered or inferred, and inference alone fails on young instances: subtracting their FULL claim from
    observed use assumes they have touched it all. Measured on morpheus (31757 MiB, 4314 idle): two young
    8 GiB VMs showed 6314 used, the inference went negative, clamped to the floor, and freed exactly enough
    for a third VM on a 2-slot node. So take the larger of the remembered idle reading and the inference, so
    a host doing real work outside its instances is still charged for it.

    Only RUNNING claims are subtracted: a pending instance has touched no memory, and subtracting its claim
    too let a node idle at 16385 MiB take a fifth 8 GiB instance it had no room for (found by the property
    test in tests/fleet/test_capacity.py).
    """
    if running_mib == 0:
        return max(observed_used_mib, BASELINE_FLOOR_MIB)
    inferred = observed_used_mib - running_mib
    return max(inferred, remembered_mib or 0, BASELINE_FLOOR_MIB)


def effective_use(node: NodeState) -> MemoryUse | None:
    """Observed, committed and effective (the worse of the two) memory use; None when memory is unreadable."""
    observed = node.observed_mem_used_mib
    if observed is None:
        return None
    running, pending = split_claims(node)
    running_mib = sum(c.mem_mib for c in running)
    committed = committed_mib(observed, running_mib, sum(c.mem_mib for c in pending), node.idle_baseline_mib)
    return MemoryUse(observed, committed, max(observed, committed))


def committed_mib(observed_mib: int, running_mib: int, pending_mib: int, remembered_mib: int | None) -> int:
    # Observed alone under-counts a freshly booted instance; committed alone under-counts a host busy with
    # work of its own. Callers charge the worse of the two, which is what the node can be trusted to have.
    return running_mib + pending_mib + host_baseline_mib(observed_mib, running_mib, remembered_mib)


def node_limits(node: NodeState) -> Limits:
    """What one instance could get on this node when empty, from declared totals (known even offline).

    This is the node's *allocatable* capacity (docs/capacity.md): the slot table plans with it, the placer checks
    against it, and the board and the API show it."""
    return allocatable(node.cpu_cores, node.mem_total_mib, node.disk_total_gib, node.idle_baseline_mib)


@lru_cache(maxsize=4096)  # a fleet has few distinct shapes; every pass asks for every node's
def allocatable(
    cpu_cores: int, mem_total_mib: int, disk_total_gib: int, idle_baseline_mib: int | None
) -> Limits:
    """Declared capacity less the host reserve (memory and disk) and the host's remembered own footprint (seed
    001's rule: the remembered idle reading, never below the floor). Never negative."""
    mem = mem_total_mib - HOST_RESERVE_MIB - max(idle_baseline_mib or 0, BASELINE_FLOOR_MIB)
    return Limits(max(mem, 0), max(disk_total_gib - DISK_RESERVE_GIB, 0), max(cpu_cores, 0))


class Resources(NamedTuple):
    """An amount of each dimension a node offers: cores (fractional), memory in MiB, disk in GiB."""

    cpu_cores: float
    mem_mib: int
    disk_gib: int


@dataclass(frozen=True)
class CapacityFigures:
    """A node's figures of the capacity model (docs/capacity.md), as the API and the console both show them:
    `allocatable` (see there) and `committed`, what the slot table holds on the node now. Free and the overrun are
    derived here once, so the node resource, the board, the node page and the slot table cannot disagree."""

    allocatable: Resources
    committed: Resources

    @property
    def free(self) -> Resources:
        """Allocatable less committed; negative where running work exceeds allocatable."""
        a, c = self.allocatable, self.committed
        return Resources(round(a.cpu_cores - c.cpu_cores, 2), a.mem_mib - c.mem_mib, a.disk_gib - c.disk_gib)

    @property
    def over(self) -> Resources:
        """By how much committed exceeds allocatable, per dimension; zero where it fits."""
        free = self.free
        return Resources(max(0.0, -free.cpu_cores), max(0, -free.mem_mib), max(0, -free.disk_gib))

    @property
    def over_allocatable(self) -> bool:
        """Running work exceeds allocatable (a node resized or a baseline grown under it): flagged, never killed."""
        return any(v > 0 for v in self.over)


def capacity_figures(
    cpu_cores: int,
    mem_total_mib: int,
    disk_total_gib: int,
    idle_baseline_mib: int | None,
    committed: tuple[float, int, int] | None = None,
) -> CapacityFigures:
    """A node's figures from its declared totals, its remembered baseline and what the slot table holds on it now
    (cores, MiB, GiB; read by leases.reads.committed_now, nothing when absent)."""
    limits = allocatable(cpu_cores, mem_total_mib, disk_total_gib, idle_baseline_mib)
    return CapacityFigures(
        Resources(float(limits.cpu_cores), limits.mem_mib, limits.disk_gib),
        Resources(*committed) if committed else Resources(0.0, 0, 0),
    )


def mem_limit(node: NodeState) -> int:
    return node_limits(node).mem_mib


def remembered_baseline(remembered_mib: int | None, idle_reading_mib: int) -> int:
    """The idle footprint to remember after an idle reading: the reading, unless it is within BASELINE_STEP_MIB of
    what is remembered (see there)."""
    if remembered_mib is None or abs(idle_reading_mib - remembered_mib) >= BASELINE_STEP_MIB:
        return idle_reading_mib
    return remembered_mib


def headroom_of(node: NodeState) -> float:
    """Live idle CPU in percent, for tie-breaking; 0 when the reading is missing or stale."""
    age = node.metrics_age_s if node.metrics_age_s is not None else node.health_age_s
    if node.cpu_pct is None or age is None or age > METRICS_MAX_AGE_S:
        return 0.0
    return max(0.0, 100.0 - node.cpu_pct)
