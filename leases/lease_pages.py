"""The console's lease list, paged in the database: its state in the URL (`state`, `page`), a page of `PER_PAGE`
leases newest first, the number that match counted by one COUNT, and a message per value of the URL it cannot read.

Before, the list was `leases[:200]`: with 1,073 leases every page (`?page=2`, `?state=queued` with 997 queued) showed
the same newest 200 rows, with no pager and no word that more existed. Like the fleet board (leases/instances/board.py),
a URL with a bad value is answered 400 with a message naming it, and the list without it; a page past the end says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.urls import reverse

from fleet.wording import words
from leases.lifecycle import LeaseState
from leases.models import Lease
from slotkeeper.pagination import PageNumbers, page_number

PER_PAGE = 100
# The states the filter offers, in the order a person looks for them; the URL may name any lease state.
OFFERED = ["queued", "scheduled", "active", "suspended_queued", "done", "rejected", "cancelled"]
STATES = frozenset(s.value for s in LeaseState)
# What each parameter is called where a message names it.
WORDS = {"state": "State", "page": "Page"}


@dataclass(frozen=True)
class ListState:
    """What the lease list shows that its URL says: a state, or every state, and a page (from 1)."""

    state: str = ""
    page: int = 1

    def query(self, **changes) -> str:
        """The URL's query, defaults left out (so the plain list is `/leases/`)."""
        new = replace(self, **changes)
        params = {}
        if new.state:
            params["state"] = new.state
        if new.page != 1:
            params["page"] = str(new.page)
        return urlencode(params)

    def link(self, **changes) -> str:
        query = self.query(**changes)
        return reverse("lease-list") + (f"?{query}" if query else "")


@dataclass
class Checked:
    """The list's state read from its URL: the good values, and a message per bad one (each left at its default)."""

    state: ListState
    problems: dict[str, str] = field(default_factory=dict)


def read_state(params: Mapping[str, str]) -> Checked:
    problems: dict[str, str] = {}
    state, page = "", 1
    raw_state = params.get("state", "").strip()
    if raw_state:
        if raw_state in STATES:
            state = raw_state
        else:
            offered = "; ".join(words(s) for s in OFFERED)
            problems[WORDS["state"]] = f'"{raw_state[:40]}" is not a lease state; one of {offered}.'
    if "page" in params:
        page, why = page_number(params["page"])
        if why:
            problems[WORDS["page"]] = why
    return Checked(ListState(state, page), problems)


@dataclass
class Page(PageNumbers):
    rows: list[Lease]
    matching: int  # leases in the state asked for (all of them when none is)
    number: int
    per: int = PER_PAGE


def matching(state: ListState) -> QuerySet[Lease]:
    leases = Lease.objects.all()  # newest first (Lease.Meta.ordering, the id breaking ties)
    return leases.filter(state=state.state) if state.state else leases


def page_of(state: ListState) -> Page:
    """One page of leases: the matching ones counted in the database, then the page's rows read (two queries; none
    for the rows of a page past the end)."""
    leases = matching(state)
    page = Page([], leases.count(), state.page)
    if page.matching and not page.past_end:
        page.rows = list(leases[page.first - 1 : page.last])
    return page


def list_context(checked: Checked) -> dict:
    state = checked.state
    page = page_of(state)
    return {
        "list_state": state,
        "state": state.state,
        "states": OFFERED,
        "page": page,
        "leases": page.rows,
        "problems": checked.problems,
        # The live refresh re-fetches this: the page being viewed, without the values the list could not read.
        "here_href": state.link(),
        "first_href": state.link(page=1),
        "last_href": state.link(page=page.pages),
        # Past the end, "previous" is the last page.
        "prev_href": state.link(page=min(page.number - 1, page.pages)) if page.number > 1 else None,
        "next_href": state.link(page=page.number + 1) if page.number < page.pages else None,
    }
