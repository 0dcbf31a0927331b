"""The slot table's drawing arithmetic, with no Django: which lane each bar of a node's row takes when bars overlap,
axis ticks on round times, and the level of detail that folds bars too thin to see into a utilisation strip.

Everything here works in the chart's own units (viewBox pixels along x) and plain datetimes, so it is tested and
type-checked without a database; leases/slotchart.py turns rows of the database into these spans and back into
SVG."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

# Tick steps, seconds: the first that leaves `min_gap` pixels between two labels is used. Each divides a day or is a
# whole number of days, so ticks land on round wall-clock times (UTC).
TICK_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


def assign_lanes(spans: Sequence[tuple[float, float]]) -> tuple[list[int], int]:
    """The lane of each span (x0, x1), spans in order of x0, and how many lanes the row needs: each span takes the
    lowest lane whose last span ended at or before it starts (greedy interval colouring, optimal for intervals), so a
    row with no overlap keeps one lane and two overlapping bars never share one."""
    ends: list[float] = []
    lanes: list[int] = []
    for x0, x1 in spans:
        for i, end in enumerate(ends):
            if end <= x0 + 1e-6:
                ends[i] = x1
                lanes.append(i)
                break
        else:
            ends.append(x1)
            lanes.append(len(ends) - 1)
    return lanes, len(ends)


@dataclass(frozen=True)
class Stack:
    """A row's bars in lanes: the lane of each span, or None for a span not drawn (it waits behind the row's
    "+N more"); how many lanes are drawn; how many spans are not."""

    lanes: list[int | None]
    count: int
    hidden: int


def stack_lanes(
    spans: Sequence[tuple[float, float]], finished: Sequence[bool], max_lanes: int | None
) -> Stack:
    """Lanes for one row whose finished reservations (done, cancelled) may not widen it. Spans in order of x0.

    The live spans take lanes first (`assign_lanes`); a finished span then takes the lowest of those lanes where it
    overlaps nothing, and never a lane of its own: in the demo, reservations superseded by a re-plan (cancelled
    before they started) and ones that had run were a third of the bars and gave rows of 10 to 18 lanes. At most
    `max_lanes` lanes are drawn; what does not fit is hidden and counted. `max_lanes=None` is an expanded row: every
    live lane, and the finished spans with no room in them stack below, so everything is drawn. A row of no span
    has no lane (its height is the row's least, as before); a row whose spans overlap nowhere, most rows, one."""
    if disjoint(spans):
        return Stack([0] * len(spans), 1 if spans else 0, 0)
    live = [i for i, done in enumerate(finished) if not done]
    live_lanes, live_count = assign_lanes([spans[i] for i in live])
    drawn = max(1, live_count if max_lanes is None else min(live_count, max_lanes))
    out: list[int | None] = [None] * len(spans)
    # Each lane's spans as sorted starts and their ends, for the finished spans' fit test.
    starts: list[list[float]] = [[] for _ in range(drawn)]
    ends: list[list[float]] = [[] for _ in range(drawn)]
    for i, lane in zip(live, live_lanes, strict=True):
        if lane < drawn:
            out[i] = lane
            starts[lane].append(spans[i][0])
            ends[lane].append(spans[i][1])
    for i, done in enumerate(finished):
        if not done:
            continue
        x0, x1 = spans[i]
        for lane in range(len(starts)):
            if _free(starts[lane], ends[lane], x0, x1):
                _insert(starts[lane], ends[lane], x0, x1)
                out[i] = lane
                break
        else:
            if max_lanes is None:  # expanded: a lane below the live ones
                starts.append([x0])
                ends.append([x1])
                out[i] = len(starts) - 1
    hidden = sum(1 for lane in out if lane is None)
    return Stack(out, max((lane for lane in out if lane is not None), default=-1) + 1, hidden)


def disjoint(spans: Sequence[tuple[float, float]]) -> bool:
    """Whether no two spans (in order of x0) overlap: then every one is in lane 0, and nothing else need be asked."""
    reach = float("-inf")
    for x0, x1 in spans:
        if x0 < reach - 1e-6:
            return False
        reach = max(reach, x1)
    return True


def _free(starts: list[float], ends: list[float], x0: float, x1: float) -> bool:
    """Whether [x0, x1) overlaps none of a lane's spans (sorted by start, none overlapping another)."""
    k = bisect_right(starts, x0)
    if k and ends[k - 1] > x0 + 1e-6:
        return False
    return k == len(starts) or starts[k] >= x1 - 1e-6


def _insert(starts: list[float], ends: list[float], x0: float, x1: float) -> None:
    k = bisect_right(starts, x0)
    starts.insert(k, x0)
    ends.insert(k, x1)


@dataclass
class Strip:
    """Thin bars folded together: the pixels they cover (at least `min_w` wide), the indexes of the spans inside,
    and `fill`, the share of the strip's width the spans really cover (their union), for its shade."""

    x0: float
    x1: float
    members: list[int] = field(default_factory=list)
    fill: float = 1.0


def fold_thin(
    spans: Sequence[tuple[float, float]], min_w: float = 2.0, gap: float = 8.0
) -> tuple[list[int], list[Strip]]:
    """Level of detail for one row, spans in order of x0: the indexes of the spans drawn as bars (at least `min_w`
    wide), and the strips that the thinner ones fold into. Thin spans closer than `gap` to the strip before them join
    it (a gap a few pixels wide reads as part of the strip's shade, not as a separate mark), so a run of a hundred 0.3 px reservations becomes one strip rather than a hundred invisible slivers."""
    wide: list[int] = []
    strips: list[Strip] = []
    covered: list[list[tuple[float, float]]] = []
    for i, (x0, x1) in enumerate(spans):
        if x1 - x0 >= min_w:
            wide.append(i)
            continue
        if strips and x0 <= strips[-1].x1 + gap:
            strip = strips[-1]
            strip.x1 = max(strip.x1, x1)
            strip.members.append(i)
            covered[-1].append((x0, x1))
        else:
            strips.append(Strip(x0, x1, [i]))
            covered.append([(x0, x1)])
    for strip, parts in zip(strips, covered, strict=True):
        union = _union_length(parts)
        if strip.x1 - strip.x0 < min_w:
            strip.x1 = strip.x0 + min_w
        strip.fill = max(0.0, min(1.0, union / (strip.x1 - strip.x0)))
    return wide, strips


def _union_length(parts: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for x0, x1 in sorted(parts):
        if x1 <= reach:
            continue
        total += x1 - max(x0, reach)
        reach = x1
    return total


@dataclass(frozen=True)
class Tick:
    at: datetime
    label: str
    # "start", "middle" or "end": the label's anchor, so that the first and last labels stay inside the chart.
    anchor: str = "middle"


def tick_step(span_s: float, plot_w: float, min_gap: float) -> int:
    """The smallest round step (seconds) that keeps `min_gap` pixels between neighbouring ticks."""
    for step in TICK_STEPS:
        if plot_w * step / span_s >= min_gap:
            return step
    return TICK_STEPS[-1]


def ticks(start: datetime, end: datetime, plot_w: float, min_gap: float = 90.0) -> list[Tick]:
    """Ticks on round UTC times inside [start, end]: every 10 min over an hour, every hour over six, every three
    hours over a day, every day over a week at a 1,000 px plot. A tick on midnight (and every tick when the step is
    a day or more) is labelled with the date, the others with the time of day."""
    span = (end - start).total_seconds()
    if span <= 0:
        return []
    step = tick_step(span, plot_w, min_gap)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    first = -(-int((start - epoch).total_seconds()) // step) * step  # ceiling to the step
    out: list[Tick] = []
    at = epoch + timedelta(seconds=first)
    while at <= end:
        midnight = at.hour == 0 and at.minute == 0
        label = at.strftime("%a %d %b") if step >= 86400 or midnight else at.strftime("%H:%M")
        out.append(Tick(at, label))
        at += timedelta(seconds=step)
    return out


def anchor_for(x: float, left: float, right: float, half_label: float) -> str:
    """A tick label's anchor: centred under its tick unless that would push it past the plot's edge."""
    if x - half_label < left:
        return "start"
    if x + half_label > right:
        return "end"
    return "middle"
