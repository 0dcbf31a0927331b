"""Workload readers: the lease requests of a trace file, as plain values for replay and benchmarks.

This module owns the file formats of SEMANTICS §7: Haizea's LWF (XML), the Parallel Workloads Archive's
SWF (converted by haizea-swf2lwf's rules, §7.3), the pre-1.0 one-line AR injection files (§7.2), and the
resources strings of Haizea configs ("4 CPU:100 Memory:1024"). It decides nothing about scheduling: it says
what was asked.

Times are seconds after the workload start. Lease ids are the file's own (SEMANTICS §10 Q15). A file that
cannot be read raises TraceError, whose message is one line naming the file and the line, so an operator can
go straight to it. PURE: no Django.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from xml.etree.ElementTree import Element, TreeBuilder
from xml.parsers import expat

from leases.slottable import Res

BEST_EFFORT = "best_effort"
ADVANCE_RESERVATION = "advance_reservation"
IMMEDIATE = "immediate"
DEADLINE = "deadline"

# Haizea's resource type names (LWF <res type=…>, config resources strings) -> Res fields.
RESOURCE_NAMES = {"CPU": "cpu", "Memory": "mem", "Disk": "disk", "Net-in": "net_in", "Net-out": "net_out"}

SWF_FIELDS = 18
INJECTION_FIELDS = 10


@dataclass(frozen=True)
class TraceLease:
    id: int
    type: str
    submit_s: float
    start_s: float | None
    deadline_s: float | None
    duration_s: float
    real_duration_s: float | None
    vnodes: tuple[Res, ...]
    preemptible: bool = True
    image: str | None = None
    image_size_mb: int | None = None
    user: str | None = None


@dataclass(frozen=True)
class Trace:
    path: str
    name: str
    site: tuple[Res, ...] | None
    leases: tuple[TraceLease, ...]
    # Ids of SWF jobs left out by the swf2lwf rules (cancelled while queued), so a report can say how many
    # jobs the file held, not only how many leases it gave.
    skipped: tuple[int, ...] = ()
    # Ids of the leases an injection file added (merge_traces), so outputs can tell them from the workload's.
    injected: tuple[int, ...] = ()
    injection: str | None = None  # the injection file's name, when one was merged in


class TraceError(Exception):
    """An unreadable trace. str() is "FILE:LINE: problem", one line."""

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = " ".join(problem.split())
        super().__init__(f"{self.path}:{line}: {self.problem}")


# ----------------------------------------------------------------------------------------------- times

_RELTIME = re.compile(r"(?:(\d+):)?(\d+):(\d+):(\d+(?:\.\d*)?)")


def parse_reltime(text: str) -> float:
    """Seconds in "HH:MM:SS[.ss]" or "DD:HH:MM:SS[.ss]"; ValueError otherwise."""
    m = _RELTIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not HH:MM:SS[.ss] or DD:HH:MM:SS[.ss]")
    days, hours, minutes, seconds = m.groups()
    return ((int(days or 0) * 24 + int(hours)) * 60 + int(minutes)) * 60 + float(seconds)


# ----------------------------------------------------------------------------------------------- resources


def resource_tuple(amounts: Iterable[tuple[str, int]]) -> Res:
    """A Res from Haizea (type name, amount) pairs; ValueError naming an unknown type."""
    fields: dict[str, int] = {}
    for name, amount in amounts:
        field = RESOURCE_NAMES.get(name)
        if field is None:
            # Dropping an unknown resource would let replay place VMs on nodes that lack it.
            raise ValueError(f"resource type {name!r} is not one of {', '.join(RESOURCE_NAMES)}")
        fields[field] = fields.get(field, 0) + amount
    return Res(**fields)


def parse_resources(spec: str) -> tuple[Res, ...]:
    """Nodes of a config's resources string, "<n> CPU:100 Memory:1024"; ValueError if malformed.

    Haizea's documentation writes the pairs comma-separated while its parser splits on whitespace; both are
    read.
    """
    count, *pairs = spec.replace(",", " ").split() or ["?"]
    if not count.isdigit() or int(count) < 1 or not pairs:
        raise ValueError(f"resources {spec!r} is not '<nodes> CPU:<amount> Memory:<amount> ...'")
    amounts = []
    for pair in pairs:
        name, _, amount = pair.partition(":")
        if not amount.isdigit():
            raise ValueError(f"resources {spec!r}: {pair!r} is not TYPE:AMOUNT")
        amounts.append((name, int(amount)))
    return (resource_tuple(amounts),) * int(count)


# ----------------------------------------------------------------------------------------------- LWF


class _Lwf:
    """One LWF document: the element tree plus each element's line, for messages that point at the file."""

    def __init__(self, path: str, data: bytes) -> None:
        self.path = path
        self.lines: dict[Element, int] = {}
        builder = TreeBuilder()
        parser = expat.ParserCreate()

        def start(tag: str, attrs: dict[str, str]) -> None:
            self.lines[builder.start(tag, attrs)] = parser.CurrentLineNumber

        parser.StartElementHandler = start
        parser.EndElementHandler = builder.end
        try:
            parser.Parse(data, True)
        except expat.ExpatError as e:
            raise TraceError(path, e.lineno, f"not well-formed XML: {expat.ErrorString(e.code)}") from None
        self.root: Element = builder.close()

    def fail(self, elem: Element, problem: str) -> TraceError:
        return TraceError(self.path, self.lines[elem], problem)

    def child(self, elem: Element, tag: str) -> Element:
        found = elem.find(tag)
        if found is None:
            raise self.fail(elem, f"<{elem.tag}> has no <{tag}>")
        return found

    def attr(self, elem: Element, name: str) -> str:
        value = elem.get(name)
        if value is None:
            raise self.fail(elem, f"<{elem.tag}> has no {name} attribute")
        return value

    def time(self, elem: Element, name: str = "time") -> float:
        try:
            return parse_reltime(self.attr(elem, name))
        except ValueError as e:
            raise self.fail(elem, f"<{elem.tag}> {name}: {e}") from None

    def whole(self, elem: Element, name: str) -> int:
        value = self.attr(elem, name)
        if not value.strip().isdigit():
            raise self.fail(elem, f"<{elem.tag}> {name}={value!r} is not a whole number")
        return int(value)

    def optional_time(self, elem: Element, tag: str) -> float | None:
        found = elem.find(tag)
        return None if found is None else self.time(found)


def _res_amount(doc: _Lwf, res: Element) -> int:
    # A multi-instance resource (two CPUs) lists <instance amount=…/> children; Res holds their sum.
    instances = res.findall("instance")
    if instances:
        return sum(doc.whole(i, "amount") for i in instances)
    return doc.whole(res, "amount")


def _node_sets(doc: _Lwf, nodes: Element) -> tuple[Res, ...]:
    out: list[Res] = []
    for node_set in nodes.findall("node-set"):
        amounts = [(doc.attr(r, "type"), _res_amount(doc, r)) for r in node_set.findall("res")]
        try:
            out.extend((resource_tuple(amounts),) * doc.whole(node_set, "numnodes"))
        except ValueError as e:
            raise doc.fail(node_set, str(e)) from None
    if not out:
        raise doc.fail(nodes, "<nodes> has no <node-set> with numnodes >= 1")
    return tuple(out)


def _lease_type(doc: _Lwf, lease: Element) -> tuple[str, float | None, float | None]:
    """(type, start_s, deadline_s): the type is derived from <start> and <deadline> (SEMANTICS §1.2)."""
    start = doc.child(lease, "start")
    deadline = doc.optional_time(lease, "deadline")
    exact = start.find("exact")
    if exact is not None:
        return (DEADLINE if deadline is not None else ADVANCE_RESERVATION), doc.time(exact), deadline
    if deadline is not None:
        # Haizea 1.1 would silently treat this as best-effort and never look at the deadline.
        raise doc.fail(lease, "a <deadline> needs an exact <start>")
    if start.find("now") is not None:
        return IMMEDIATE, None, None
    if len(start):
        raise doc.fail(start, f"<start> holds <{start[0].tag}>, not <exact> or <now>")
    return BEST_EFFORT, None, None


def _software(doc: _Lwf, lease: Element) -> tuple[str | None, int | None]:
    image = lease.find("software/disk-image")
    if image is None:
        return None, None
    return doc.attr(image, "id"), doc.whole(image, "size")


def _lwf_lease(doc: _Lwf, request: Element, lease: Element, lease_id: int) -> TraceLease:
    kind, start_s, deadline_s = _lease_type(doc, lease)
    image, image_size = _software(doc, lease)
    return TraceLease(
        id=lease_id,
        type=kind,
        submit_s=doc.time(request, "arrival"),
        start_s=start_s,
        deadline_s=deadline_s,
        duration_s=doc.time(doc.child(lease, "duration")),
        real_duration_s=doc.optional_time(request, "realduration"),
        vnodes=_node_sets(doc, doc.child(lease, "nodes")),
        preemptible=lease.get("preemptible", "true").strip().lower() == "true",
        image=image,
        image_size_mb=image_size,
        user=lease.get("user"),
    )


def _lease_ids(doc: _Lwf, leases: list[Element]) -> list[int]:
    """The file's ids; leases without one are numbered after the largest, in file order, so none collide."""
    given: dict[int, Element] = {}
    for lease in leases:
        if lease.get("id") is not None:
            lease_id = doc.whole(lease, "id")
            if lease_id in given:
                first = doc.lines[given[lease_id]]
                raise doc.fail(lease, f"lease id {lease_id} is already used at line {first}")
            given[lease_id] = lease
    fresh = itertools.count(max(given, default=0) + 1)
    return [doc.whole(lease, "id") if lease.get("id") is not None else next(fresh) for lease in leases]


def _site(doc: _Lwf) -> tuple[Res, ...] | None:
    site = doc.root.find("site")
    return None if site is None else _node_sets(doc, doc.child(site, "nodes"))


def read_lwf(path: str | Path) -> Trace:
    doc = _Lwf(str(path), Path(path).read_bytes())
    if doc.root.tag != "lease-workload":
        raise doc.fail(doc.root, f"the root element is <{doc.root.tag}>, not <lease-workload>")
    requests = doc.root.findall("lease-requests/lease-request")
    elements = [doc.child(r, "lease") for r in requests]
    ids = _lease_ids(doc, elements)
    leases = [_lwf_lease(doc, *args) for args in zip(requests, elements, ids, strict=True)]
    return Trace(
        path=str(path),
        name=doc.root.get("name") or Path(path).stem,
        site=_site(doc),
        leases=_by_submit(leases),
    )


def _by_submit(leases: Iterable[TraceLease]) -> tuple[TraceLease, ...]:
    # sorted() is stable, so leases submitted at the same instant keep their file order (FCFS ties).
    return tuple(sorted(leases, key=lambda lease: lease.submit_s))


# ----------------------------------------------------------------------------------------------- SWF

_SWF_NAMES = {1: "job number", 2: "submit time", 4: "run time", 5: "allocated processors",
              8: "requested processors", 9: "requested time", 11: "status", 12: "user id"}  # fmt: skip


def _data_lines(path: str | Path, comment: str) -> Iterator[tuple[int, list[str]]]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            stripped = line.strip()
            if stripped and not stripped.startswith(comment):
                yield lineno, stripped.split()


def _swf_number(path: str | Path, lineno: int, fields: list[str], field: int) -> float:
    """SWF field `field` (1-based, as the SWF documentation numbers them)."""
    try:
        return float(fields[field - 1])
    except ValueError:
        problem = f"field {field} ({_SWF_NAMES[field]}) is {fields[field - 1]!r}, not a number"
        raise TraceError(path, lineno, problem) from None


def _swf_lease(path: str | Path, lineno: int, fields: list[str], vm: Res, scale: int) -> TraceLease:
    def num(field: int) -> float:
        return _swf_number(path, lineno, fields, field)

    processors = num(8) if num(8) > 0 else num(5)
    if processors <= 0 or num(9) <= 0:
        raise TraceError(path, lineno, f"job {int(num(1))} gives no processor count or no requested time")
    run = num(4)
    return TraceLease(
        id=int(num(1)),
        type=BEST_EFFORT,
        submit_s=num(2),
        start_s=None,
        deadline_s=None,
        duration_s=num(9),
        # SWF rounds run times to whole seconds, so 0 means "under a second"; swf2lwf makes it 1 s. A negative
        # run time (a failed job's) is unknown, so replay uses the requested duration.
        real_duration_s=None if run < 0 else max(run, 1.0),
        # swf2lwf floors processors/scale; a job smaller than the scale would become a lease of no VMs, which
        # replay would count as done at submission, so it keeps one VM.
        vnodes=(vm,) * max(int(processors) // scale, 1),
        user=None if num(12) < 0 else str(int(num(12))),
    )


def read_swf(path: str | Path, *, cpu: int = 100, memory_mb: int = 1024, scale: int = 1) -> Trace:
    """Best-effort leases from an SWF log by haizea-swf2lwf's rules (SEMANTICS §7.3).

    Each job asks for one VM of `cpu` and `memory_mb` per requested processor, divided by `scale`.
    """
    vm = Res(cpu=cpu, mem=memory_mb)
    leases: list[TraceLease] = []
    skipped: list[int] = []
    for lineno, fields in _data_lines(path, ";"):
        if len(fields) != SWF_FIELDS:
            raise TraceError(path, lineno, f"an SWF job has {SWF_FIELDS} fields, this line has {len(fields)}")
        if _swf_number(path, lineno, fields, 4) < 0 and _swf_number(path, lineno, fields, 11) == 5:
            # Cancelled while still queued: it never ran, so it is no request for capacity.
            skipped.append(int(_swf_number(path, lineno, fields, 1)))
            continue
        leases.append(_swf_lease(path, lineno, fields, vm, scale))
    return Trace(path=str(path), name=Path(path).stem, site=None, leases=_by_submit(leases),
                 skipped=tuple(skipped))  # fmt: skip


# ----------------------------------------------------------------------------------------------- injections


def _injection_lease(path: str | Path, lineno: int, fields: list[str], lease_id: int) -> TraceLease:
    """`reqTime startTime duration realDuration numNodes CPU mem disk 'image' imageSize` (SEMANTICS §7.2)."""
    try:
        submit, start, duration, real = (float(f) for f in fields[:4])
        nodes, cpus, mem, disk, image_size = (int(f) for f in fields[4:8] + fields[9:])
    except ValueError as e:
        raise TraceError(path, lineno, f"not a legacy injection line: {e}") from None
    if disk:
        # The unit is undocumented and the field is 0 in every shipped file: a guess would size disks wrongly.
        raise TraceError(path, lineno, f"disk {disk}: the legacy disk unit is unknown, only 0 is read")
    return TraceLease(
        id=lease_id,
        type=ADVANCE_RESERVATION,
        submit_s=submit,
        start_s=start,
        deadline_s=None,
        duration_s=duration,
        real_duration_s=real,
        vnodes=(Res(cpu=100 * cpus, mem=mem),) * nodes,
        preemptible=False,
        image=fields[8].strip("'\""),
        image_size_mb=image_size,
    )


def read_injection(path: str | Path) -> Trace:
    """ARs of a pre-1.0 one-line injection file (the HPDC'08 injections), numbered 1..n in file order."""
    leases: list[TraceLease] = []
    for lineno, fields in _data_lines(path, "#"):
        if len(fields) != INJECTION_FIELDS:
            problem = f"a legacy injection line has {INJECTION_FIELDS} fields, this one has {len(fields)}"
            raise TraceError(path, lineno, problem)
        leases.append(_injection_lease(path, lineno, fields, len(leases) + 1))
    return Trace(path=str(path), name=Path(path).stem, site=None, leases=_by_submit(leases))


# ----------------------------------------------------------------------------------------------- any


def _sniff(path: str | Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096).lstrip()
    if head.startswith("<"):
        return "lwf"
    if Path(path).suffix.lower() == ".swf" or head.startswith(";"):
        return "swf"
    first = head.split("\n", 1)[0].split()
    return "injection" if len(first) == INJECTION_FIELDS else "swf"


def read_trace(path: str | Path) -> Trace:
    """Any supported trace, recognised by its content.

    XML is LWF; an .swf file or 18 fields is SWF; 10 fields is a legacy injection (named .lwf too).
    """
    return {"lwf": read_lwf, "swf": read_swf, "injection": read_injection}[_sniff(path)](path)


def merge_traces(base: Trace, injection: Trace) -> Trace:
    """The base workload with an injection's leases merged in submit order (Haizea's `injectionfile`).

    Haizea's rules for injected leases: each has an exact start (an advance reservation, or a deadline lease),
    none is preemptible (HPDC'08: "ARs are non-preemptible"), and their ids are kept apart from the
    workload's. Injected leases keep their ids unless one collides with a base id (multi/inj1.lwf and
    withprematureend.lwf both start at 1, the Blue Horizon injections at 1 while SWF job numbers start at
    13); then all of them are shifted past the base's largest id, keeping their order, because two leases
    with one id would share reservations in the slot table. A lease without an exact start raises ValueError:
    Haizea would queue it as best-effort work, which is not what an injection is for.
    """
    loose = [lease.id for lease in injection.leases if lease.start_s is None]
    if loose:
        raise ValueError(
            f"{injection.path}: an injection holds leases with an exact start; lease(s) "
            f"{', '.join(map(str, loose[:5]))} have none"
        )
    base_ids = {lease.id for lease in base.leases}
    injected = tuple(replace(lease, preemptible=False) for lease in injection.leases)
    if any(lease.id in base_ids for lease in injected):
        offset = max(base_ids)
        injected = tuple(replace(lease, id=lease.id + offset) for lease in injected)
    return replace(
        base,
        leases=_by_submit(base.leases + injected),
        injected=base.injected + tuple(lease.id for lease in injected),
        injection=Path(injection.path).stem,
    )
