"""A lease's vnode spec (`{"cpu_cores", "mem_mib", "disk_gib"}`, as stored in Lease.vnodes) read once into the
amounts every consumer needs: the slot table's `Res`, the placer's `Need` and `Claim`. PURE: no Django.

The conversion was written four times (the plan applier, the claims, a move's need and its slot check); a
rounding that differed between two of them would let the placer and the slot table disagree about one vnode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.capacity import Claim, Need
from leases.slottable import Res


@dataclass(frozen=True)
class VnodeSize:
    cpu_cores: float
    mem_mib: int
    disk_gib: int


def size(v: Mapping[str, Any]) -> VnodeSize:
    return VnodeSize(
        cpu_cores=float(v.get("cpu_cores", 0)), mem_mib=int(v["mem_mib"]), disk_gib=int(v.get("disk_gib", 0))
    )


def as_res(v: Mapping[str, Any]) -> Res:
    """The slot table counts cores in hundredths (100 = 1 core)."""
    s = size(v)
    return Res(cpu=round(s.cpu_cores * 100), mem=s.mem_mib, disk=s.disk_gib)


def as_claim(iid: str, v: Mapping[str, Any]) -> Claim:
    s = size(v)
    return Claim(id=iid, mem_mib=s.mem_mib, disk_gib=s.disk_gib, cpu_cores=s.cpu_cores)


def as_need(v: Mapping[str, Any], capabilities: Iterable[str], preferred: str | None = None) -> Need:
    s = size(v)
    return Need(
        mem_mib=s.mem_mib,
        disk_gib=s.disk_gib,
        cpu_cores=s.cpu_cores,
        capabilities=frozenset(capabilities),
        preferred_node=preferred,
    )


def as_json(r: Res) -> dict[str, Any]:
    """A slot-table `Res` back as the vnode spec it came from."""
    return {"cpu_cores": r.cpu / 100, "mem_mib": r.mem, "disk_gib": r.disk}
