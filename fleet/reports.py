"""Placement reports stored compactly, and read back as one row per node. PURE: no Django.

Every decision's report (the scheduler's, fleet/placement.py's) is stored as columns, one list per field with
one entry per node, plus the few sentences that cannot be rebuilt (an exclusion's own words). The sentence of a
capacity verdict is written when the report is read, from its code and figures, in user units and with node
names: a stored dict per node made a 1,000-node report 381 KiB and most of a decision's time (docs/capacity.md).

A row, as the API and the console show it:
  node, node_id, fit (holds > 0), holds (of this request's VMs), slots (VMs of this size it could take: seed 001's
  free slots; `holds` in reports stored before it was kept), reason_code, reason, rank, chosen,
  headroom, blockers (lease ids in the way), numbers {dimension, need, free, allocatable, window_start, window_end}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

VERSION = 2
IntColumn = Sequence[int] | npt.NDArray[np.int64]
DIMENSIONS = ("cpu", "mem", "disk")
_WORDS = {"cpu": "cores", "mem": "memory", "disk": "disk"}
# The leases in the way a stored verdict names, the lowest ids first.
BLOCKERS_NAMED = 5


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer, as every decision gives it (the scheduler's `explain`, the placer's reports). `need`,
    `free` and `allocatable` are in the short dimension's units (cpu: hundredths of a core; mem: MiB; disk: GiB);
    `note` carries a sentence that cannot be rebuilt from the figures (an exclusion's own words)."""

    node: int
    holds: int
    code: str | None
    dim: str
    need: int
    free: int
    allocatable: int
    rank: int | None
    chosen: bool
    blockers: tuple[int, ...] = ()
    note: str = ""
    slots: int | None = None  # seed 001's free slots for this VM size; None: as `holds`


@dataclass(frozen=True, slots=True)
class Columns:
    """Every node's verdict as one list per field, in node order: what the scheduler's vectorised pass builds and
    what `encode` stores, with no object per node. `dim` indexes DIMENSIONS; `rank` is 0 where none applies.
    `code` and `note` are indexes into `codes` and `texts` (-1: none), so a pass over the fleet sets them with
    array operations and `encode` stores them without a lookup per node. The number columns may be numpy arrays
    (the scheduler's pass hands its arrays over as they are)."""

    node: IntColumn
    holds: IntColumn
    code: IntColumn
    codes: Sequence[str]
    dim: IntColumn
    need: IntColumn
    free: IntColumn
    allocatable: IntColumn
    rank: IntColumn
    chosen: list[int]  # node ids
    blockers: dict[int, tuple[int, ...]]
    note: IntColumn
    texts: Sequence[str]
    # Seed 001's free slots: how many VMs of the asked size each node could take, whatever the request's count
    # (`holds` is bounded by it). None: the same as `holds` (a placer report, or one stored before).
    slots: IntColumn | None = None

    @classmethod
    def of(cls, verdicts: Sequence[Verdict]) -> Columns:
        codes = sorted({v.code for v in verdicts if v.code})
        texts = list(dict.fromkeys(v.note for v in verdicts if v.note))
        code_at = {c: i for i, c in enumerate(codes)}
        text_at = {t: i for i, t in enumerate(texts)}
        return cls(
            node=[v.node for v in verdicts],
            holds=[v.holds for v in verdicts],
            code=[code_at.get(v.code, -1) if v.code else -1 for v in verdicts],
            codes=codes,
            dim=[DIMENSIONS.index(v.dim) for v in verdicts],
            need=[v.need for v in verdicts],
            free=[v.free for v in verdicts],
            allocatable=[v.allocatable for v in verdicts],
            rank=[v.rank or 0 for v in verdicts],
            chosen=[v.node for v in verdicts if v.chosen],
            blockers={v.node: v.blockers for v in verdicts if v.blockers},
            note=[text_at[v.note] if v.note else -1 for v in verdicts],
            texts=texts,
            slots=[_slots_of(v) for v in verdicts],
        )

    def verdicts(self) -> list[Verdict]:
        chosen = set(self.chosen)
        holds, dim, need, free = _plain(self.holds), _plain(self.dim), _plain(self.need), _plain(self.free)
        allocatable, rank = _plain(self.allocatable), _plain(self.rank)
        code, note = _plain(self.code), _plain(self.note)
        slots = _plain(self.slots) if self.slots is not None else holds
        return [
            Verdict(
                node,
                holds[i],
                self.codes[code[i]] if code[i] >= 0 else None,
                DIMENSIONS[dim[i]],
                need[i],
                free[i],
                allocatable[i],
                rank[i] or None,
                node in chosen,
                self.blockers.get(node, ()),
                self.texts[note[i]] if note[i] >= 0 else "",
                slots[i],
            )
            for i, node in enumerate(_plain(self.node))
        ]


def _slots_of(v: Verdict) -> int:
    slots = getattr(v, "slots", None)  # a verdict-like object without one counts as its `holds`
    return v.holds if slots is None else int(slots)


def encode(
    verdicts: Columns | Sequence[Verdict],
    *,
    start: float | None,
    end: float | None,
    summary: str,
    headroom: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """The stored form: columns in node order, codes as indexes into `codes`, the rest sparse. Array operations
    only: no step per node (a 1,000-node report is written in every decision)."""
    cols = verdicts if isinstance(verdicts, Columns) else Columns.of(verdicts)
    holds = np.asarray(cols.holds)
    held = holds > 0
    codes, code = _used(np.asarray(cols.code, dtype=np.int64), cols.codes, sort=True)
    # Codes counted over the nodes that hold none of it (Nomad's "filtered" and "exhausted" counts).
    tally = np.bincount(code[~held & (code >= 0)], minlength=len(codes))
    counts: dict[str, int] = {"evaluated": len(holds), "fit": int(held.sum())}
    counts.update((c, int(n)) for c, n in zip(codes, tally.tolist(), strict=True) if n)
    dim = np.asarray(cols.dim, dtype=np.int64)
    need = np.asarray(cols.need, dtype=np.int64)
    blob: dict[str, Any] = {
        "v": VERSION,
        "start": start,
        "end": end,
        "summary": summary,
        "counts": counts,
        "node": _node_steps(cols.node),
        "holds": _runs(holds),
        "code": _runs(code),
        "codes": codes,
        "dim": _runs(dim),
        "need": _per_dim(dim, need) or need.tolist(),
        "free": _runs(cols.free),
        "alloc": _runs(cols.allocatable),
        "rank": _runs(cols.rank),
        "chosen": cols.chosen,
        "blockers": {str(n): list(b[:BLOCKERS_NAMED]) for n, b in cols.blockers.items() if b},
    }
    if cols.slots is not None:
        blob["slots"] = _runs(cols.slots)
    # Exclusion sentences are few and repeated ("lacks accel.gpu" on most of a fleet): each stored once, in the
    # order they first appear.
    if cols.texts:  # none at all in most reports: nothing to renumber
        texts, note = _used(np.asarray(cols.note, dtype=np.int64), cols.texts, sort=False)
        if texts:
            blob["texts"] = texts
            blob["note"] = _runs(note)
    if headroom is not None:
        blob["headroom"] = list(headroom)
    return blob


def _used(
    index: npt.NDArray[np.int64], table: Sequence[str], *, sort: bool
) -> tuple[list[str], npt.NDArray[np.int64]]:
    """The entries of `table` that `index` uses (by name when `sort`, else in order of first use) and `index`
    renumbered into them; -1 stays -1."""
    given = index[index >= 0]
    if sort:  # counted, not sorted: a table holds a few dozen entries
        names = np.flatnonzero(np.bincount(given, minlength=len(table))).tolist()
        kept = np.array(sorted(names, key=table.__getitem__), dtype=np.int64)
    else:
        used, first = np.unique(given, return_index=True)
        kept = used[np.argsort(first, kind="stable")]
    renumber = np.full(len(table) + 1, -1, dtype=np.int64)  # shifted by one, so -1 reads slot 0
    renumber[kept + 1] = np.arange(len(kept))
    return [table[i] for i in kept.tolist()], renumber[index + 1]


def _per_dim(dim: npt.NDArray[np.int64], need: npt.NDArray[np.int64]) -> dict[str, int] | None:
    """The same VM on every node: one figure per dimension instead of one per node, when they agree."""
    figure = np.zeros(len(DIMENSIONS), dtype=np.int64)
    figure[dim] = need  # some node's figure per dimension; every node's, when they agree
    if not (figure[dim] == need).all():
        return None
    shown = np.flatnonzero(np.bincount(dim, minlength=len(DIMENSIONS))).tolist()
    return {DIMENSIONS[d]: int(figure[d]) for d in shown}


# Columns that may be stored packed: runs of one value (most nodes fit, or share a code, a dimension, no note,
# no rank, the same allocatable figure on a fleet of one size, nothing free on a full one) and steps of
# consecutive node ids. Packing halves a 1,000-node report's JSON, and so the time to write it. `free` and `alloc`
# were plain lists in older reports, which read back as they are; packed, a placed lease's report on a fleet of
# one node size is half as long (its allocatable column was half of it).
_PACKED = ("node", "holds", "code", "dim", "note", "rank", "free", "alloc", "slots")


def _runs(values: IntColumn) -> list[int] | dict[str, list[int]]:
    """`values` as {"runs": [value, count, ...]} when that is shorter, else as a list."""
    a = np.asarray(values)
    starts = _run_starts(a)
    if starts is None:
        return a.tolist()
    return {"runs": _pairs(a[starts], starts, len(a))}


def _steps(values: IntColumn) -> list[int] | dict[str, list[int]]:
    """Ascending ids as {"steps": [first, count, ...]}, one pair per run of consecutive ids, when shorter."""
    a = np.asarray(values)
    starts = _run_starts(a - np.arange(len(a)))  # constant along a run of consecutive ids
    if starts is None:
        return a.tolist()
    return {"steps": _pairs(a[starts], starts, len(a))}


# The last node column packed, with its packing: every report of a planning pass lists the same fleet, as the
# same read-only column (the slot table's). One tuple, swapped whole, so threads never see half of one.
_last_steps: tuple[Any, Any] = (None, None)


def _node_steps(values: IntColumn) -> list[int] | dict[str, list[int]]:
    """`_steps` of a report's node column, kept for the last read-only column packed; a copy each time."""
    global _last_steps
    if not (isinstance(values, np.ndarray) and not values.flags.writeable):
        return _steps(values)
    kept, packed = _last_steps
    if kept is not values:
        packed = _steps(values)
        _last_steps = (values, packed)
    return {"steps": list(packed["steps"])} if isinstance(packed, dict) else list(packed)


def _run_starts(a: npt.NDArray[np.int64]) -> npt.NDArray[np.intp] | None:
    """Where each run of equal values in `a` starts, or None when storing runs would not be shorter. Few array
    calls: a report packs six columns in every decision."""
    if not len(a):
        return None
    changes = np.flatnonzero(a[1:] != a[:-1])
    if 2 * (len(changes) + 1) >= len(a):
        return None
    starts = np.empty(len(changes) + 1, dtype=np.intp)
    starts[0] = 0
    np.add(changes, 1, out=starts[1:])
    return starts


def _pairs(firsts: npt.NDArray[np.int64], starts: npt.NDArray[np.intp], size: int) -> list[int]:
    """[first value, run length, ...] for runs starting at `starts` in a column of `size`."""
    out = np.empty(2 * len(starts), dtype=np.int64)
    out[0::2] = firsts
    out[1:-1:2] = starts[1:] - starts[:-1]
    out[-1] = size - starts[-1]
    return out.tolist()


def _plain(values: IntColumn) -> list[int]:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _unpacked(stored: Any) -> Any:
    if isinstance(stored, dict) and "runs" in stored:
        r = stored["runs"]
        return [v for i in range(0, len(r), 2) for v in [r[i]] * r[i + 1]]
    if isinstance(stored, dict) and "steps" in stored:
        r = stored["steps"]
        return [v for i in range(0, len(r), 2) for v in range(r[i], r[i] + r[i + 1])]
    return stored


class Rows(list):
    """The rows `decode` wrote from a compact report: each one a dict of exactly the row fields above, in JSON
    types, so an answer may carry the list as it is (fleet/api/serializers.py `VerdictRows`) without looking at
    each row's keys."""

    __slots__ = ()


def is_compact(stored: Any) -> bool:
    return isinstance(stored, dict) and stored.get("v") == VERSION


def node_ids(stored: Any) -> list[int]:
    if is_compact(stored):
        return _unpacked(stored["node"])
    return [v["node_id"] for v in stored or () if v.get("node_id") is not None]


def decode(
    stored: Any, names: Mapping[int, str], when: Callable[[float], str] = lambda t: _iso(t)
) -> Rows | list[dict[str, Any]]:
    """One dict per node in rank order (chosen first, then fit by rank, then the rest by name). A list stored
    before reports were compact is returned as it is.

    Column by column rather than field by field per node, and each distinct sentence written once: most of a
    fleet's refusals repeat a few (code, figures) pairs, and a 1,000-node report is decoded on every preview."""
    if not is_compact(stored):
        return list(stored or ())
    b = {k: _unpacked(v) if k in _PACKED else v for k, v in stored.items()}
    start, end = b["start"], b["end"]
    window = (when(start), when(end)) if start is not None and end is not None else (None, None)
    nodes: list[int] = b["node"]
    n = len(nodes)
    chosen = set(b["chosen"])
    dims = [DIMENSIONS[d] for d in b["dim"]]
    need = b["need"]
    wanted = [need[d] for d in dims] if isinstance(need, dict) else need
    codes = b["codes"]
    code = [codes[c] if c >= 0 else None for c in b["code"]]
    free, alloc = b["free"], b["alloc"]
    blockers = b["blockers"]
    headroom = b.get("headroom") or [None] * n
    slots = b.get("slots") or b["holds"]
    # An exclusion's own sentence: an index into `texts`, or (reports stored before that) by node id in `notes`.
    by_node = b.get("notes", {})
    index = b["note"] if "note" in b else [-1] * n
    texts = b.get("texts", ())
    notes = [
        texts[k] if k >= 0 else by_node.get(str(node)) if by_node else None
        for k, node in zip(index, nodes, strict=True)
    ]
    said: dict[tuple, str] = {}
    # Figures in user units, each distinct figure converted once: a fleet repeats a few (the same allocatable on
    # every node of a size, nothing free on full ones), and `round` was a quarter of decoding a report.
    cores: dict[int, float] = {}
    cpu = [dim == "cpu" for dim in dims]
    need_u = _in_user_units(wanted, cpu, cores)
    free_u = _in_user_units(free, cpu, cores)
    alloc_u = _in_user_units(alloc, cpu, cores)
    rows = []
    for node, dim, want, c, held, fr, al, rank, note, room, want_u, fr_u, al_u, slot in zip(
        nodes, dims, wanted, code, b["holds"], free, alloc, b["rank"], notes, headroom, need_u, free_u, alloc_u,
        slots, strict=True,
    ):  # fmt: skip
        blocked = blockers.get(str(node), []) if blockers else []
        reason = note
        if not reason and c:
            key = (c, dim, want, fr, al, *blocked)
            reason = said.get(key)
            if reason is None:
                reason = said[key] = sentence(c, dim, want, fr, al, blocked, window)
        rows.append(
            {
                "node": name if (name := names.get(node)) is not None else f"node {node}",
                "node_id": node,
                "fit": held > 0,
                "holds": held,
                "slots": slot,
                "reason_code": c,
                "reason": reason or None,
                "rank": rank or None,
                "chosen": node in chosen,
                "headroom": room,
                "blockers": blocked,
                "numbers": {
                    "dimension": dim,
                    "need": want_u,
                    "free": fr_u,
                    "allocatable": al_u if al >= 0 else None,
                    "window_start": window[0],
                    "window_end": window[1],
                },
            }
        )
    return _in_rank_order(rows, nodes, b["holds"], b["rank"], chosen)


def _in_user_units(figures: list[int], cpu: list[bool], cores: dict[int, float]) -> Sequence[float | int]:
    """`figures` as a reader sees them: cores (hundredths / 100, to two decimals) where `cpu`, else as they are.
    `cores` keeps each conversion for the next column."""
    if any(cpu):
        for f in set(figures).difference(cores):
            cores[f] = round(f / 100, 2)
        return [cores[f] if is_cpu else f for f, is_cpu in zip(figures, cpu, strict=True)]
    return figures


def _in_rank_order(
    rows: list[dict[str, Any]], nodes: list[int], holds: list[int], ranks: list[int], chosen: set[int]
) -> Rows:
    """`rows` (one per entry of the columns given) chosen first, then fit by rank, then the rest, each group by
    name: two stable sorts whose keys are read from lists, one by name and then one by an integer that says the
    group and the rank, with no key tuple built and no Python call per row."""
    fit, unfit = _UNCHOSEN, _UNCHOSEN + _UNFIT
    tier = [(fit if h > 0 else unfit) + (r or _NO_RANK) for h, r in zip(holds, ranks, strict=True)]
    if chosen:
        for i, node in enumerate(nodes):
            if node in chosen:
                tier[i] -= _UNCHOSEN
    by_name = sorted(range(len(rows)), key=[row["node"] for row in rows].__getitem__)
    by_name.sort(key=tier.__getitem__)
    return Rows([rows[i] for i in by_name])


# The rank order's integer key: a row's rank (a number of nodes), plus these when it is not chosen, not fit.
_NO_RANK = 1 << 30
_UNFIT = 1 << 40
_UNCHOSEN = 1 << 41


def sentence(
    code: str, dim: str, need: int, free: int, allocatable: int, blockers: Iterable[int], window: tuple
) -> str:
    """One sentence in user units for a capacity verdict."""
    what = _WORDS[dim]
    of_what = "" if dim == "cpu" else f" of {what}"  # "2 cores free", not "2 cores of cores free"
    one = f"one VM needs {_text(dim, need)}"
    if code == "too_small":
        return f"allocates at most {_text(dim, allocatable)}{of_what} even when empty; {one}"
    if code == "no_disk":
        return f"{_text(dim, max(free, 0))} of disk free of {_text(dim, allocatable)} allocatable; {one}"
    if code == "at_capacity":
        return f"{_text(dim, max(free, 0))}{of_what} free now of {_text(dim, allocatable)} allocatable; {one}"
    if code == "reserved":
        who = ", ".join(str(b) for b in blockers)
        held = f"; held by lease{'s' if ',' in who else ''} {who}" if who else ""
        span = f" over {window[0]}–{window[1]}" if window[0] else ""
        return f"{_text(dim, max(free, 0))}{of_what} free{span} of {_text(dim, allocatable)} allocatable; {one}{held}"
    if code == "anti_affinity":
        return "the lease's group allows no more of its VMs on this node"
    return code.replace("_", " ")


def summary(
    vm: Mapping[str, int],
    count: int,
    holds: Mapping[str, int],
    *,
    now: bool,
    window: str = "",
    largest: tuple[str, int] | None = None,
    total: int | None = None,
) -> str:
    """ "needs 3 × (1 core, 4 GiB); the fleet holds 2 now: n1 1, n2 1", what would make it fit. `largest`: the node
    with the most allocatable memory and that figure, named when the VM is larger than any node. `holds` may be
    only the top few nodes when `total` gives the whole fleet's figure."""
    size = ", ".join(_text(d, vm[d]) for d in DIMENSIONS if vm.get(d))
    total = sum(holds.values()) if total is None else total
    when = "now" if now else f"over {window}" if window else "in its window"
    # Stable: `holds` comes in the caller's order.
    top = [kv for kv in sorted(holds.items(), key=lambda kv: -kv[1])[:5] if kv[1]]
    listed = ", ".join(f"{name} {n}" for name, n in top)
    rest = total - sum(n for _, n in top)
    # The list is the top five: it says what it leaves out, so that it does not read as the whole.
    if listed and rest > 0:
        if sum(holds.values()) == total:  # every node's figure is here
            others = sum(1 for n in holds.values() if n) - len(top)
            listed += f" and {rest} more on {others} other node{'' if others == 1 else 's'}"
        else:
            listed += f" and {rest} more on other nodes"
    line = f"needs {count} × ({size}); the fleet holds {total} {when}" + (f": {listed}" if listed else "")
    if not total and largest is not None and vm.get("mem", 0) > largest[1]:
        line += f"; the largest, {largest[0]}, allocates at most {_text('mem', largest[1])}"
    return line


def _user(dim: str, value: int) -> float | int:
    return round(value / 100, 2) if dim == "cpu" else value


def _text(dim: str, value: int) -> str:
    if dim == "cpu":
        cores = value / 100
        return f"{cores:g} core{'' if cores == 1 else 's'}"
    if dim == "mem":
        if value >= 1024 and value % 1024 == 0:
            return f"{value // 1024} GiB"
        return f"{value:,} MiB"
    return f"{value:,} GiB"


def amount(dim: str, value: int) -> str:
    """A figure in a person's units: "2 cores", "8 GiB", "40,000 MiB", "500 GiB" (cpu in hundredths of a core)."""
    return _text(dim, value)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
