"""The one answer to "can this run, where, and if not why" (docs/placer.md): `decide` plans a request exactly as its
submission would, and writes nothing; `hopeless` says when no node could ever take it. The what-if preview, a
submission, a reschedule's dry run and its approval all ask here, so they cannot drift apart again.

The outcome of a request that does not fit is named from the facts of the capable nodes alone (seed 001): a node
that lacks a capability, or is too small for the VM even when empty, says nothing about whether the capable ones
are full or blind (fleet/capacity.py `unplaced_outcome`).

PURE: no Django.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from fleet.capacity import unplaced_outcome
from fleet.reports import amount
from leases.lifecycle import LeaseState
from leases.scheduling.explain import MISSING, Explaining
from leases.scheduling.mapper import packs
from leases.scheduling.records import (
    ADVANCE_RESERVATION,
    BEST_EFFORT,
    IMMEDIATE,
    NO_CAPABLE_NODE,
    PLACED,
    REFUSED,
    LeaseRecord,
    LeaseRequest,
    Plan,
    Trial,
)
from leases.slots.arrays import DIMS, NodeArrays
from leases.slots.values import unvec, vec
from leases.slottable import Res

_DIM_NAMES = ("cpu", "mem", "disk")
# Room that frees later is held for a lost VM only if it holds at least this long, and at least half of what is
# left of its lease: a hold for the last seconds of a lease is no recovery.
MIN_HELD_S = 60.0
# Counter-offers: how many windows are offered, and how many candidate starts (the asked one, then each instant at
# which some plan ends) are tried at most, so that a 409 stays fast on a busy fleet (bench/bench_counter_offers.py).
OFFERS = 3
OFFER_TRIES = 40
BLOCKING_MAX = 20
_OF = ("", " memory", " disk")
# What a refusal for want of room says of each outcome (seed 001's words: an operator must not hunt a load problem
# that is really a dead agent).
_UNPLACED = {
    "fleet_at_capacity": "fleet at capacity: every capable node is full or booked over that window",
    "fleet_unreadable": (
        "fleet unreadable: no capable node's capacity can be read (offline, silent or unreadable); this is NOT a "
        "full fleet, check the node agents"
    ),
}


class Deciding(Explaining):
    def decide(self, req: LeaseRequest, now: float, excluded: Mapping[int, str] | None = None) -> Trial:
        """What a submission of `req` at `now` would get, with nothing written: an advance reservation its exact
        window (preempting best-effort leases where the policy allows: `preempt`), an immediate lease the whole
        duration from now, else the outcome that says why not. `req.id` must be no lease's (the preview's -1).

        The caller brings the scheduler to `now` first: a pass has run its events (`catch_up`); a read of the
        cached scheduler asks only when no event is due (`due`), when catching up would change nothing."""
        if req.id in self.leases:
            raise ValueError(f"lease {req.id} exists: a dry run takes an id no lease has")
        self.use_exclusions(excluded)
        self._now = max(self._now, now)
        try:
            return self._trial(req, now)
        finally:
            self._forget_probe(req.id)

    def find_room(
        self, req: LeaseRequest, after: float, now: float, excluded: Mapping[int, str] | None = None
    ) -> tuple[float, int, list[int]] | None:
        """Where room for `req` (one lost VM, over the rest of its lease's window) can be held, and from when:
        (start, node, leases that must make way) or None. Now if it fits now (`decide`); else the earliest later
        instant at which someone's plan ends, from which the whole rest of the window fits, counting as free the
        future reservations of best-effort leases submitted after `after` (the lost VM's lease's submission):
        those listed make way (`make_way`) and are planned again after it; a later start only while it leaves at
        least half the rest of the window (MIN_HELD_S at least). Nothing is changed here."""
        trial = self.decide(req, now, excluded)
        if trial.placed:
            return now, trial.nodes[0], []
        newer = self.newer_in_future(after)
        table = self._without(newer, now) if newer else self.table
        end = now + req.duration
        points = sorted({now, *(p for p in self._future_points(now) if p < end)} if newer else
                        {p for p in self._future_points(now) if p < end})  # fmt: skip
        try:
            for start in points:
                if start > now and end - start < max(MIN_HELD_S, 0.5 * (end - now)):
                    break  # room that frees this late holds too little of what is left to be worth keeping
                found = self._map(table, req, start, end, True, None)
                if found is None:
                    continue
                node = next(iter(found[0].values()))
                in_way = [lid for lid in newer if self._holds_on(lid, node, start, end)]
                return start, node, in_way
        finally:
            self._forget_probe(req.id)
        return None

    def alternatives(
        self, req: LeaseRequest, now: float, excluded: Mapping[int, str] | None = None
    ) -> list[Trial]:
        """Counter-offers for an advance reservation that does not fit its window: up to OFFERS earliest windows of
        the same duration, at or after the asked start, in which the whole lease would be placed now without
        preempting anyone, each decided by the step its submission takes (`decide`), so resubmitting one gets it
        while the fleet stays as it is. Each offer starts at or after the previous one's end (three choices, not
        one window a second apart). Nothing is changed here.

        The search is bounded for a busy fleet: a candidate start is decided only over the nodes free for the
        whole window (a node that cannot hold the smallest VM then cannot hold any), and only when there are
        enough of them; otherwise it jumps to the first instant at which enough nodes are each free for the whole
        window (`SlotTable.earliest_fits`, every node's at once, asked again only when the start passes one).
        OFFER_TRIES candidates at most."""
        if req.type != ADVANCE_RESERVATION or req.start is None:
            return []
        shape = _smallest(req)
        span = req.duration + self.timing.shutdown_time(req)
        usable = self._usable_for(req)
        nodes = sorted(self.table.nodes if usable is None else usable)
        most = max((self._copies_empty(n, shape) for n in nodes), default=0)
        if most <= 0:
            return []
        wanted = -(-len(req.vnodes) // most)
        # Each node's earliest start of a window it is free for (for the smallest VM), from the candidate on; a
        # node's stays right until the candidate passes it, so they are asked again only then.
        start, offers = max(req.start, now), []
        usable_set = set(nodes)
        earliest: dict[int, float] | None = None
        try:
            for _ in range(OFFER_TRIES):
                if earliest is None or min(earliest.values(), default=math.inf) < start:
                    fits = self.table.earliest_fits(shape, span, start)
                    earliest = {n: t for n, t in fits.items() if n in usable_set}
                free = [n for n, t in earliest.items() if t == start]
                trial = None
                if len(free) >= wanted:
                    busy = {n: "busy: not free over the window" for n in set(nodes).difference(free)}
                    trial = self.decide(replace(req, start=start), now, {**(excluded or {}), **busy})
                if trial is not None and trial.placed:
                    offers.append(trial)
                    if len(offers) == OFFERS:
                        break
                    # The next offer is another choice, not the same window a moment later: from this one's end.
                    start = start + req.duration
                    continue
                # The next start: when enough nodes are each free for the whole window, and the free set differs.
                if len(earliest) < wanted:
                    break
                enough = heapq.nsmallest(wanted, earliest.values())[-1]
                later = [t for t in earliest.values() if t > start]
                if not later:
                    break  # no node frees up later: nothing fits later than it does now
                start = max(enough, min(later))
        finally:
            self.use_exclusions(excluded)
        return offers

    def _copies_empty(self, node: int, vm: Res) -> int:
        counts = [int(c // v) for c, v in zip(vec(self._capacity[node]), vec(vm), strict=True) if v > 0]
        return min(counts) if counts else 1 << 20

    def blocking(self, req: LeaseRequest, start: float, end: float) -> list[int]:
        """The leases whose reservations stand in [start, end) on a node that could take `req`'s VMs, and that the
        request may not move: every one but the preemptible best-effort leases an advance reservation may preempt
        (held room for a reschedule counts, under its lease). Largest share of the window first, at most
        BLOCKING_MAX."""
        usable = self._usable_for(req)
        movable = set(self._candidates(req, start, end)) if self.config.preempts else set()
        taken: dict[int, float] = {}
        for r in self.table.reservations(start=start, end=end):
            if r.lease_id == req.id or r.lease_id in movable:
                continue
            if usable is not None and usable.isdisjoint(r.alloc):
                continue
            overlap = min(r.end, end) - max(r.start, start)
            taken[r.lease_id] = taken.get(r.lease_id, 0.0) + overlap
        ranked = sorted(taken, key=lambda lid: (-taken[lid], lid))
        return ranked[:BLOCKING_MAX]

    def _holds_on(self, lease_id: int, node: int, start: float, end: float) -> bool:
        return any(
            node in r.nodes.values() and r.start < end and r.end > start
            for r in self.leases[lease_id].chain()
        )

    def due(self, now: float) -> bool:
        """Whether an event (a reservation's start or end, an early end) falls at or before `now` unprocessed: a
        dry run on this scheduler would then see a slot table a submission would not."""
        at = self.next_event_time()
        return at is not None and at <= now

    def catch_up(self, now: float) -> None:
        """Runs the events due by `now`, as a submission does before it plans (a pass's dry run)."""
        self._now = max(self._now, now)
        self._run_events(now)

    def hopeless(self, req: LeaseRequest) -> str:
        """Why no node could ever take `req` (no_capable_node), or "": no node has every capability it asks for,
        one of its VMs is larger than every node that has them, even empty, or its VMs do not fit together on
        all of those nodes, empty."""
        arr = self.table.arrays()
        lacking = self._lacking(req, arr.pos) if req.barred else set()
        if not lacking and self.table.nodes and self._packs(req.vnodes):
            return ""  # most requests: they fit the whole fleet, empty, and every node has what they ask for
        has_caps = np.ones(len(arr.nodes), dtype=bool)
        if lacking:
            has_caps[[arr.pos[n] for n in lacking]] = False
        if not has_caps.any():
            return self._missing_message(req)
        shapes = dict.fromkeys(req.vnodes)
        for vm in shapes:
            fits = _fits_empty(arr.caps, vm) & has_caps
            if not fits.any():
                return self._too_small_message(req, vm, arr, has_caps)
        capable = tuple(self._capacity[int(n)] for n in arr.nodes[has_caps].tolist())
        if len(req.vnodes) > 1 and not packs(req.vnodes, capable):
            return (
                f"no capable node: {len(req.vnodes)} VMs of this size do not fit together even on every node "
                f"that has what they need ({int(has_caps.sum())} of them), empty; ask for fewer or smaller VMs"
            )
        return ""

    def unplaced(self, req: LeaseRequest) -> str:
        """fleet_unreadable or fleet_at_capacity, for a request that is not hopeless and did not fit: from the
        capable nodes' own reasons (blind or not), never from the others'."""
        arr = self.table.arrays()
        lacking = self._lacking(req, arr.pos)
        barred = {n for n, _ in req.barred}
        codes: list[str | None] = []
        for node in arr.nodes.tolist():
            if node in lacking or not any(_fits_empty_one(self._capacity[node], vm) for vm in req.vnodes):
                continue
            why = self._excluded.get(node)
            if why is not None:
                codes.append(why.partition(":")[0])
            elif node in barred:
                codes.append("group")
            else:
                codes.append(None)
        return str(unplaced_outcome(codes))

    def _trial(self, req: LeaseRequest, now: float) -> Trial:
        start = req.start if req.type == ADVANCE_RESERVATION and req.start is not None else now
        end = start + req.duration
        code, refusal = self._admission_refusal(req, now)
        if refusal:
            return Trial(code or REFUSED, start, end, message=refusal)
        rec = LeaseRecord(request=req, state=LeaseState.PENDING)
        if req.type == BEST_EFFORT:
            # A best-effort lease starts now only if the queue ahead of it leaves room; what the dry run answers
            # is whether it could start now on the fleet as it stands (an immediate lease's question).
            rec = LeaseRecord(request=_as_immediate(req), state=LeaseState.PENDING)
        plan = self.plan_fixed(rec, now)
        if plan is None:
            outcome = self.unplaced(req)
            return Trial(outcome, start, end, message=self._rejection(req, start, end, outcome))
        vm = plan.specs[0] if plan.specs else None
        mapping = dict(vm.nodes) if vm is not None else {}
        window = (vm.start, vm.end) if vm is not None else (start, end)
        return Trial(PLACED, window[0], window[1], mapping, tuple(plan.preempt))

    def plan_fixed(self, rec: LeaseRecord, now: float) -> Plan | None:
        """The plan a submission commits for an advance reservation or an immediate lease, or None: the one
        planning step `submit` and `decide` share."""
        if rec.request.type == ADVANCE_RESERVATION:
            return self._plan_exact(rec, now)
        return self._plan_asap(rec, now, allow_future=False)

    def _admission_refusal(self, req: LeaseRequest, now: float) -> tuple[str, str]:
        """(code, why) when the request is refused whatever the fleet's load, else ("", ""): the code is
        no_capable_node when no node could ever take it (`hopeless`), of any type, so that it is never queued."""
        if req.type not in (BEST_EFFORT, ADVANCE_RESERVATION, IMMEDIATE):
            return "", f"lease type {req.type} is not supported (best_effort, advance_reservation, immediate)"
        if not req.vnodes or req.duration <= 0:
            return "", "a lease needs at least one vnode and a positive duration"
        hopeless = self.hopeless(req)
        if hopeless:
            return NO_CAPABLE_NODE, hopeless
        return "", self._window_refusal(req, now)

    def _window_refusal(self, req: LeaseRequest, now: float) -> str:
        if req.type == ADVANCE_RESERVATION and self.config.policy_admission == "no-ARs":
            return "advance reservations are not admitted (policy-admission = no-ARs)"
        if req.type == ADVANCE_RESERVATION:
            # "In the past" is judged at the request's arrival (`submit`), not at the pass that plans it: group
            # commit plans every waiting request at the pass's one `now`, and a start that was ahead when the
            # request arrived may have passed by then. Such a late AR gets the rest of its window (see
            # `_ar_window`); only one whose whole window has passed is refused for lateness.
            if req.start is None or req.start < req.submit:
                when = "no start" if req.start is None else f"{self.label(req.start)} is in the past"
                return f"an advance reservation must start at or after the time it is requested ({when})"
            if req.start + req.duration <= now:
                window = f"{self.label(req.start)}–{self.label(req.start + req.duration)}"
                return f"advance reservation rejected: its whole window {window} passed before it could be planned"
        return ""

    def _rejection(self, req: LeaseRequest, start: float, end: float, outcome: str) -> str:
        what = "advance reservation" if req.type == ADVANCE_RESERVATION else "immediate lease"
        window = f"{self.label(start)}–{self.label(end)}"
        why = _UNPLACED.get(outcome, "")
        return f"{what} rejected: no room for {len(req.vnodes)} vnode(s) over {window}" + (
            f"; {why}" if why else ""
        )

    def _lacking(self, req: LeaseRequest, pos: Mapping[int, int]) -> set[int]:
        """The nodes that lack one of the request's capabilities (its barred nodes with that code)."""
        return {n for n, why in req.barred if n in pos and why.partition(":")[0] == MISSING}

    def _missing_message(self, req: LeaseRequest) -> str:
        if not self.table.nodes:
            return "no capable node: the fleet has no nodes; start an agent to register one"
        wanted = ", ".join(sorted(req.capabilities)) or "the capabilities it asks for"
        # The node that lacks the least (the shortest "lacks ..." sentence), the lowest id among equals.
        said = sorted(
            (len(text), n, text)
            for n, why in req.barred
            if why.partition(":")[0] == MISSING and (text := why.partition(": ")[2])
        )
        tail = f"; the closest, {self.node_label(said[0][1])}, {said[0][2]}" if said else ""
        return (
            f"no capable node: no node has every capability this request needs ({wanted}). A VM runs on ONE "
            f"node, so one node must hold all of them{tail}. Add the capabilities to a node or drop them from "
            f"the request; it is not queued, since waiting will not make them appear."
        )

    def _too_small_message(
        self, req: LeaseRequest, vm: Res, arr: NodeArrays, has_caps: npt.NDArray[np.bool_]
    ) -> str:
        rows = np.flatnonzero(has_caps)
        # The largest capable node by memory, the lowest id among equals.
        best = rows[np.lexsort((arr.nodes[rows], -arr.caps[rows, 1]))[0]]
        node = int(arr.nodes[best])
        need = vec(vm)[:DIMS]
        have = arr.caps[best].tolist()
        short = [d for d in (2, 1, 0) if need[d] > have[d]] or [1]
        offers = ", ".join(f"{amount(_DIM_NAMES[d], have[d])}{_OF[d]}" for d in (1, 2, 0))
        asks = ", ".join(amount(_DIM_NAMES[d], need[d]) for d in (1, 2, 0) if need[d])
        which = " and ".join(_DIM_NAMES[d].replace("mem", "memory").replace("cpu", "cores") for d in short)
        what = f" with {', '.join(sorted(req.capabilities))}" if req.capabilities else ""
        return (
            f"no capable node: a VM of ({asks}) is larger than any node{what} can hold even when empty "
            f"({which}); the largest, {self.node_label(node)}, allocates at most {offers}. Shrink the VM or add "
            f"a larger node; it is not queued, since waiting will not make room."
        )

    def _forget_probe(self, lease_id: int) -> None:
        for memo in (self._orders, self._smallest, self._barred):
            memo.pop(lease_id, None)
        self.timing.forget(lease_id)


def _smallest(req: LeaseRequest) -> Res:
    """The least of every resource any of its VMs asks: a node that cannot hold it cannot hold any of them."""
    return unvec(tuple(min(column) for column in zip(*(vec(vm) for vm in req.vnodes), strict=True)))


def _as_immediate(req: LeaseRequest) -> LeaseRequest:
    return replace(req, type=IMMEDIATE, start=None)


def _fits_empty(caps: npt.NDArray[np.int64], vm: Res) -> npt.NDArray[np.bool_]:
    need = np.array(vec(vm)[:DIMS], dtype=np.int64)
    return np.asarray((caps >= need).all(axis=1), dtype=bool)


def _fits_empty_one(cap: Res, vm: Res) -> bool:
    return vm.cpu <= cap.cpu and vm.mem <= cap.mem and vm.disk <= cap.disk
