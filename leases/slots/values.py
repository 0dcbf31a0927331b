"""Resource tuples (`Res`), reservations (`Reservation`, half-open `[start, end)`), the overcommit error, and the
five-component vectors the slot table computes with.

PURE: no Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

Vec = tuple[int, int, int, int, int]
ZERO_VEC: Vec = (0, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Res:
    """A resource tuple: cpu in percent of one core, mem in MiB, disk in GiB, net_in / net_out in Mbit/s."""

    cpu: int = 0
    mem: int = 0
    disk: int = 0
    net_in: int = 0
    net_out: int = 0

    ZERO: ClassVar[Res]

    def __add__(self, o: Res) -> Res:
        return Res(
            self.cpu + o.cpu,
            self.mem + o.mem,
            self.disk + o.disk,
            self.net_in + o.net_in,
            self.net_out + o.net_out,
        )

    def __sub__(self, o: Res) -> Res:
        return Res(
            self.cpu - o.cpu,
            self.mem - o.mem,
            self.disk - o.disk,
            self.net_in - o.net_in,
            self.net_out - o.net_out,
        )

    def fits_in(self, capacity: Res) -> bool:
        return (
            self.cpu <= capacity.cpu
            and self.mem <= capacity.mem
            and self.disk <= capacity.disk
            and self.net_in <= capacity.net_in
            and self.net_out <= capacity.net_out
        )

    def scaled(self, k: int) -> Res:
        return Res(self.cpu * k, self.mem * k, self.disk * k, self.net_in * k, self.net_out * k)


Res.ZERO = Res()


def vec(r: Res) -> Vec:
    return (r.cpu, r.mem, r.disk, r.net_in, r.net_out)


def unvec(v: Vec) -> Res:
    return Res(*v)


def vec_minus(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3], a[4] - b[4])


def vec_plus(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def vec_lowest(a: Vec, b: Vec) -> Vec:
    return (min(a[0], b[0]), min(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]), min(a[4], b[4]))


@dataclass(frozen=True, slots=True)
class Reservation:
    """One row of the slot table: a lease's use of some nodes over the half-open interval [start, end)."""

    rid: int
    lease_id: int
    kind: str
    start: float
    end: float
    alloc: Mapping[int, Res] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.end >= self.start:
            raise ValueError(f"reservation {self.rid} ends ({self.end}) before it starts ({self.start})")
        # Copy the mapping: a caller mutating its own dict after `add` would otherwise change what `remove`
        # subtracts, and the node's step function would drift away from its reservations for good.
        object.__setattr__(self, "alloc", dict(self.alloc))

    def overlaps(self, start: float, end: float) -> bool:
        """Shares an instant with [start, end); a zero-length window [t, t) asks "is it running at t"."""
        if start == end:
            return self.start <= start < self.end
        if self.start == self.end:
            return start <= self.start < end
        return self.start < end and self.end > start


class Overcommit(Exception):
    """Adding a reservation would use more than a node's capacity at some instant."""

    def __init__(self, node: int, instant: float, need: Res, available: Res) -> None:
        super().__init__(f"node {node} at t={instant}: needs {need}, only {available} available")
        self.node = node
        self.instant = instant
        self.need = need
        self.available = available


@lru_cache(maxsize=1024)
def nonzero_dims(use: Vec) -> tuple[int, ...]:
    """The dimensions a use vector writes to."""
    return tuple(d for d in range(5) if use[d])


@lru_cache(maxsize=256)
def unit_wants(unit: Res) -> tuple[tuple[int, int], ...]:
    """(dimension, amount) for every resource the unit asks for."""
    return tuple((d, a) for d, a in enumerate(vec(unit)) if a > 0)


@lru_cache(maxsize=4096)  # few distinct (capacity, need) pairs, asked for every node of every mapping
def room_limit(capacity: Vec, need: Res) -> tuple[Vec, tuple[int, ...]] | None:
    """The highest usage level that still leaves room for `need`, and the dimensions worth checking.

    Only dimensions where the need is positive can block it, because `add` never lets a level exceed capacity;
    checking two of five components is what keeps the segment walks fast. None when the need exceeds the
    capacity outright, so callers answer "never" without walking anything.
    """
    nv = vec(need)
    lim = (
        capacity[0] - nv[0],
        capacity[1] - nv[1],
        capacity[2] - nv[2],
        capacity[3] - nv[3],
        capacity[4] - nv[4],
    )
    dims = tuple(d for d in range(5) if nv[d] > 0)
    if any(lim[d] < 0 for d in dims):
        return None
    return lim, dims
