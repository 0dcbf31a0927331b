"""How far the queue forecast's estimates fell from the starts that followed, and the range a new estimate is
likely to fall in (issue 48 item 4; docs/replay.md, "Forecast accuracy").

The forecast plans every lease ahead of a queued one for its whole asked time. Most end early, so a queued lease
nearly always starts earlier than estimated: on the Blue Horizon trace, 98.8 % of the estimates more than a
minute off were late ones (docs/BENCHMARKS.md). The estimate is a fair "at the latest"; what a user wants next to
it is "probably about when". This keeps the ratio of each recent lease's actual wait to its estimated wait (both
from its submission) and scales a new estimate's wait by their median, with the 10th and 90th percentiles as
the range shown. The ratios are learnt from what has already happened, never from the future (the replay feeds
them in start order, the console reads them from leases that have started).

PURE: no Django.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# An estimate this close to its submission is taken as it is: the lease is next or nearly.
MIN_WAIT_S = 60.0
# The most recent leases the ratios are learnt from; fewer than MIN_SAMPLES and no range is given.
KEPT = 200
MIN_SAMPLES = 20


@dataclass(frozen=True)
class Likely:
    """A queued lease's likely start (the median ratio's) and the range around it (10th to 90th percentile)."""

    start: float
    low: float
    high: float
    samples: int


class WaitCalibration:
    """The ratios actual wait / estimated wait of the last KEPT leases queued at submission."""

    def __init__(self, kept: int = KEPT) -> None:
        self._ratios: deque[float] = deque(maxlen=kept)

    def observe(self, submitted: float, estimated: float, started: float) -> None:
        """A lease that was estimated to start at `estimated` when submitted at `submitted` started at
        `started` (seconds on one clock)."""
        wait = estimated - submitted
        if wait >= MIN_WAIT_S:
            self._ratios.append(max(started - submitted, 0.0) / wait)

    def observe_all(self, rows: Iterable[tuple[float, float, float]]) -> WaitCalibration:
        for submitted, estimated, started in rows:
            self.observe(submitted, estimated, started)
        return self

    def likely(self, now: float, estimated: float) -> Likely | None:
        """The likely start of a lease estimated at `estimated`, its remaining wait scaled by the ratios; None
        when it is due within MIN_WAIT_S or too few leases have been seen to say."""
        n = len(self._ratios)
        wait = estimated - now
        if n < MIN_SAMPLES or wait < MIN_WAIT_S:
            return None
        ratios = sorted(self._ratios)

        def at(p: float) -> float:
            return now + ratios[min(n - 1, int(p * (n - 1) + 0.5))] * wait

        return Likely(start=at(0.5), low=at(0.1), high=at(0.9), samples=n)
