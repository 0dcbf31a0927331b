"""The patch a live slot table asks for (issue 46, item 2): what it must change to show the table now, and nothing
else.

Before, every live event re-rendered every row page the browser had loaded, 294 KiB a page at 1,000 nodes (5.8 MB
with all 20 loaded), for a change to one node. Now the table says what it shows: the window it was drawn for, its
node count, whether it draws the now line, and the versions of its row pages, rows and sections (footer, "ending
soon", queue forecast). Rows are drawn again for that same window (a window following now moves between requests, and
bars drawn for another would not line up with the rest), and only what moved is sent:

- a row whose version (the fingerprint of its markup, y included) moved: so a row that grew a lane is sent, and so
  is every row below it on its page, which moved down;
- a page's frame (its height and stripes) when a row's height on it moved; each page has its own coordinates, so
  the pages after it do not move;
- a section whose version moved; the now line's x, always (a few bytes).

What cannot be patched is answered so (`Unpatchable`), and the browser fetches the table whole as before: a window
that is not the one the table would show, another node count or order of rows (a node added, removed or renamed),
the now line come or gone, more pages loaded than there are. Bytes grow with the rows that changed on screen, not with
the fleet (bench/bench_slot_patch.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString, mark_safe

from leases import slotchart
from leases.slot_marks import fingerprint
from slotkeeper.fields import is_id, whole_number

# A window following now may be this far behind the one a fresh render would draw: the table re-fetches itself every
# 30 s while it follows now, which moves it; a patch for an older window would keep a stale window on screen.
FOLLOW_SLACK = timedelta(seconds=60)
SECTIONS = ("summary", "ending", "forecast")
VERSION = re.compile(r"[0-9a-f]{0,8}")


class BadPatchRequest(ValueError):
    """What the browser sent cannot be read: answered 400 with this message."""


class Unpatchable(Exception):
    """The table on screen is not one a patch can bring up to date: the browser fetches it whole."""


@dataclass(frozen=True)
class Shown:
    """What a live table says it shows."""

    start: datetime  # the window's start it was drawn for
    nodes: int  # the nodes it counts
    now_line: bool
    pages: list[str]  # the versions of its loaded row pages, from the first
    rows: list[tuple[int, str]]  # (node id, version) of every loaded row, in order
    sections: dict[str, str]


def version(raw: str, what: str) -> str:
    if not VERSION.fullmatch(raw):
        raise BadPatchRequest(f'"{raw[:40]}" is not a version of {what}.')
    return raw


def read_shown(data: Mapping[str, str]) -> Shown:
    """The patch request's body, read strictly: the rows must be the ones on screen, in order, or the patch would
    be applied to rows that are not the ones compared."""
    raw_start = data.get("at", "")
    try:
        start = parse_datetime(raw_start.strip())
    except ValueError:  # shaped like a date, not a real one ("2026-02-30")
        start = None
    if start is None or start.tzinfo is None:
        raise BadPatchRequest(
            f'"{raw_start[:40]}" is not the start of a window (a date and time with its zone).'
        )
    nodes = whole_number(data.get("nodes", "").strip())
    if nodes is None:
        raise BadPatchRequest(f'"{data.get("nodes", "")[:40]}" is not a number of nodes.')
    now_line = data.get("now_line", "")
    if now_line not in ("0", "1"):
        raise BadPatchRequest(f'"{now_line[:40]}" does not say whether the now line is drawn (0 or 1).')
    raw_pages = data.get("pages", "")
    pages = [version(v, "a row page") for v in raw_pages.split(",")] if raw_pages else []
    if len(pages) > slotchart.MAX_PAGES:
        raise BadPatchRequest(f"{len(pages):,} row pages: a live table loads at most {slotchart.MAX_PAGES}.")
    rows = []
    raw_rows = data.get("rows", "")
    for item in raw_rows.split(",") if raw_rows else ():
        key, dot, row_version = item.partition(".")
        if not (is_id(key) and dot):
            raise BadPatchRequest(f'"{item[:40]}" is not a row (its node id, a dot and its version).')
        rows.append((int(key), version(row_version, "a row")))
    if len(rows) > len(pages) * slotchart.ROWS_PER_PAGE:
        raise BadPatchRequest(f"{len(rows):,} rows on {len(pages)} row pages of {slotchart.ROWS_PER_PAGE}.")
    sections = {name: version(data.get(name, ""), f"the {name}") for name in SECTIONS}
    return Shown(start, nodes, now_line == "1", pages, rows, sections)


def drawn_for(state: slotchart.State, start: datetime) -> slotchart.State:
    """The table's state with the window the browser shows, or Unpatchable when that is not the window a render would
    draw now: a fixed window must be the very one asked for; one following now at most FOLLOW_SLACK behind."""
    window = state.window
    if window.following_now:
        if not window.start - FOLLOW_SLACK <= start <= window.start:
            raise Unpatchable("the window has moved on with the time")
    elif start != window.start:
        raise Unpatchable("the table shows another window")
    shown = replace(window, start=start, end=start + (window.end - window.start))
    return replace(state, window=shown)


@dataclass
class Patch:
    frames: list[slotchart.Page]  # pages whose height or stripes moved
    rows: list[slotchart.Row]
    sections: dict[str, str]  # name -> its markup, for the sections whose version moved


def patch(context: dict, shown: Shown, sections: Mapping[str, str]) -> Patch:
    """What moved between the table on screen and `context` (slotchart.chart_context for the same window and pages)
    and the sections' markup (views.slot_sections)."""
    pages: list[slotchart.Page] = context["pages"]
    if context["node_count"] != shown.nodes:
        raise Unpatchable("nodes were added or removed")
    if (context["now_x"] is not None) != shown.now_line:
        raise Unpatchable("the now line came into or left the window")
    if len(pages) != len(shown.pages):
        raise Unpatchable("the table has loaded pages that are no longer there")
    rows = [row for page in pages for row in page.rows]
    if [row.node.pk for row in rows] != [node for node, _ in shown.rows]:
        raise Unpatchable("the rows are in another order")
    frames = [page for page, had in zip(pages, shown.pages, strict=True) if page.version != had]
    changed = [row for row, (_, had) in zip(rows, shown.rows, strict=True) if row.version != had]
    moved = {
        name: markup for name, markup in sections.items() if section_version(markup) != shown.sections[name]
    }
    return Patch(frames, changed, moved)


DATA_V = re.compile(r'data-v="([0-9a-f]*)"')


def versioned(markup: str) -> SafeString:
    """A section's markup (a template rendered with an empty `data-v=""` on its outer element) with its version
    filled in: the fingerprint of that markup."""
    # The markup is a template's output, escaped there.
    return mark_safe(markup.replace('data-v=""', f'data-v="{fingerprint(markup)}"', 1))  # noqa: S308


def section_version(markup: str) -> str:
    found = DATA_V.search(markup)
    return found.group(1) if found else ""
