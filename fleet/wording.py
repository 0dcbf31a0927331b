"""How the console words what the placer and the scheduler say: reason codes as short phrases, a stored message cut to
its one-line headline and its detail lines, figures in user units, and a report's verdicts as one line per node.

The stored messages stay as they are (the API returns them, audit rows keep them); this module only decides how a page
shows them. A failed placement's message is a headline and a line per node ("fleet at capacity: …\\n  12 node(s): …\\n
  tank: dead: …"), which a page printed as one paragraph: four of those on the reschedule result page were a wall of
forty lines (issue 13, item 3). Pages now show the headline on one line and put the rest behind a disclosure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from fleet.views import memory

# A reason code (fleet.capacity.ReasonCode, the checks' codes) or a placement outcome, as an operator says it.
WORDS = {
    "at_capacity": "at capacity",
    "no_disk": "out of disk",
    "missing_capability": "lacks a capability",
    "too_small": "too small for one VM",
    "reserved": "booked by other leases",
    "anti_affinity": "its group keeps these VMs apart",
    "affinity": "its group keeps these VMs together",
    "draining": "draining",
    "offline": "offline",
    "dead": "declared dead",
    "no_recent_health": "no recent heartbeat",
    "capacity_unknown": "memory use unknown",
    "placed": "placed",
    "fleet_at_capacity": "fleet at capacity",
    "no_capable_node": "no capable node",
    "fleet_unreadable": "fleet unreadable: check the node agents",
    "unplaced": "not placed",
    # A lease's states that are two words in code (leases/lifecycle.py, LeaseState); the others read as they are.
    "suspended_pending": "suspended, pending",
    "suspended_queued": "suspended, queued",
    "suspended_scheduled": "suspended, resume scheduled",
    "resumed_ready": "resumed, ready",
    "rejected_by_user": "rejected by its user",
    # A lease's type.
    "best_effort": "best-effort",
    "advance_reservation": "advance reservation",
    # What raised an alert (leases/alerts.py, raise_alert), and why a reschedule was proposed.
    "node_dead": "node declared dead",
    "drain": "node drained",
    "restarts_exhausted": "restarts used up",
    "reschedule_budget_spent": "moves used up",
    "instance_held": "instance held",
    "failed_placement": "placement failed",
    "reservation_stranded": "reservation stranded",
    "lease_isolated": "lease isolated",
    "tick_failed": "scheduler tick failed",
    "fleet_disrupted": "fleet disrupted",
}
# The few phrases whose verb follows a count: "2 lack a capability", not "2 lacks a capability".
PLURAL = {"missing_capability": "lack a capability"}

_MIB = re.compile(r"(?<![\w.,])(\d[\d,]*) MiB\b")
# The placer's at-capacity sentence names its memory figures once, then lists more without the unit:
# "effective use 59942 of 31757 MiB: committed 59942, observed 17707".
_BARE_MIB = re.compile(r"\b(effective use|committed|observed) (\d+)\b(?! ?(?:MiB|GiB|%|cores?|of \d+ cores))")
_ONE = re.compile(r"\b1 (core|instance|node|vnode|VM)(?:s|\(s\))")
_MANY = re.compile(r"\b(\d+) (instance|node|vnode)\(s\)")


def words(code: str | None) -> str:
    """A reason code or an outcome in words: "at_capacity" reads "at capacity"."""
    if not code:
        return ""
    return WORDS.get(code, code.replace("_", " "))


def counted(n: int | str, code: str) -> str:
    """A count of a reason in words: "1 lacks a capability", "2 lack a capability", "8 at capacity"."""
    if str(n) != "1" and code in PLURAL:
        return f"{n} {PLURAL[code]}"
    return f"{n} {words(code)}"


def coded(code: str | None) -> SafeString:
    """A code where a person reads it: its words, and the code itself as the tooltip (and in data-code) when the two
    differ, so "suspended_queued" reads "suspended, queued" and the code the API returns is one hover away."""
    said = words(code)
    if not code or said == code:
        return escape(said)
    return format_html('<span title="{}" data-code="{}">{}</span>', code, code, said)


def subject_words(subject: str | None) -> str:
    """What a placement report was about ("lease:12", "reschedule:web-3") as a person reads it: "lease 12",
    "reschedule of instance web-3"; a subject of another shape is shown as it is."""
    if not subject:
        return ""
    kind, sep, ident = subject.partition(":")
    if not sep:
        return subject
    return f"reschedule of instance {ident}" if kind == "reschedule" else f"{kind} {ident}"


def action_words(action: str | None) -> str:
    """An audit action ("node.declare_dead", `slotkeeper.audit.record`) as its noun and verb: "node: declare dead".
    Spaces for underscores only: WORDS says what a code means in a sentence of its own ("drain" is a reschedule's
    cause, "node drained"), and "node: node drained" is what it made of "node.drain"."""
    if not action:
        return ""
    noun, _, verb = action.partition(".")
    return f"{noun.replace('_', ' ')}: {verb.replace('_', ' ')}" if verb else noun.replace("_", " ")


def detail_words(details: Mapping | None) -> str:
    """An audit row's details for the page: "type: best-effort · accepted: yes · …", not "type=best_effort"; the CSV
    export keeps the JSON."""
    if not details:
        return ""

    def value(v) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        if v is None:
            return "none"
        if isinstance(v, str) and _CODE.fullmatch(v):
            return words(v)
        return str(v)

    return " · ".join(f"{words(str(k))}: {value(v)}" for k, v in details.items())


_CODE = re.compile(r"[a-z]+(?:_[a-z]+)+")


def mem(mib: int) -> str:
    """Memory as the reports' sentences say it (fleet/reports.py): whole GiB as "6 GiB", the rest as the board does."""
    return f"{mib // 1024} GiB" if mib >= 1024 and mib % 1024 == 0 else memory(mib)


def cores_of(hundredths: int | float) -> str:
    """A reservation's CPU, stored in hundredths of a core (800), as cores: "8 cores", "0.5 cores"."""
    n = (hundredths or 0) / 100
    return f"{n:g} core{'' if n == 1 else 's'}"


def user_units(text: str) -> str:
    """Memory figures the placer writes in MiB, in the console's units (whole GiB, GiB from 10 GiB up, thousands
    separated), and counts in plain English: "6144 MiB" reads "6 GiB", "59942 MiB" "58.5 GiB", "1 cores" "1 core",
    "2 node(s)" "2 nodes"."""
    text = _BARE_MIB.sub(lambda m: f"{m[1]} {m[2]} MiB", text)
    text = _MIB.sub(lambda m: mem(int(m[1].replace(",", ""))), text)
    text = _ONE.sub(lambda m: f"1 {m[1]}", text)
    return _MANY.sub(lambda m: f"{m[1]} {m[2]}s", text)


def headline(message: str) -> str:
    """The first line of a stored message: what happened, without the per-node lines under it."""
    return next((line.strip() for line in (message or "").splitlines() if line.strip()), "")


def brief(message: str) -> str:
    """The gist of a message for a table cell: its headline's first clause, without a "still pending:" the row's
    status badge already says."""
    return headline(message).removeprefix("still pending: ").split("; ", 1)[0]


def detail_lines(message: str) -> list[str]:
    """The lines under the headline (the tally, then one per node), each on its own."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[1:]


_NODE_LINE = re.compile(r"^(?P<node>[^:\s]+): (?P<code>[a-z_]+): (?P<rest>.*)$")
_COUNT = re.compile(r"\b(\d+) ([a-z]+(?:_[a-z]+)+|dead|offline|draining|reserved|affinity)\b")


def readable_line(line: str) -> str:
    """One detail line of a placer message, said in words: "tank: dead: the node stopped reporting" reads "tank: not
    here: declared dead (the node stopped reporting)", and the tally's codes ("8 at_capacity") read as words."""
    m = _NODE_LINE.match(line.strip())
    if m and m["code"] in WORDS:
        return user_units(f"{m['node']}: not here: {words(m['code'])} ({m['rest']})")
    return user_units(_COUNT.sub(lambda c: counted(c[1], c[2]), line.strip()))


# A time the placer or the scheduler wrote into a sentence ("runs 2026-11-30 15:40:54 UTC–2026-11-30 16:00:54 UTC").
_TIME = re.compile(r"\b(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2})(:\d{2})?(?:\+00:00| ?UTC|Z)")


def with_times(text: str) -> SafeString:
    """The text, escaped, with each UTC time in it as a <time> element, so the console's UTC / local switch shows
    it in the operator's zone like every other time on the page (static/console/console.js, showTimes)."""

    def element(m: re.Match) -> str:
        iso = f"{m[1]}T{m[2]}{m[3] or ':00'}Z"
        return f'<time datetime="{iso}">{m[1]} {m[2]}{m[3] or ""} UTC</time>'

    return mark_safe(_TIME.sub(element, str(escape(text))))  # noqa: S308 (escaped first; the pattern adds no markup from the text)


def figures(numbers: Mapping | None) -> str:
    """A verdict's numbers in user units ("needs 6 GiB · 4 GiB free of 10 GiB allocatable"), not as the stored
    key=value pairs ("dimension=mem need=6144 free=4096 allocatable=10240")."""
    if not numbers or "dimension" not in numbers:
        return ""
    dim = numbers["dimension"]

    def amount(value) -> str:
        if value is None:
            return "?"
        if dim == "cpu":
            return f"{value:g} core{'' if value == 1 else 's'}"
        if dim == "disk":
            return f"{value:,} GiB disk"
        return mem(int(value))

    out = f"needs {amount(numbers.get('need'))} · {amount(max(numbers.get('free') or 0, 0))} free"
    if numbers.get("allocatable") is not None:
        out += f" of {amount(numbers['allocatable'])} allocatable"
    return out


# A lease's type, as the report of its request names it.
KINDS = {"best_effort": "best-effort", "advance_reservation": "advance reservation", "immediate": "immediate"}


def request_words(request: Mapping | None) -> str:
    """A stored placement request as a person says it. Two forms are stored: what the scheduler was asked
    (leases/planning/reporting.py, `report_row`: {"type", "vnodes": [...], "duration_s"}; every decision's and
    preview's report) reads "best-effort, 2 × (1 core, 2 GiB, 5 GiB disk) for 20 min"; the placer's form
    ({'mem_mib': 2048, 'cpu_cores': 1.0, 'count': 1, ...}) reads "1 × (1 core, 2 GiB, 5 GiB disk), preferred node
    gpu-01"."""
    if not request:
        return ""
    if "vnodes" in request or "type" in request:
        shapes: dict[str, int] = {}
        for vnode in request.get("vnodes") or ():
            size = _size(vnode)
            shapes[size] = shapes.get(size, 0) + 1
        parts = [KINDS.get(request.get("type") or "", words(request.get("type")))]
        parts.append(" + ".join(f"{n} × ({size})" for size, n in shapes.items()))
        out = ", ".join(p for p in parts if p)
        if request.get("duration_s"):
            out += f" for {span(request['duration_s'])}"
        return out
    out = f"{request.get('count', 1)} × ({_size(request)})"
    if request.get("capabilities"):
        out += f", needs {', '.join(request['capabilities'])}"
    if request.get("preferred_node"):
        out += f", preferred node {request['preferred_node']}"
    return out


def _size(spec: Mapping) -> str:
    size = []
    if spec.get("cpu_cores"):
        n = spec["cpu_cores"]
        size.append(f"{n:g} core{'' if n == 1 else 's'}")
    if spec.get("mem_mib"):
        size.append(mem(int(spec["mem_mib"])))
    if spec.get("disk_gib"):
        size.append(f"{spec['disk_gib']:,} GiB disk")
    return ", ".join(size)


def span(seconds: float) -> str:
    """A duration as a person says it: "45 s", "20 min", "2 h", "1 h 30 min", "3 d 4 h"."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min"


def tally(counts: Mapping[str, int]) -> str:
    """A report's counts per reason code, most first: "8 at capacity, 2 declared dead"."""
    # A report's counts also hold "evaluated" (every node) and "fit" (may be 0): neither is a reason.
    ordered = sorted(
        ((code, n) for code, n in counts.items() if n and code != "evaluated"), key=lambda kv: (-kv[1], kv[0])
    )
    return ", ".join(counted(n, code) for code, n in ordered)


@dataclass(frozen=True)
class VerdictLine:
    """One node's verdict as one line: which applies is always said, never a node name beside a bare code."""

    node: str
    node_id: int | None
    fit: bool
    chosen: bool
    code: str
    verdict: str  # "placed here", "fits", "not here: at capacity"
    reason: str  # the sentence in user units, for the unfit

    @property
    def kind(self) -> str:
        return "chosen" if self.chosen else "fit" if self.fit else "unfit"


def verdict_lines(rows: Iterable[Mapping], limit: int) -> tuple[list[VerdictLine], int]:
    """A report's rows (PlacementReport.rows, in rank order) as lines, the first `limit` of them, and how many more
    there are."""
    rows = list(rows)
    out = []
    for row in rows[:limit]:
        code = row.get("reason_code") or ""
        chosen = bool(row.get("chosen"))
        fit = bool(row.get("fit"))
        verdict = "placed here" if chosen else "fits" if fit else f"not here: {words(code)}"
        out.append(
            VerdictLine(
                node=row["node"],
                node_id=row.get("node_id") or None,
                fit=fit,
                chosen=chosen,
                code=code,
                verdict=verdict,
                reason="" if fit else user_units(row.get("reason") or ""),
            )
        )
    return out, max(0, len(rows) - limit)
