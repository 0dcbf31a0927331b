"""Group commit: every pass first plans every lease request that waits (an intent, a lease stored in state `new`),
oldest first, at most MAX_BATCH, at the pass's one `now`; the queue runs once after all of them; then each
request's decision is written where its waiter reads it (its message and state, its placement report, its audit
row). A request the scheduler cannot take is rejected alone, and a submit that raised part-way restarts the batch
on the scheduler the pass started from (`_restart_pass`), at most MAX_RESTARTS times a pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime

from fleet.models import PlacementReport
from leases import reads
from leases.alerts import raise_alert
from leases.lifecycle import LeaseState
from leases.models import Lease, LeaseEvent, SchedulerState
from leases.planning.plan import Planning
from leases.planning.prepare import _prepare
from leases.planning.records import request_of
from leases.planning.reporting import placement_report
from leases.planning.restore import load
from leases.scheduler import Decision
from slotkeeper import audit, events, metrics
from slotkeeper.audit import actor_label
from slotkeeper.bulk import Row, insert_many, pipelined
from slotkeeper.models import AuditEntry

log = logging.getLogger(__name__)


# The most waiting intents one pass plans: a pass stays bounded however deep the queue, and the rest wait for
# the next one. A pass of 1,000 holds the plan lock about 1 s at 1,000 nodes on a two-core host (a tenth of
# PLAN_LOCK_TIMEOUT_S); against 500, a 10,000-request burst needs half the passes, and so half their fixed cost
# (the commit's flush, the fleet read, the queue run): 9.6-9.7 s against 10.1-10.3 s (docs/benchmarks/burst.md).
MAX_BATCH = 1000
# A pass's reports and audit rows are written this many at a time, pipelined with building the next ones.
REPORT_CHUNK = 100


# How many times one pass starts its batch again after a submit raised (`_restart_pass`: a reload and the batch's
# earlier submits again, each). Past that, the requests after the last one that raised wait for the next pass: a
# defect that makes every submit raise costs each pass a few restarts, never one per request of a 500-request
# batch (measured: 500 restarts over 5,000 live leases held the plan lock for 440 s).
MAX_RESTARTS = 3


def _plan_intents(plan: Planning) -> list[int]:
    """Plans every waiting lease request (state `new`, oldest first, at most MAX_BATCH) at the pass's one `now`:
    each submitted with the queue deferred, the queue processed once, then each request's decision written where
    its waiter reads it (the lease's message and state, its placement report), with its audit row and alert."""
    # The submitters prefetched (one read of each distinct user), not joined: a burst's requests come from a few
    # accounts, and the join built a user instance for every one of them.
    intents = list(
        Lease.objects.filter(state=LeaseState.NEW)
        .select_for_update(of=("self",))
        .prefetch_related("submitted_by")
        .order_by("submitted_at", "id")[:MAX_BATCH]
    )
    if not intents:
        return []
    sched = plan.scheduler
    groups = reads.groups_by_lease([lease.pk for lease in intents])
    unplannable: dict[int, str] = {}
    restarts = 0
    while True:
        got = _submit_intents(plan, intents, groups, unplannable)
        if not isinstance(got, Lease):
            decided = got
            break
        # A submit raised part-way: the scheduler holds half its changes (reservations, preempted leases, journal
        # entries of a lease it no longer knows, which `apply` would fail on in every pass from then on). Start
        # the batch again on the scheduler the pass started from, without the requests that failed.
        _restart_pass(plan)
        restarts += 1
        if restarts >= MAX_RESTARTS:
            intents = intents[: intents.index(got) + 1]  # the rest wait, untouched, for the next pass
    for lease in intents:
        if lease.pk in unplannable:
            _reject_unplannable(lease, unplannable[lease.pk], plan.now)
    sched.run_queue(plan.t)
    # A request accepted by `submit` may have been isolated (failed) while the queue or its start ran: its
    # decision is a failure, with the reason, not the acceptance `submit` returned.
    isolated = dict(sched.isolated)
    decided = [
        (lease, _isolated_decision(lease.pk, isolated[lease.pk]) if lease.pk in isolated else decision)
        for lease, decision in decided
    ]
    reports, audits = [], []
    # The reports and audit rows go in chunks, pipelined: the server writes one chunk while the next one's
    # reports are built (bulk.pipelined; nothing reads their keys back). The plan no longer changes from here,
    # so requests that hold nothing share their verdicts by shape and window (`report_fields`).
    shared: dict = {}
    with pipelined():
        for lease, decision in decided:
            lease.message = sched.describe(lease.pk) if decision.accepted else decision.message
            plan.messages[lease.pk] = lease.message
            plan.reported.add(lease.pk)
            reports.append(
                placement_report(
                    plan,
                    lease.pk,
                    message=lease.message,
                    requested_by=actor_label(lease.submitted_by),
                    shared=shared,
                    code="" if decision.accepted else decision.code or "rejected",
                )
            )
            audits.append(
                audit.entry_row(
                    at=plan.now,
                    actor=lease.submitted_by,
                    action="lease.submit",
                    target=lease,
                    details={"type": lease.type, "accepted": decision.accepted, "message": decision.message},
                )
            )
            # A rejection is the client's answer (its 409), an audit row and a metric: no alert, which is for what
            # an operator must act on (one per rejected request buried the real ones). An isolation has its own.
            events.send_on_commit("lease-changed", lease=lease.pk)
            accepted = str(decision.accepted).lower()
            metrics.inc("slotkeeper_lease_submissions_total", type=lease.type, accepted=accepted)
            outcome = "placed" if decision.accepted else "rejected"
            metrics.inc("slotkeeper_placements_total", kind="lease", outcome=outcome)
            if len(reports) >= REPORT_CHUNK:
                _write_reports(reports, audits)
                reports, audits = [], []
        _write_reports(reports, audits)
    return [lease.pk for lease in intents]


def _write_reports(reports: list[Row], audits: list[Row]) -> None:
    insert_many(reports, model=PlacementReport, returning=False)
    insert_many(audits, model=AuditEntry, returning=False)


def _submit_intents(
    plan: Planning, intents: list[Lease], groups: Mapping, unplannable: dict[int, str]
) -> list[tuple[Lease, Decision]] | Lease:
    """Submits each request not yet found unplannable, deferring the queue. A request the scheduler cannot take
    must not fail every other request of the batch (or, left `new`, fail every pass after it): its reason goes
    into `unplannable`, and the rest go on. Returns the decisions, or the request whose submit raised: that one
    may have changed the scheduler before it raised, and the batch must start again (`_restart_pass`)."""
    sched = plan.scheduler
    decided: list[tuple[Lease, Decision]] = []
    for lease in intents:
        if lease.pk in unplannable:
            continue
        try:
            request = request_of(lease, groups.get(lease.pk, ()), plan.nodes)
        except Exception as exc:  # nothing was handed to the scheduler: it is as it was
            log.exception("lease request could not be planned", extra={"lease": lease.pk})
            unplannable[lease.pk] = f"the scheduler could not plan it: {type(exc).__name__}: {exc}"
            continue
        try:
            decided.append((lease, sched.submit(request, plan.t, plan.excluded, defer=True)))
        except Exception as exc:
            log.exception("lease request could not be planned", extra={"lease": lease.pk})
            unplannable[lease.pk] = f"the scheduler could not plan it: {type(exc).__name__}: {exc}"
            return lease
    return decided


def _restart_pass(plan: Planning) -> None:
    """Puts the pass's scheduler back where the pass started: built again from the database (which this pass has
    not written yet) and prepared as `passes._pass` prepares it, in place, because the pass holds that object and
    caches it when it commits. Paid only when a submit raised: one read of every live lease, as a cache miss."""
    started = time.perf_counter()
    state = SchedulerState.objects.get(pk=1)
    fresh = load(plan.nodes, state.next_rid)
    _prepare(fresh, plan)
    plan.scheduler.take_over(fresh)
    took = time.perf_counter() - started
    log.warning("planning pass restarted after a failed submit", extra={"seconds": round(took, 3)})
    metrics.inc("slotkeeper_plan_pass_restarts_total")


def _isolated_decision(lease_id: int, reason: str) -> Decision:
    return Decision(
        False,
        lease_id,
        LeaseState.FAILED,
        f"isolated by the scheduler, which could not plan it: {reason}"[:2000],
    )


def _reject_unplannable(lease: Lease, reason: str, now: datetime) -> None:
    LeaseEvent.objects.create(lease=lease, at=now, from_state=lease.state, to_state=LeaseState.REJECTED)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.REJECTED, message=reason[:2000])
    PlacementReport.objects.create(
        created_at=now, subject=f"lease:{lease.pk}", request={"type": lease.type}, outcome="rejected",
        message=reason[:2000], requested_by=actor_label(lease.submitted_by),
    )  # fmt: skip
    audit.record(at=now, actor=lease.submitted_by, action="lease.submit", target=lease, reason=reason[:500])
    raise_alert("failed_placement", f"lease {lease.pk} {lease.name}: {reason}"[:2000], now, lease=lease)
