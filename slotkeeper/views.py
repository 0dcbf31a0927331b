"""The audit feed in the console: who did what, when and why, filtered by URL parameters, and the same filters as
a CSV export. One filter function serves both, so the export is exactly the page an operator is looking at."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode

from django.db.models import Q, QuerySet
from django.http import QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.views.decorators.vary import vary_on_headers

from slotkeeper.decorators import role_required
from slotkeeper.models import AuditEntry

PAGE = 200
CSV_COLUMNS = ("at", "actor", "action", "target_type", "target_id", "target", "reason", "details")


@dataclass(frozen=True)
class AuditFilters:
    actor: str = ""
    action: str = ""
    target: str = ""
    since: str = ""
    until: str = ""

    @classmethod
    def from_query(cls, params: QueryDict) -> AuditFilters:
        return cls(**{name: params.get(name, "").strip() for name in cls.__dataclass_fields__})

    def query_string(self) -> str:
        return urlencode({k: v for k, v in self.__dict__.items() if v})

    def active(self) -> bool:
        return any(self.__dict__.values())


def aware(when: datetime) -> datetime:
    return when if timezone.is_aware(when) else when.replace(tzinfo=UTC)


def _day_or_moment(text: str) -> tuple[date | None, datetime | None]:
    """A bare date, or else a date and time, or neither. Text shaped like one but not a real one (2026-13-45, a
    day past 9999-12-31) is neither: Django's parsers raise for it, and the audit page answered 500."""
    try:
        day = parse_date(text) if len(text) == 10 else None
        return (day, None) if day is not None else (None, parse_datetime(text))
    except (ValueError, OverflowError):
        return None, None


def since_q(text: str) -> Q:
    day, when = _day_or_moment(text)
    when = datetime.combine(day, time.min) if day else when
    return Q(at__gte=aware(when)) if when else Q()


def until_q(text: str) -> Q:
    # A bare date means the whole of that day, so `since=until=<day>` shows the day rather than nothing. (Checked
    # first: parse_datetime reads "2026-11-30" as that day's midnight.)
    day, when = _day_or_moment(text)
    if day is not None:
        return Q(at__lt=aware(datetime.combine(day, time.min) + timedelta(days=1))) if day < date.max else Q()
    return Q(at__lte=aware(when)) if when else Q()


def target_q(target: str) -> Q:
    # "node:7" names one object exactly; anything else searches labels, so "tank" finds "node tank".
    kind, _, ident = target.partition(":")
    if ident and kind.isidentifier():
        return Q(target_type=kind, target_id=ident)
    return Q(target_label__icontains=target)


def filtered(f: AuditFilters) -> QuerySet[AuditEntry]:
    entries = AuditEntry.objects.all()
    if f.actor:
        entries = entries.filter(actor_label__icontains=f.actor)
    if f.action:
        # "node." selects a family of actions, "node.drain" exactly one.
        entries = (
            entries.filter(action__startswith=f.action)
            if f.action.endswith(".")
            else entries.filter(action=f.action)
        )
    if f.target:
        entries = entries.filter(target_q(f.target))
    return entries.filter(since_q(f.since), until_q(f.until))


def known_actions() -> list[str]:
    return list(AuditEntry.objects.order_by("action").values_list("action", flat=True).distinct())


@role_required("viewer")
@vary_on_headers("HX-Request")
def audit_feed(request):
    f = AuditFilters.from_query(request.GET)
    entries = list(filtered(f)[: PAGE + 1])
    context = {
        "entries": entries[:PAGE],
        "more": len(entries) > PAGE,
        "filters": f,
        "query": f.query_string(),
        "actions": known_actions(),
        "page": PAGE,
    }
    template = "audit/_feed_table.html" if request.htmx else "audit/feed.html"
    return render(request, template, context)


class _Echo:
    """csv.writer wants a file; this one hands each line straight back, so the export streams row by row."""

    def write(self, value: str) -> str:
        return value


def spreadsheet_safe(value: object) -> str:
    # A reason typed as "=HYPERLINK(...)" would run as a formula when the export is opened in a spreadsheet
    # (CSV injection); a leading apostrophe keeps it text and is what spreadsheets themselves do.
    text = "" if value is None else str(value)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_rows(entries: QuerySet[AuditEntry]) -> Iterator[list[str]]:
    yield list(CSV_COLUMNS)
    for e in entries.iterator(chunk_size=1000):
        values = (e.at.isoformat(), e.actor_label, e.action, e.target_type, e.target_id, e.target_label)
        # `details` as JSON, as the API gives it (it was Python's printout of a dict: single quotes, True, None).
        details = json.dumps(e.details, sort_keys=True, default=str) if e.details else ""
        yield [spreadsheet_safe(v) for v in (*values, e.reason, details)]


@role_required("viewer")
def audit_csv(request):
    f = AuditFilters.from_query(request.GET)
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in csv_rows(filtered(f))), content_type="text/csv; charset=utf-8"
    )
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="slotkeeper-audit-{stamp}.csv"'
    return response
