"""The lease list paged in the database (an outside tester's report): with 1,073 leases, `/leases/`,
`/leases/?page=2` and `/leases/?state=queued` each showed the same newest 200 rows, no pager and no note. Now a
page is 100 leases newest first, "Leases a–b of N" and a pager say where it is, the live refresh re-fetches the page
being viewed, and a URL the list cannot read is a 400 naming the bad value, with the list without it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from leases.models import Lease

LIST = reverse("lease-list")


def make_leases(count: int, *, state: str = "queued", start: int = 0) -> list[Lease]:
    """`count` leases named job-000, job-001, ..., each submitted a second after the one before (job-000 oldest)."""
    base = timezone.now() - timedelta(days=1)
    return Lease.objects.bulk_create(
        Lease(
            name=f"job-{i:03d}", type="best_effort", state=state, submitted_at=base + timedelta(seconds=i),
            duration_s=600, vnodes=[{"cpu_cores": 1, "mem_mib": 512, "disk_gib": 0}],
        )
        for i in range(start, start + count)
    )  # fmt: skip


def names(body: str) -> list[str]:
    """The leases' names in the order the rows show them."""
    return re.findall(r'<tr data-lease="\d+"><td><a href="[^"]+">\d+ (job-\d+)</a>', body)


def newest(first: int, last: int) -> list[str]:
    """The names of the newest-first rows from `first` down to `last` (inclusive), of leases job-000..."""
    return [f"job-{i:03d}" for i in range(first, last - 1, -1)]


def live_url(body: str) -> str:
    return re.search(r'<div id="lease-table" data-live hx-get="([^"]*)"', body).group(1).replace("&amp;", "&")


def test_250_leases_make_three_pages_of_100_newest_first(vera, db):
    make_leases(250)
    body = vera.get(LIST).content.decode()
    assert names(body) == newest(249, 150)
    assert "Leases 1–100 of 250" in body and 'aria-current="page">page 1 of 3<' in body
    assert '<nav id="lease-pager" class="pager" aria-label="Pages of leases">' in body
    assert 'href="/leases/?page=2"' in body and 'rel="next"' in body and 'rel="prev"' not in body
    assert 'href="/leases/?page=3"' in body and "Last »" in body


def test_page_2_shows_the_next_rows_and_says_where_it_is(vera, db):
    make_leases(250)
    body = vera.get(LIST, {"page": "2"}).content.decode()
    assert names(body) == newest(149, 50)
    assert "Leases 101–200 of 250" in body and "page 2 of 3" in body
    assert 'href="/leases/" hx-get="/leases/" hx-target="#lease-table"' in body, "first: the plain list"
    assert re.search(r'href="/leases/" [^>]*rel="prev"', body)
    assert re.search(r'href="/leases/\?page=3" [^>]*rel="next"', body)


def test_the_last_page_has_the_rest_and_no_next(vera, db):
    make_leases(250)
    body = vera.get(LIST, {"page": "3"}).content.decode()
    assert names(body) == newest(49, 0)
    assert "Leases 201–250 of 250" in body and "page 3 of 3" in body
    assert 'rel="next"' not in body and 'rel="prev"' in body


def test_a_page_past_the_end_says_so_and_links_to_the_last_page(vera, db):
    make_leases(120)
    response = vera.get(LIST, {"page": "9"})
    assert response.status_code == 200
    body = response.content.decode()
    assert names(body) == []
    assert "There is no page 9: 120 leases, 2 pages of 100." in body
    assert '<a href="/leases/?page=2">Go to page 2</a>' in body
    assert re.search(r'href="/leases/\?page=2" [^>]*rel="prev"', body), "previous is the last page"
    assert 'rel="next"' not in body
    # A page number no database offset could reach is past the end too, not a 500.
    assert vera.get(LIST, {"page": "9" * 30}).status_code == 200


def test_the_state_filter_pages_and_counts_its_own_leases_and_the_pager_keeps_it(vera, db):
    make_leases(130, state="queued")
    make_leases(20, state="active", start=500)  # the newest of all
    body = vera.get(LIST, {"state": "queued", "page": "2"}).content.decode()
    assert names(body) == newest(29, 0)
    assert "Leases 101–130 of 130" in body
    assert 'href="/leases/?state=queued"' in body, "first page, the state kept"
    all_states = vera.get(LIST).content.decode()
    assert "Leases 1–100 of 150" in all_states and names(all_states)[:20] == newest(519, 500)
    # A state the filter does not offer is still a lease state.
    make_leases(2, state="failed", start=900)
    failed = vera.get(LIST, {"state": "failed"})
    assert failed.status_code == 200 and names(failed.content.decode()) == ["job-901", "job-900"]


def test_a_state_no_lease_is_in_says_so(vera, db):
    make_leases(3)
    body = vera.get(LIST, {"state": "done"}).content.decode()
    assert "No lease is done." in body and "0 leases done" in body


def test_the_live_fragment_refetches_the_page_it_shows_not_page_1(vera, db):
    make_leases(250)
    page = vera.get(LIST, {"state": "queued", "page": "2"}).content.decode()
    assert live_url(page) == "/leases/?state=queued&page=2"
    fragment = vera.get(LIST, {"state": "queued", "page": "2"}, headers={"HX-Request": "true"})
    body = fragment.content.decode()
    assert "<html" not in body and names(body) == newest(149, 50)
    assert live_url(body) == "/leases/?state=queued&page=2"
    assert "Leases 101–200 of 250" in body, "the pager is in the fragment: a refresh keeps it true"


def test_the_live_fragment_of_a_url_with_a_bad_value_refetches_the_list_without_it(vera, db):
    make_leases(3)
    body = vera.get(LIST, {"state": "zzz", "page": "abc"}).content.decode()
    assert live_url(body) == "/leases/"


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"page": "abc"}, 'Page: "abc" is not a page number; pages count from 1.'),
        ({"page": "-1"}, 'Page: "-1" is not a page number; pages count from 1.'),
        ({"page": "0"}, 'Page: "0" is not a page number'),
        ({"page": "²"}, "is not a page number"),
        ({"page": "9" * 5000}, "is not a page number"),
        ({"state": "zzz"}, 'State: "zzz" is not a lease state; one of queued; scheduled; active; '
                           "suspended, queued; done; rejected; cancelled."),
    ],
)  # fmt: skip
def test_a_value_the_list_cannot_read_is_a_400_that_names_it_and_shows_the_list_without_it(
    vera, db, query, said
):
    make_leases(3, state="queued")
    make_leases(2, state="active", start=10)
    response = vera.get(LIST, {"state": "queued", "page": "1", **query})
    assert response.status_code == 400
    body = response.content.decode()
    assert 'role="alert" id="lease-list-problems"' in body
    assert said.replace('"', "&quot;") in body
    if "state" in query:
        assert names(body) == ["job-011", "job-010", "job-002", "job-001", "job-000"], "every state, not none"
    else:
        assert names(body) == ["job-002", "job-001", "job-000"], "the state in the URL still counts"


@pytest.mark.parametrize("htmx", [False, True])
def test_the_list_s_queries_do_not_grow_with_the_leases(vera, db, htmx, django_assert_num_queries):
    headers = {"HX-Request": "true"} if htmx else {}
    make_leases(3)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        vera.get(LIST, {"page": "1"}, headers=headers)
    make_leases(1200, start=3)
    with django_assert_num_queries(len(few)) as many:
        response = vera.get(LIST, {"page": "2"}, headers=headers)
    assert names(response.content.decode()) == newest(1102, 1003)
    counts = [q["sql"] for q in many.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 1, "one COUNT in the database, not the rows loaded to count them"
    assert len(few) <= 8
