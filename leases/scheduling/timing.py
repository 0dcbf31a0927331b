"""The suspend/resume/migrate/shutdown timing model (SEMANTICS §3.8, §3.9, §3.12, §10 Q5, Q9, Q17).

How long each operation takes, the shortest run worth starting, and the reservations a suspension, resumption or
migration needs. PURE: no Django.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from leases.lifecycle import LeaseState
from leases.scheduling.records import (
    MIGRATE,
    RESUME,
    LeaseRecord,
    LeaseRequest,
    SchedulerConfig,
    Spec,
)


class Timing:
    """Durations and operation reservations under one configuration; per-lease answers are memoised."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._estimates: dict[tuple[int, float, float | None], float] = {}
        self._thresholds: dict[tuple[int, bool], float] = {}

    def forget(self, lease_id: int) -> None:
        """Drops the memoised answers for `lease_id` (a dry run's probe id, reused by the next probe)."""
        cfg = self.config
        for rate, override in (
            (cfg.suspend_rate, cfg.override_suspend_time),
            (cfg.resume_rate, cfg.override_resume_time),
        ):
            self._estimates.pop((lease_id, rate, override), None)
        for resuming in (False, True):
            self._thresholds.pop((lease_id, resuming), None)

    def shutdown_time(self, req: LeaseRequest) -> float:
        return self.config.shutdown_time + self.config.enactment_overhead * len(req.vnodes)

    def op_time(self, mem: int, rate: float, override: float | None) -> float:
        return override if override is not None else float(math.ceil(mem / rate))

    def estimate(self, req: LeaseRequest, rate: float, override: float | None) -> float:
        """Whole-lease suspend or resume estimate: one VM after another (Q5, the 1.1 formula)."""
        key = (req.id, rate, override)
        got = self._estimates.get(key)
        if got is None:
            overhead = self.config.enactment_overhead
            got = self._estimates[key] = sum(
                self.op_time(v.mem, rate, override) + overhead for v in req.vnodes
            )
        return got

    def threshold(self, req: LeaseRequest, resuming: bool) -> float:
        """The shortest run worth starting or keeping (§3.9); 0 without suspension (Q17)."""
        if self.config.suspension == "none":
            return 0.0
        if self.config.force_scheduling_threshold is not None:
            return self.config.force_scheduling_threshold
        key = (req.id, resuming)  # asked for every queued lease at every pass, like the estimates below it
        got = self._thresholds.get(key)
        if got is None:
            safe = self.estimate(req, self.config.suspend_rate, self.config.override_suspend_time)
            if resuming:
                safe += self.estimate(req, self.config.resume_rate, self.config.override_resume_time)
            got = self._thresholds[key] = safe * (1 + self.config.scheduling_threshold_factor)
        return got

    def threshold_for(self, rec: LeaseRecord) -> float:
        """The threshold for a lease as it stands (§3.9): the resume estimate counts only while the lease waits
        in the queue suspended (SUSPENDED_QUEUED), as in Haizea 1.1. A suspended future reservation re-planned
        after an early end (SUSPENDED_PENDING) or a resumed lease being preempted is held to the suspend
        estimate alone."""
        return self.threshold(rec.request, rec.state == LeaseState.SUSPENDED_QUEUED)

    def op_specs(
        self, kind: str, mapping: Mapping[int, int], req: LeaseRequest, anchor: float, *, forward: bool
    ) -> list[Spec]:
        """Suspension (backwards from `anchor`) or resumption (forwards) reservations for the mapped vnodes."""
        cfg = self.config
        rate, override = (
            (cfg.resume_rate, cfg.override_resume_time)
            if kind == RESUME
            else (cfg.suspend_rate, cfg.override_suspend_time)
        )
        ops = {v: self.op_time(req.vnodes[v - 1].mem, rate, override) for v in sorted(mapping)}
        if cfg.suspendresume_exclusion == "global":
            groups = global_groups(ops, mapping, anchor, forward, cfg.enactment_overhead)
        else:
            groups = local_groups(ops, mapping, anchor, forward, cfg.enactment_overhead)
        return [Spec(kind, a, b, vn) for a, b, vn in sorted(groups, key=lambda g: g[0])]

    def migration_specs(self, rec: LeaseRecord, mapping: dict[int, int], now: float) -> list[Spec]:
        """Rounds of disjoint node pairs, back to back from now, each as long as its largest memory image."""
        moves = {v: (rec.images[v], n) for v, n in sorted(mapping.items()) if rec.images.get(v, n) != n}
        if self.config.migration == "yes-notransfer":
            return []
        specs: list[Spec] = []
        t = now
        while moves:
            busy: set[int] = set()
            batch: dict[int, tuple[int, int]] = {}
            for v, (src, dst) in moves.items():
                if src not in busy and dst not in busy:
                    batch[v] = (src, dst)
                    busy |= {src, dst}
            for v in batch:
                del moves[v]
            largest = max(rec.request.vnodes[v - 1].mem for v in batch)
            length = float(math.ceil(largest * 8 / self.config.migration_bandwidth))
            specs.append(
                Spec(
                    MIGRATE,
                    t,
                    t + length,
                    {v: d for v, (_, d) in batch.items()},
                    {v: s for v, (s, _) in batch.items()},
                )
            )
            t += length
        return specs


def local_groups(
    ops: dict[int, float], mapping: Mapping[int, int], anchor: float, forward: bool, overhead: float
) -> list[tuple[float, float, dict[int, int]]]:
    """Local exclusion: VMs on one node one after another, nodes in parallel; equal windows form one group,
    each group grows by the enactment overhead per VM, and groups are shifted apart so they never overlap."""
    windows: dict[tuple[float, float], dict[int, int]] = {}
    by_node: dict[int, list[int]] = {}
    for v in sorted(ops):
        by_node.setdefault(mapping[v], []).append(v)
    for node, vnodes in by_node.items():
        t = anchor
        for v in vnodes:
            a, b = (t, t + ops[v]) if forward else (t - ops[v], t)
            t = b if forward else a
            windows.setdefault((a, b), {})[v] = node
    groups: list[tuple[float, float, dict[int, int]]] = []
    for (a, b), vn in windows.items():
        extra = overhead * len(vn)
        groups.append((a, b + extra, vn) if forward else (a - extra, b, vn))
    return separate(groups, forward)


def separate(
    groups: list[tuple[float, float, dict[int, int]]], forward: bool
) -> list[tuple[float, float, dict[int, int]]]:
    ordered = sorted(groups, key=lambda g: g[0] if forward else -g[1])
    out: list[tuple[float, float, dict[int, int]]] = []
    for a, b, vn in ordered:
        if out and forward and a < out[-1][1]:
            a, b = a + (out[-1][1] - a), b + (out[-1][1] - a)
        elif out and not forward and b > out[-1][0]:
            a, b = a - (b - out[-1][0]), b - (b - out[-1][0])
        out.append((a, b, vn))
    return out


def global_groups(
    ops: dict[int, float], mapping: Mapping[int, int], anchor: float, forward: bool, overhead: float
) -> list[tuple[float, float, dict[int, int]]]:
    """Global exclusion: every VM of the lease one after another, each taking its time plus the overhead."""
    groups: list[tuple[float, float, dict[int, int]]] = []
    t = anchor
    for v in sorted(ops):
        step = ops[v] + overhead
        a, b = (t, t + step) if forward else (t - step, t)
        t = b if forward else a
        groups.append((a, b, {v: mapping[v]}))
    return groups
