"""What this node reports about itself: real host health with psutil, or simulated health for the demo fleet.

Both produce the same `Health` value; the agent takes any `Callable[[], Health]`, so a demo fleet of
simulated agents in one process reports plausible, drifting numbers per node, not the host's own N times.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

MIB = 1024 * 1024
GIB = 1024 * 1024 * 1024


@dataclass(frozen=True)
class Health:
    mem_total_mib: int
    mem_used_mib: int
    disk_free_gib: float
    cpu_pct: float
    load1: float

    def as_payload(self) -> dict[str, float]:
        return asdict(self)


def read_host_health(work_dir: Path) -> Health:
    """Measure the host now. Disk is the work dir's filesystem: that is where instances write their logs."""
    memory = psutil.virtual_memory()
    return Health(
        mem_total_mib=memory.total // MIB,
        # total - available, not `used`: page cache the kernel will drop on demand is not memory an instance
        # competes for, and counting it makes a node that just copied a big file look full to the placer.
        mem_used_mib=(memory.total - memory.available) // MIB,
        disk_free_gib=round(psutil.disk_usage(str(work_dir)).free / GIB, 2),
        # interval=None compares against the previous call instead of sleeping: a blocking sample would stall
        # the heartbeat. The first call after start reads 0.0, which the next heartbeat corrects.
        cpu_pct=psutil.cpu_percent(interval=None),
        load1=round(os.getloadavg()[0], 2),
    )


def host_size(work_dir: Path) -> dict[str, int]:
    """The node's capacity as registration declares it."""
    return {
        "cpu_cores": psutil.cpu_count() or 1,
        "mem_total_mib": psutil.virtual_memory().total // MIB,
        "disk_total_gib": psutil.disk_usage(str(work_dir)).total // GIB,
    }


class SimulatedHealth:
    """A pretend machine: an idle footprint that drifts, plus what its running instances have touched.

    An instance's memory ramps from an eighth of its claim to all of it over its first minute, as a freshly
    booted VM does in seed 001 (morpheus: two young VMs held ~1 GiB of 8 each). That keeps the demo fleet
    honest about the case the placer must get right: observed usage well below what is committed.
    """

    RAMP_S = 60.0

    def __init__(
        self,
        mem_total_mib: int,
        cpu_cores: int,
        disk_free_gib: float,
        seed: int,
        claims: Callable[[], Sequence[tuple[float, float]]] = lambda: (),
    ) -> None:
        self.mem_total_mib = mem_total_mib
        self.cpu_cores = cpu_cores
        self._disk_free_gib = disk_free_gib
        self._rng = random.Random(seed)
        self._baseline_mib = mem_total_mib * 0.08
        self._idle_cpu = 3.0
        self.claims = claims  # (mem_mib, age_s) of each running instance; set once the agent exists

    def __call__(self) -> Health:
        self._baseline_mib = _drift(
            self._rng, self._baseline_mib, 0.05 * self.mem_total_mib, 0.15 * self.mem_total_mib
        )
        self._idle_cpu = _drift(self._rng, self._idle_cpu, 1.0, 12.0)
        claims = list(self.claims())
        touched = sum(mem * min(1.0, 0.125 + 0.875 * age / self.RAMP_S) for mem, age in claims)
        busy_pct = min(100.0, self._idle_cpu + 100.0 * len(claims) * 0.6 / self.cpu_cores)
        used = min(self.mem_total_mib, int(self._baseline_mib + touched))
        self._disk_free_gib = max(0.0, self._disk_free_gib - 0.001 * len(claims))
        return Health(
            mem_total_mib=self.mem_total_mib,
            mem_used_mib=used,
            disk_free_gib=round(self._disk_free_gib, 2),
            cpu_pct=round(busy_pct, 1),
            load1=round(busy_pct / 100.0 * self.cpu_cores, 2),
        )


def _drift(rng: random.Random, value: float, low: float, high: float) -> float:
    """A bounded random walk: about 2 % of the range per reading, so a chart moves without jumping."""
    step = (high - low) * 0.02
    return min(high, max(low, value + rng.uniform(-step, step)))
