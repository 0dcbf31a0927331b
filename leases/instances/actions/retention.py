"""How long placement reports are kept (docs/operations.md, "Retention").

Every decision writes a report with a verdict for every node (a few KiB at 1,000 nodes, stored compressed), and so
does every placement preview, which nobody reads again once it is answered. Kept forever, a fleet that previews a
few times a second grows its report table by gigabytes a day. Reports older than their retention are deleted in
small batches by the periodic work, except the ones still needed to answer "why?" about something live:

- a preview's report is kept `PREVIEW_REPORT_RETENTION_S` (default one day): its answer was given inline;
- any other report is kept `REPORT_RETENTION_S` (default 30 days), and past that for as long as its lease is not
  in a final state (a lease queued or running for months keeps the reports that say why it is where it is), or
  while a pending reschedule points at it (an operator has yet to read it before approving).

Here, not in fleet, because the rules compose the lease core's states and the instances package's reschedules.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import CharField, Value
from django.db.models.functions import Cast, Concat

from fleet.models import PlacementReport
from leases.instances.models import Reschedule, RescheduleStatus
from leases.lifecycle import TERMINAL_LEASE_STATES
from leases.models import Lease
from slotkeeper import metrics

log = logging.getLogger(__name__)

PREVIEW = "preview"
_LABEL = PlacementReport._meta.label
# Rows deleted per statement: a short transaction each, so a backlog never holds a lock a pass waits on for long.
BATCH = 1000
# Time one call may spend deleting; the next call (a minute later) goes on where this one stopped. Measured on
# PostgreSQL, 1,000-node reports (bench/bench_retention.py): 7,000-10,000 deleted a second, so a second a minute
# clears about 10 million a day.
BUDGET_S = 1.0


@dataclass
class Pruned:
    previews: int = 0
    decisions: int = 0
    more: bool = False  # the budget ran out with rows still due

    @property
    def total(self) -> int:
        return self.previews + self.decisions


def prune_reports(now: datetime, *, budget_s: float = BUDGET_S, batch: int = BATCH) -> Pruned:
    """Deletes the reports past their retention at `now`, at most `batch` a statement and for about `budget_s`
    seconds (at least one statement of each kind). Idempotent: two processes running it at once delete each row
    once between them."""
    deadline = time.monotonic() + budget_s
    previews, more_previews = _prune(_due_previews(now), "preview", deadline, batch)
    decisions, more_decisions = _prune(_due_decisions(now), "decision", deadline, batch)
    out = Pruned(previews, decisions, more_previews or more_decisions)
    if out.total:
        log.info(
            "placement reports pruned",
            extra={"previews": out.previews, "decisions": out.decisions, "more": out.more},
        )
    return out


def _prune(due, kind: str, deadline: float, batch: int) -> tuple[int, bool]:
    """Deletes `due` (a queryset of reports, oldest first) a batch a transaction until none is left or the
    deadline passed: (how many this call deleted, whether any may be left)."""
    total = 0
    while True:
        with transaction.atomic():
            ids = list(due.values_list("id", flat=True)[:batch])
            # Counted as deleted here: another process pruning at once may have taken some of them. Only the ids
            # are read: the delete loads the rows it deletes (a reschedule's report is set to null first), and
            # loading each report's verdicts made it 17 times slower than the delete (bench_retention.py).
            gone = PlacementReport.objects.filter(pk__in=ids).only("id")
            deleted = gone.delete()[1].get(_LABEL, 0) if ids else 0
        if deleted:
            total += deleted
            metrics.inc("slotkeeper_placement_reports_pruned_total", deleted, kind=kind)
        if len(ids) < batch:
            return total, False
        if time.monotonic() >= deadline:
            return total, True


def _cutoff(now: datetime, setting: str) -> datetime | None:
    """Reports created before this are due; None when the retention reaches past any date (`inf`: keep all)."""
    try:
        return now - timedelta(seconds=settings.SLOTKEEPER[setting])
    except OverflowError:
        return None


def _due_previews(now: datetime):
    cutoff = _cutoff(now, "PREVIEW_REPORT_RETENTION_S")
    if cutoff is None:
        return PlacementReport.objects.none()
    # Oldest first along the created_at index: a round with nothing due reads one index entry.
    return PlacementReport.objects.filter(subject=PREVIEW, created_at__lt=cutoff).order_by("created_at", "id")


def _due_decisions(now: datetime):
    cutoff = _cutoff(now, "REPORT_RETENTION_S")
    if cutoff is None:
        return PlacementReport.objects.none()
    live_subjects = (
        Lease.objects.exclude(state__in=[s.value for s in TERMINAL_LEASE_STATES])
        .annotate(subject=Concat(Value("lease:"), Cast("id", CharField()), output_field=CharField()))
        .values("subject")
    )
    pending = Reschedule.objects.filter(status=RescheduleStatus.PENDING, report__isnull=False).values(
        "report_id"
    )
    return (
        PlacementReport.objects.filter(created_at__lt=cutoff)
        .exclude(subject=PREVIEW)
        .exclude(subject__in=live_subjects)
        .exclude(pk__in=pending)
        .order_by("created_at", "id")
    )
