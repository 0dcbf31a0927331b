"""The marks drawn inside a slot-table row, one function per kind of mark, each returning its SVG markup:

- `reservation_bar`: one allocation of a reservation (a bar in its lane, linked to its lease);
- `utilisation_strip`: reservations too thin to draw one by one, folded into a shaded strip that still names them;
- `more_control`: a row's "+N more" (the reservations its folded lanes leave out) or "show fewer".

Layout (which lane, which y) is decided in leases/slotchart.py; these functions only draw what they are given, so a
new kind of mark (the forecast's estimated bars, say) is one more function here and one more pass in
slotchart.layout_row, and touches neither of the two above.

Markup is built with f-strings rather than a template loop (the loop's per-value formatting was 80 % of a
10,000-bar render); every text from the database goes through escape(). Every mark is a grid cell holding a link
whose accessible name says what it is, out of the tab order (tabindex -1): the chart is one tab stop and the arrow
keys move between marks (console.js). Its id lets a live morph keep each mark the same element, so a focused bar
stays focused."""

from __future__ import annotations

import re
import zlib
from datetime import datetime
from html import escape
from typing import NamedTuple

from django.utils.text import Truncator

# Roughly one character of the 10 px bar font in viewBox units: bars narrower than a few characters get no label.
CHAR_W = 6.2


class Alloc(NamedTuple):
    """One allocation as window_allocations reads it. A named tuple: a frozen dataclass took 3 us to build (a
    setattr per field), 1.5 ms of a 500-bar row page."""

    id: int
    node_id: int
    start: datetime
    end: datetime
    mem_mib: int
    cpu: int
    kind: str
    status: str
    lease_id: int
    lease_name: str
    lease_type: str


def shorten(text: str, room: int) -> str:
    """The text cut to `room` characters at a word boundary, with "…" when cut, or nothing when not even the
    first word fits. Whole words only: a link's accessible name must contain the words it shows (a voice-control
    user says what they see, and axe's label-content-name-mismatch fails "render-fa…" inside "render-farm")."""
    if len(text) <= room:
        return text
    cut = text[: max(0, room - 1)]
    if text[len(cut)].isalnum():
        cut = re.sub(r"[^\W_]+$", "", cut)
    cut = cut.rstrip(" -_.,:")
    return cut + "…" if cut else ""


def fits(text: str, width: float) -> str:
    """The text cut to what a bar of this width can show, or nothing when not even a short name fits."""
    room = int((width - 6) / CHAR_W)
    return shorten(text, room) if room >= 3 else ""


def when(start: datetime, end: datetime) -> str:
    """A bar's times as a person reads them: the end's date only when it differs from the start's."""
    s, e = start.isoformat(" "), end.isoformat(" ")
    return f"{s[:16]} to {e[11:16] if s[:10] == e[:10] else e[:16]} UTC"


def reservation_bar(
    a: Alloc,
    x: float,
    w: float,
    y: float,
    h: float,
    lane: int,
    node_name: str,
    link: str,
    match: bool = False,
) -> str:
    """One reservation's bar on one node: coloured by its kind, outlined by its lease type, faded when done, its
    lease id and name inside when they fit, a <title> for hover and an accessible name for everything else."""
    kind_of_lease = a.lease_type.replace("_", " ")
    # Times cut from isoformat (the same wall clock as strftime, at a fifth of the cost: five formats a bar were a
    # quarter of a row page's CPU).
    s, e = a.start.isoformat(" "), a.end.isoformat(" ")
    name = escape(a.lease_name)
    title = (
        f"lease {a.lease_id} {name} ({kind_of_lease}): {a.kind} "
        f"{s[:19]}–{e[11:19]} UTC, {a.mem_mib} MiB, {a.cpu / 100:g} cores, {a.status}"
    )
    end = e[11:16] if s[:10] == e[:10] else e[:16]
    label = (
        f"lease {a.lease_id} {name}, {kind_of_lease}, {a.kind} on {escape(node_name)}, "
        f"{s[:16]} to {end} UTC, {a.status}"
    )
    short = fits(f"{a.lease_id} {a.lease_name}", w)
    text = f'<text x="{x + 3:.1f}" y="{y + h - 3:.0f}">{escape(short)}</text>' if short else ""
    matched = " match" if match else ""
    return (
        f'<g role="gridcell"><a href="{link}{a.lease_id}/" class="bar-link" id="alloc-{a.id}" data-roving data-bar '
        f'tabindex="-1" aria-label="{label}"><g class="bar {a.kind} {a.lease_type} {a.status}{matched}" '
        f'data-lease="{a.lease_id}" data-lane="{lane}"><title>{title}</title>'
        f'<rect x="{x:.1f}" y="{y:.0f}" width="{w:.1f}" height="{h:.0f}" rx="2"></rect>{text}</g></a></g>'
    )


def utilisation_strip(
    members: list[Alloc], x: float, w: float, y: float, h: float, fill: float, node_name: str, zoom_link: str
) -> str:
    """Reservations under ~2 px wide, folded into one strip: shaded by the share of its width they cover, and named
    in full in its title and accessible name (how many, of which kinds, which leases), linked to a closer zoom."""
    start = min(a.start for a in members)
    end = max(a.end for a in members)
    kinds: dict[str, int] = {}
    for a in members:
        kinds[a.kind] = kinds.get(a.kind, 0) + 1
    lease_ids = list(dict.fromkeys(a.lease_id for a in members))
    shown = ", ".join(str(i) for i in lease_ids[:12])
    more = f" and {len(lease_ids) - 12} more" if len(lease_ids) > 12 else ""
    what = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    count = len(members)
    noun = "reservation" if count == 1 else "reservations"
    summary = escape(
        f"{count} short {noun} on {node_name}, {when(start, end)} ({what}), "
        f"{fill:.0%} busy: lease{'s' if len(lease_ids) > 1 else ''} {shown}{more}"
    )
    return (
        f'<g role="gridcell"><a href="{escape(zoom_link)}" class="bar-link strip-link" id="strip-{members[0].id}" '
        f'data-roving data-bar tabindex="-1" aria-label="{summary}; zoom in">'
        f'<g class="strip" data-strip data-count="{count}" data-leases="{" ".join(map(str, lease_ids))}">'
        f'<title>{summary}</title><rect x="{x:.1f}" y="{y:.0f}" width="{w:.1f}" height="{h:.0f}" '
        f'fill-opacity="{0.3 + 0.7 * fill:.2f}"></rect></g></a></g>'
    )


def more_control(
    node_id: int,
    node_name: str,
    hidden: list[Alloc],
    folded: int,
    lanes: int,
    expanded: bool,
    href: str,
    url: str,
    y: float,
    max_lanes: int,
) -> str:
    """A row's "+N more" under its name, or "show fewer" once expanded: a link to the table with the row's `expand`
    toggled, followed in place by htmx (the table is morphed and the URL replaced, so the link stays the focused
    element), and a plain link without JavaScript. A grid cell like the bars, reached with the arrow keys; its
    accessible name starts with the words it shows; `data-said` is what console.js announces once it is done."""
    name = escape(node_name)
    noun = "reservation" if folded == 1 else "reservations"
    if expanded:
        text = "show fewer"
        label = f"show fewer: {name} shows every lane; fold it to {max_lanes} lanes"
        tip = f"fold {name} back to {max_lanes} lanes"
        said = f"{name}: every reservation shown, {lanes} lanes"
    else:
        text = f"+{folded} more"
        label = f"+{folded} more: {folded} {noun} of {name} not drawn; show every lane"
        names = [f"lease {a.lease_id} {escape(a.lease_name)} ({a.status})" for a in hidden[:8]]
        rest = f" and {len(hidden) - 8} more" if len(hidden) > 8 else ""
        tip = f"not drawn: {', '.join(names)}{rest}"
        said = f"{name}: {lanes} lane{'s' if lanes != 1 else ''} shown, {folded} {noun} behind +{folded} more"
    url = escape(url)
    return (
        f'<g role="gridcell"><a href="{escape(href)}" class="more-link" id="more-{node_id}" data-roving data-expand '
        f'tabindex="-1" aria-expanded="{"true" if expanded else "false"}" aria-label="{label}" data-said="{said}" '
        f'hx-get="{url}" hx-target="#slot-table" hx-swap="morph" hx-replace-url="{url}" '
        f'hx-sync="#slot-table:queue last"><text class="more" x="14" y="{y + 31:.0f}"><title>{tip}</title>{text}'
        f"</text></a></g>"
    )


def row_backdrop(rows, width: int, label_w: int) -> str:
    """A page's stripes, and the shade of every unavailable row: hidden from assistive tech, drawn under the rows."""
    out = []
    for row in rows:
        even = " even" if row.index % 2 == 0 else ""
        out.append(
            f'<rect class="stripe{even}" x="0" y="{row.y}" width="{width}" height="{row.height}"></rect>'
        )
        if row.node.status != "online":
            out.append(
                f'<rect class="unavailable" x="{label_w}" y="{row.y}" width="{width}" height="{row.height}"></rect>'
            )
    return "".join(out)


def fingerprint(markup: str) -> str:
    """A version of some markup: a live slot table sends the versions it shows and is sent only what moved."""
    return f"{zlib.crc32(markup.encode()):08x}"


def row_group(row, width: int, label_w: int, node_link: str, more: str, marks: str) -> tuple[str, str]:
    """One node's row: its label (a link to the node, with its figures as the accessible name), the over-allocatable
    flag, the status dot, the drain reason's band, and its marks; and its version, the fingerprint of that markup
    (`data-v`, which a live patch compares: leases/slot_patch.py). Its y is in the markup, so a row that moved down
    is a changed row. Built here rather than in a template loop for the same reason as the marks: the loop's
    per-value rendering was a quarter of a row page's CPU."""
    node = row.node
    status = escape(node.status)
    title = escape(row.title)
    y = row.y
    over = (
        f'<text class="over" x="{label_w - 5}" y="{y + 13}" data-over-allocatable aria-hidden="true"><title>over '
        f"allocatable: committed now exceeds allocatable by {escape(row.figures.over_by)}</title>▲ over</text>"
        if row.figures.over
        else ""
    )
    reason = (
        f'<text class="reason" x="{label_w + 6}" y="{y + 12}" aria-hidden="true">'
        f"{escape(Truncator(row.reason).chars(140))}</text>"
        if row.reason
        else ""
    )
    hidden = f' data-hidden="{row.hidden}"' if row.hidden else ""
    attributes = (
        f'class="row {status}" role="row" aria-rowindex="{row.index + 1}" data-node="{escape(node.name)}" '
        f'data-lanes="{row.lanes}"{hidden} id="slot-row-{node.pk}"'
    )
    inside = (
        f'<rect class="hover" x="0" y="{y}" width="{width}" height="{row.height}" aria-hidden="true"></rect>'
        f'<g role="rowheader"><a href="{node_link}{node.pk}/" class="node-link" data-roving '
        f'tabindex="{0 if row.index == 0 else -1}" aria-label="{title}"><text x="14" y="{y + 13}" class="label">'
        f"<title>{title}</title>{escape(row.label)}</text></a>{over}"
        f'<circle class="dot" cx="6" cy="{y + 9}" r="3.5" aria-hidden="true"><title>{status}</title></circle>'
        f"{reason}</g>{more}{marks}"
    )
    version = fingerprint(attributes + inside)
    return f'<g {attributes} data-v="{version}">{inside}</g>', version
