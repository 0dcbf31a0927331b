"""The write paths of the lease core: submit, cancel, and the lease part of the tick. Each runs inside the plan
applier (leases/planning/passes.py, `planning`): one transaction, one lock, an audit row, events after commit.
Reads are in leases/reads.py; what happens to instances beyond their rows (restarts, loss, reschedules, drains)
is the instances package's (leases/instances/), which composes the whole periodic step around `recorded_tick`."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone

from fleet import wording
from fleet.models import PlacementReport, SweepState
from leases import forecasting, negotiating, reads, vnodes
from leases.alerts import raise_alert, resolve_open
from leases.lifecycle import IllegalTransition, LeaseState
from leases.models import (
    LIVE_RESERVATION_STATUSES,
    Alert,
    Group,
    Lease,
    LeaseEvent,
    Reservation,
    SchedulerState,
)
from leases.planning.passes import planning
from leases.planning.reading import consulting
from leases.planning.records import barred_nodes, from_epoch, to_epoch
from leases.planning.reporting import report_row
from leases.planning.waiting import await_decision
from leases.request_rules import MAX_NOTIFY_BEFORE_S
from leases.scheduler import Decision, EndChange, LeaseRequest
from slotkeeper import audit, bulk, events, metrics, outbox, planwake, statements
from slotkeeper.audit import actor_label
from slotkeeper.domain import DomainError, KeyReused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSpec:
    name: str
    type: str
    duration_s: float
    vnodes: list[dict]
    start: datetime | None = None
    capabilities: tuple[str, ...] = ()
    preemptible: bool = True
    real_duration_s: float | None = None
    groups: tuple[str, ...] = ()
    # Instance policy: migratable, restart_policy, max_reschedules, auto_approve_reschedules, driver, spec.
    policy: dict = field(default_factory=dict)

    @classmethod
    def from_request(cls, data: dict) -> LeaseSpec:
        """The spec of a validated lease request (leases/api/serializers.py's LeaseCreateSerializer), as the API
        and the console's form both submit it."""
        return cls(
            name=data["name"],
            type=data["type"],
            duration_s=data["duration_s"],
            vnodes=[dict(v) for v in data["nodes"]],
            start=data["start"],
            capabilities=tuple(data["capabilities"]),
            preemptible=data["preemptible"],
            real_duration_s=data["real_duration_s"],
            groups=tuple(data["groups"]),
            policy={
                "migratable": data["migratable"],
                "restart_policy": dict(data["restart_policy"]),
                "max_reschedules": data["max_reschedules"],
                "auto_approve_reschedules": data["auto_approve_reschedules"],
                "driver": data["driver"],
                "spec": dict(data["spec"]),
                "notify_before_s": (
                    data["notify_before_s"]
                    if data.get("notify_before_s") is not None
                    else int(settings.SLOTKEEPER["NOTIFY_BEFORE_S"])
                ),
            },
        )


def spec_of(lease: Lease, *, start: datetime | None) -> LeaseSpec:
    """The request of an earlier lease, asked again from `start` (a counter-offer taken from the console)."""
    return LeaseSpec(
        name=lease.name,
        type=lease.type,
        duration_s=lease.duration_s,
        vnodes=[dict(v) for v in lease.vnodes],
        start=start,
        capabilities=tuple(lease.capabilities or ()),
        preemptible=lease.preemptible,
        real_duration_s=lease.real_duration_s,
        groups=tuple(lease.groups.values_list("name", flat=True)),
        policy={
            "migratable": lease.migratable,
            "restart_policy": dict(lease.restart_policy or {}),
            "max_reschedules": lease.max_reschedules,
            "auto_approve_reschedules": lease.auto_approve_reschedules,
            "driver": lease.driver,
            "spec": dict(lease.spec or {}),
            "notify_before_s": lease.notify_before_s,
        },
    )


@dataclass
class Submitted:
    lease: Lease
    decision: Decision
    report: PlacementReport
    replayed: bool = False  # the answer to an earlier request with the same idempotency key


@dataclass(frozen=True)
class Idempotency:
    """A lease request's Idempotency-Key header and the digest of its body (leases/api/views.py)."""

    key: str
    digest: str


def do_submit_lease(
    actor, spec: LeaseSpec, *, now: datetime, idempotency: Idempotency | None = None
) -> Submitted:
    """Stores the lease and has it scheduled before answering: an AR gets its window or is rejected, an immediate
    lease runs now or is rejected, a best-effort lease is queued and started as soon as the queue allows.

    Group commit (docs/group-commit.md): the request is stored first, in a short transaction of its own (a lease
    in state `new`, an intent), and then decided by whichever planning pass comes next, which plans every waiting
    request at once; this call runs that pass itself when the plan lock is free, and otherwise sleeps until a
    pass commits. Either way it answers with its own lease's decision and report.

    With `idempotency` (which `do_replay_lease` found no earlier request for), the key is stored with the lease;
    a request with the same key stored meanwhile makes the insert fail on the unique constraint, and this one is
    then answered as its replay: two requests with one key at once store one lease."""
    since = (
        planwake.ticket()
    )  # passes from here on name the requests they decide: this one's, once it is stored
    try:
        with transaction.atomic():
            lease = _intent(actor, spec, now, idempotency)
            bulk.insert_one(lease)
            groups = list(Group.objects.filter(name__in=spec.groups)) if spec.groups else []
            if groups:
                lease.groups.set(groups)
    except IntegrityError:
        # The same key stored by a request running at the same time (the constraint lease_idempotency_key_once).
        if idempotency is None or (earlier := _earlier_request(actor, idempotency)) is None:
            raise
        return _answer(earlier, now, since=None, replayed=True)
    return _answer(lease.pk, now, since=since, groups=groups)


@dataclass
class BatchItem:
    """One lease of an array (`do_submit_leases`): its spec and key in, its answer (or the reason the key refused
    it) out."""

    spec: LeaseSpec
    idempotency: Idempotency | None = None
    submitted: Submitted | None = None
    refused: str = ""  # a key reused for another body


def do_submit_leases(actor, items: list[BatchItem], *, now: datetime) -> list[BatchItem]:
    """A lease array: every item stored as an intent in one transaction, in order, then decided by the planning
    pass that comes next, which plans them in that order as if they had been submitted one after another (group
    commit: a pass plans up to MAX_BATCH waiting requests at once), and each answered with its own decision and
    report. An item whose Idempotency key was used before is answered as that earlier request (with nothing
    stored); one whose key was used for another body is refused (`refused`), and the others go on. The array is
    one audit row (`lease.batch`), and each lease its own (`lease.submit`, written by the pass)."""
    since = planwake.ticket()
    stored: list[tuple[BatchItem, int, bool]] = []  # (item, lease id, replayed)
    with transaction.atomic():
        for item in items:
            idem = item.idempotency
            try:
                earlier = _earlier_request(actor, idem) if idem else None
            except KeyReused as exc:
                item.refused = str(exc)
                continue
            if earlier is not None:
                stored.append((item, earlier, True))
                continue
            lease = _intent(actor, item.spec, now, idem)
            try:
                if idem is None:
                    bulk.insert_one(lease)
                else:
                    with transaction.atomic():  # a savepoint: a key stored meanwhile fails this item alone
                        bulk.insert_one(lease)
            except IntegrityError:
                earlier = _earlier_request(actor, idem) if idem else None
                if earlier is None:
                    raise
                stored.append((item, earlier, True))
                continue
            if item.spec.groups:
                lease.groups.set(list(Group.objects.filter(name__in=item.spec.groups)))
            stored.append((item, lease.pk, False))
        audit.record(
            at=now,
            actor=actor,
            action="lease.batch",
            target=None,
            details={
                "items": len(items),
                "leases": [pk for _, pk, replayed in stored if not replayed],
                "replayed": [pk for _, pk, replayed in stored if replayed],
                "refused": sum(1 for i in items if i.refused),
            },
        )
    fresh = [pk for _, pk, replayed in stored if not replayed]
    if fresh:
        # Intents are planned oldest first (submitted_at, then id): once the last is decided, so are all the others.
        await_decision(max(fresh), now, since=since)
    answers = _answers([pk for _, pk, _ in stored], now)
    for (item, _, replayed), submitted in zip(stored, answers, strict=True):
        submitted.replayed = replayed
        item.submitted = submitted
    return items


def _intent(actor, spec: LeaseSpec, now: datetime, idempotency: Idempotency | None) -> Lease:
    return Lease(
        name=spec.name,
        type=spec.type,
        submitted_at=now,
        requested_start=spec.start,
        duration_s=spec.duration_s,
        vnodes=spec.vnodes,
        capabilities=list(spec.capabilities),
        preemptible=spec.preemptible,
        real_duration_s=spec.real_duration_s,
        submitted_by=actor if getattr(actor, "pk", None) else None,
        idempotency_key=idempotency.key if idempotency else "",
        request_digest=idempotency.digest if idempotency else "",
        **spec.policy,
    )


def _answers(lease_ids: list[int], now: datetime) -> list[Submitted]:
    """`_answer` for many decided (or replayed) requests: their rows and first reports in two queries. A replayed
    one still waiting for its pass (another request of the same key in flight) is waited for alone."""
    leases = {lease.pk: lease for lease in Lease.objects.filter(pk__in=lease_ids)}
    out = []
    pending = [pk for pk in lease_ids if pk not in leases or leases[pk].state == LeaseState.NEW]
    if pending:
        for pk in pending:
            leases[pk] = await_decision(pk, now, since=None)
    subjects = [f"lease:{pk}" for pk in lease_ids]
    first: dict[str, PlacementReport] = {}
    for report in PlacementReport.objects.filter(subject__in=subjects).order_by("id"):
        first.setdefault(report.subject, report)
    for pk in lease_ids:
        lease = leases[pk]
        report = first.get(f"lease:{pk}")
        assert report is not None, f"lease {pk} was decided without a report"
        out.append(Submitted(lease, _decision_of(lease, report), report))
    return out


def do_replay_lease(actor, idempotency: Idempotency, *, now: datetime) -> Submitted | None:
    """The answer to a lease request whose Idempotency-Key `actor` used before: that earlier lease's decision,
    waiting for it if no pass has decided it yet, with nothing stored; None when the key is new. The same key with
    another body is refused (KeyReused, 422). Asked before the request is validated again: a retry's body may no
    longer pass (an advance reservation's start now past, the only node it fitted gone) while its first answer
    stands."""
    earlier = _earlier_request(actor, idempotency)
    return None if earlier is None else _answer(earlier, now, since=None, replayed=True)


def _earlier_request(actor, idempotency: Idempotency) -> int | None:
    """The lease an earlier request of `actor` stored under the same key, if any; KeyReused if its body differed."""
    if not getattr(actor, "pk", None):
        return None
    found = (
        Lease.objects.filter(submitted_by=actor, idempotency_key=idempotency.key)
        .values_list("pk", "request_digest")
        .first()
    )
    if found is None:
        return None
    if found[1] != idempotency.digest:
        raise KeyReused(
            f"Idempotency-Key {idempotency.key!r} was used for another request (lease {found[0]}); "
            "a retry must send the same body, a new request a new key."
        )
    return found[0]


def _answer(
    lease_id: int, now: datetime, *, since: int | None, groups: list | None = None, replayed: bool = False
) -> Submitted:
    lease = await_decision(lease_id, now, since=since)
    if groups is not None:
        # Its groups are the request's: set with the row, and a pass never changes them (the answer reads no
        # more).
        reads.cache_groups(lease, groups)
    # The report the pass wrote when it decided this request: the first one about the lease (a later pass may add
    # "placed by the queue" reports, which are not this request's answer).
    report = reads.first_report(f"lease:{lease.pk}")
    assert report is not None, f"lease {lease.pk} was decided without a report"
    return Submitted(lease, _decision_of(lease, report), report, replayed)


def _decision_of(lease: Lease, report: PlacementReport) -> Decision:
    """The decision a request got, from its lease row and the report the pass wrote about it. The report says
    what the pass decided; the lease's state says whether that still holds. A lease the scheduler isolated
    (failed) after its report was written (later in the same pass, the tick's part of it, or a pass that ran
    before this waiter woke) was answered 201 "placed" while it had failed."""
    state = LeaseState(lease.state)
    refused = state in (LeaseState.FAILED, LeaseState.REJECTED)
    accepted = report.outcome != "rejected" and not refused
    message = lease.message if state == LeaseState.FAILED and lease.message else report.message
    return Decision(accepted, lease.pk, state, message, "" if accepted else report.code or "rejected")


# The probe of a preview is no lease: an id no lease can have.
PREVIEW_ID = -1


def do_preview(actor, data: dict, *, now: datetime) -> tuple[dict, PlacementReport]:
    """ "Would this fit, and where?": `count` VMs of the given size with the given capabilities, for `duration_s`
    from now (as an immediate lease) or from `start` (as an advance reservation), decided by the very step a
    submission of that lease takes (`Scheduler.decide`): the preview differs from a submission only in writing no
    lease. Kept as a report with every node's verdict and audited; nothing is placed.

    A read: asked of the scheduler the last pass committed when it is current (`reading.consulting`), so a preview
    takes no plan lock and bumps no version; the report and its audit row are written after, in a transaction
    of their own."""
    size = vnodes.as_res({k: data[k] for k in ("cpu_cores", "mem_mib", "disk_gib")})
    start_at = data.get("start")
    duration = data.get("duration_s") or 3600
    with consulting(now) as plan:
        others = [n.id for n in plan.nodes if n.name != data.get("preferred_node")]
        preferred = data.get("preferred_node") and len(others) < len(plan.nodes)
        probe = LeaseRequest(
            id=PREVIEW_ID,
            type="advance_reservation" if start_at is not None else "immediate",
            submit=plan.t,
            start=to_epoch(start_at) if start_at is not None else None,
            duration=duration,
            vnodes=(size,) * data["count"],
            preemptible=False,
            avoid=frozenset(others) if preferred else frozenset(),
            barred=barred_nodes(data["capabilities"], (), plan.nodes),
            capabilities=frozenset(data["capabilities"]),
        )
        trial = plan.scheduler.decide(probe, plan.t, plan.excluded)
        # A window with no room: when it could be had, and who is in the way (issue 48's counter-offers).
        offered = (
            negotiating.offers(plan, probe)
            if start_at is not None and trial.outcome in negotiating.NEGOTIABLE
            else {}
        )
        picked = trial.nodes
        names = plan.names
        report = report_row(
            plan, probe, trial.start, trial.end, outcome=trial.outcome, message="", subject="preview",
            requested_by=actor_label(actor), proposed=picked,
        )  # fmt: skip
        when = (
            "now"
            if start_at is None
            else f"over {plan.scheduler.label(trial.start)}–{plan.scheduler.label(trial.end)}"
        )
    if trial.placed:
        report.message = f"would run {when} on {', '.join(names[n] for n in picked)}"
        if trial.preempt:
            ids = ", ".join(str(i) for i in trial.preempt)
            report.message += f", preempting best-effort lease{'s' if len(trial.preempt) > 1 else ''} {ids}"
    elif trial.outcome == "no_capable_node":
        report.message = trial.message
    else:
        report.message = f"{wording.words(trial.outcome)}: {report.summary}"
    note = ""
    if preferred and picked and names[picked[0]] != data["preferred_node"]:
        note = f"the preferred node {data['preferred_node']} cannot take it now; see its verdict"
    report.preferred_note = note
    report.code = "" if trial.placed else trial.outcome
    with transaction.atomic():
        # A record of a question, which changed nothing: its commit does not wait for the disk, whose slowest
        # flushes were most of a preview's p99 (slotkeeper/statements.py).
        statements.commit_without_flush()
        report.save()
        audit.record(
            at=now,
            actor=actor,
            action="placement.preview",
            target=report,
            details={"outcome": report.outcome},
        )
    report.use_names(names)
    metrics.inc("slotkeeper_placements_total", kind="preview", outcome=report.outcome)
    body = {
        "outcome": report.outcome,
        "nodes": list(report.chosen),
        "message": report.message,
        "preferred_note": note or None,
        "start": from_epoch(trial.start),
        "end": from_epoch(trial.end),
        "preempts": list(trial.preempt),
        "report": report.pk,
        "summary": report.summary,
        **offered,
        "verdicts": report.rows,  # decoded once: a 1,000-node report's sentences are most of reading it
    }
    return body, report


@dataclass
class EndChanged:
    """What `do_change_end` did (or, for a dry run, would do), in the API's words."""

    change: EndChange
    lease: Lease
    names: dict[int, str]
    dry_run: bool

    def answer(self) -> dict:
        c = self.change
        out: dict = {
            "lease": self.lease.pk,
            "dry_run": self.dry_run,
            "from_end": None if math.isnan(c.old_end) else from_epoch(c.old_end),
            "end": None if math.isnan(c.new_end) else from_epoch(c.new_end),
            "message": c.message,
            "replanned": list(c.replanned),
        }
        if not c.ok:
            out["detail"] = c.message
            labels = dict(Lease.objects.filter(pk__in=c.blocking).values_list("pk", "name"))
            out["code"] = c.code
            out["blocking"] = [{"id": i, "name": labels.get(i, "")} for i in c.blocking]
            out["latest_end"] = from_epoch(c.latest_end) if c.latest_end is not None else None
            out["verdicts"] = [
                {
                    "node": self.names.get(n, str(n)),
                    "fits": not why,
                    "reason": why or "free over the extension",
                }
                for n, why in c.verdicts.items()
            ]
        return out


def do_change_end(
    actor,
    lease_id: int,
    *,
    now: datetime,
    end: datetime | None = None,
    by_s: float | None = None,
    dry_run: bool = False,
    reason: str = "",
) -> EndChanged:
    """Extend or shorten a placed lease (issue 48): its current plan's end moves to `end`, or by `by_s` seconds,
    where its own nodes hold it (leases/scheduling/changing.py). A dry run asks the scheduler as the last pass
    left it and changes nothing. Done: the lease's duration, history, audit and event feed say so. Refused for its
    state, for an end before its start or now (what the lease is now, not the request's form), or for want of
    room: answered, not done (`change.ok` false, `change.code` says which)."""
    lease = reads.get_lease(lease_id)
    opened = consulting(now) if dry_run else planning(now)
    with opened as plan:
        rec = plan.scheduler.leases.get(lease.pk)
        vm = rec.current_vm() if rec is not None else None
        base = vm.end if vm is not None else math.nan
        target = to_epoch(end) if end is not None else base + float(by_s or 0)
        if rec is None:  # ended, cancelled, rejected: no longer the scheduler's
            change = EndChange(
                False, lease.pk, math.nan, target, code="not_changeable",
                message=f"lease {lease.pk} is {lease.state}: only a placed or running lease's end can be changed",
            )  # fmt: skip
        else:
            change = plan.scheduler.change_end(lease.pk, target, plan.t, dry_run=dry_run)
        names = dict(plan.names)
        if change.ok and not dry_run and change.new_end != change.old_end:
            longer = change.new_end > change.old_end
            said = change.message + (
                f" ({audit.actor_label(actor)}: {reason})" if reason else f" ({audit.actor_label(actor)})"
            )
            plan.messages[lease.pk] = plan.scheduler.describe(lease.pk)[:2000]
            delta = change.new_end - change.old_end
            Lease.objects.filter(pk=lease.pk).update(duration_s=F("duration_s") + delta)
            LeaseEvent.objects.create(
                lease=lease, at=now, from_state=lease.state, to_state=lease.state, message=said[:2000]
            )
            details = {
                "from_end": from_epoch(change.old_end).isoformat(),
                "end": from_epoch(change.new_end).isoformat(),
                "replanned": list(change.replanned),
            }
            audit.record(
                at=now, actor=actor, action="lease.extend" if longer else "lease.shorten", target=lease,
                reason=reason, details=details,
            )  # fmt: skip
            outbox.append(
                "lease.extended" if longer else "lease.shortened", now, lease=lease.pk,
                data={**details, "reason": reason},
            )  # fmt: skip
            events.send_on_commit("lease-changed", lease=lease.pk)
    lease.refresh_from_db()
    return EndChanged(change, lease, names, dry_run)


def do_cancel_lease(actor, lease_id: int, *, now: datetime, reason: str = "") -> Lease:
    with planning(now) as plan:
        lease = reads.get_lease(lease_id)
        if lease.pk not in plan.scheduler.leases:
            raise DomainError(f"lease {lease_id} is {lease.state}; it cannot be cancelled")
        try:
            decision = plan.scheduler.cancel(lease.pk, plan.t)
        except IllegalTransition as exc:
            raise DomainError(str(exc)) from None
        # Over the message it was placed with ("runs ... on n1"), which the lease's page went on showing.
        said = f"{decision.message} by {audit.actor_label(actor)}" + (f": {reason}" if reason else "")
        plan.messages[lease.pk] = said[:2000]
        audit.record(at=now, actor=actor, action="lease.cancel", target=lease, reason=reason)
        events.send_on_commit("lease-changed", lease=lease.pk)
    lease.refresh_from_db()
    return lease


@contextmanager
def recorded_tick(now: datetime) -> Iterator[None]:
    """Records how the periodic step went, whatever it ran: a failure is recorded (SchedulerState, an alert on the
    first failure, /readyz, /metrics) and raised again for the caller's log; the next step that passes clears
    the record and resolves the alert."""
    started = timezone.now()
    try:
        yield
    except Exception as exc:
        _tick_failed(now, exc)
        raise
    took = (timezone.now() - started).total_seconds()
    failed_before = SchedulerState.objects.filter(pk=1, tick_failures__gt=0).exists()
    SchedulerState.objects.filter(pk=1).update(last_tick_at=now, last_tick_s=took, tick_failures=0)
    if failed_before:
        resolve_open("tick_failed", now, "the tick passed again")
    _fleet_disruption_alert(now)
    metrics.inc("slotkeeper_ticks_total")


# The most leases warned in one tick (the rest in the next ones, a few seconds later).
NOTICES_PER_TICK = 1000


def notify_ending(now: datetime) -> int:
    """The before-end notices (issue 48): a `lease.ending` event on the feed for every placed lease whose end is
    within its `notify_before_s`, once per end (`ending_notified_for`, written with the event, so a restart or a
    second tick never sends it twice, and an extension, which moves the end, gets a notice of its own). A lease
    whose end has already passed when the tick comes (the server was down) gets none. Returns how many were sent."""
    horizon = now + timedelta(seconds=MAX_NOTIFY_BEFORE_S)
    ends: dict[int, tuple[datetime, int]] = {}
    rows = (
        Reservation.objects.filter(
            kind="vm", status__in=LIVE_RESERVATION_STATUSES, end__gt=now, end__lte=horizon,
            lease__notify_before_s__gt=0,
        )
        .exclude(lease__ending_notified_for=F("end"))  # sent already, for this end
        .values_list("lease_id", "end", "lease__notify_before_s")
    )  # fmt: skip
    for lease_id, end, before in rows:
        if end - timedelta(seconds=before) <= now and (lease_id not in ends or end > ends[lease_id][0]):
            ends[lease_id] = (end, before)
    if not ends:
        return 0
    # A lease's last live VM reservation is its end (a resumed lease's earlier VMs are not).
    last = dict(
        Reservation.objects.filter(lease_id__in=ends, kind="vm", status__in=LIVE_RESERVATION_STATUSES)
        .values("lease_id")
        .annotate(end=Max("end"))
        .values_list("lease_id", "end")
    )
    due = sorted(lid for lid, (end, _) in ends.items() if last.get(lid) == end)[:NOTICES_PER_TICK]
    if not due:
        return 0
    with transaction.atomic():
        bulk.update_many(
            [bulk.Row(pk=lid, ending_notified_for=ends[lid][0]) for lid in due],
            ["ending_notified_for"],
            model=Lease,
        )
        outbox.append_many(
            outbox.event(
                "lease.ending", now, lease=lid,
                data={"end": end.isoformat(), "in_s": round((end - now).total_seconds(), 1), "notify_before_s": before},
            )
            for lid in due
            for end, before in [ends[lid]]
        )  # fmt: skip
        for lid in due:
            events.send_on_commit("lease-changed", lease=lid)
    return len(due)


def advance(now: datetime, background: forecasting.Background | None = None) -> None:
    """The lease part of the tick: starts and ends due reservations, processes the queue and re-evaluates; then,
    outside the plan lock, the queue forecast its pass handed off (a large queue's: leases/forecasting.py), here
    or, given `background` (the embedded loop's), on a thread of its own once this tick has released the runner."""
    with forecasting.runner() as may_forecast:
        with planning(now) as plan:
            if may_forecast:
                plan.tick = background.may_take if background is not None else _always
            plan.scheduler.advance(plan.t, plan.excluded)
            for lease_id, reason in plan.scheduler.replaced:
                # Its history step and its message say why (the applier writes them from the pass's journal).
                lease = Lease.objects.get(pk=lease_id)
                audit.record(at=now, actor=None, action="lease.replace", target=lease, reason=reason)
        if plan.forecast is not None and background is None:
            forecasting.complete(plan.forecast)
    if plan.forecast is not None and background is not None:
        background.start(plan.forecast)


def _always() -> bool:
    return True


def _tick_failed(now: datetime, exc: Exception) -> None:
    metrics.inc("slotkeeper_tick_failures_total")
    error = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        with transaction.atomic():
            SchedulerState.objects.get_or_create(pk=1)
            SchedulerState.objects.filter(pk=1).update(
                tick_failures=F("tick_failures") + 1, tick_failed_at=now, tick_error=error
            )
            if not Alert.objects.filter(kind="tick_failed", resolved_at=None).exists():
                raise_alert("tick_failed", f"the scheduler's tick failed: {error}", now)
    except Exception:
        # The database itself may be what failed; the log still says so.
        log.exception("could not record the failed tick")


def _fleet_disruption_alert(now: datetime) -> None:
    """An open alert while the sweep finds the fleet disrupted (and declares no node dead), resolved after."""
    state = SweepState.objects.filter(pk=1).first()
    open_alert = Alert.objects.filter(kind="fleet_disrupted", resolved_at=None).exists()
    if state is not None and state.disrupted_since is not None and not open_alert:
        raise_alert("fleet_disrupted", state.disruption_note or "much of the fleet went silent at once", now)
    elif (state is None or state.disrupted_since is None) and open_alert:
        resolve_open("fleet_disrupted", now, "the fleet is heard from again")
