"""Console pages given what a stranger types or tampers with: digits that are not ASCII ("²".isdigit() is True and
int("²") raises), ids past the database's integers, dates shaped right but not real. Each was a 500 (found by
probing `make run`'s pages with hostile query strings); now each is ignored or answered 404, never a 500."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

HOSTILE_GETS = [
    ("/slots/", {"pages": "²"}),
    ("/slots/", {"lease": "²"}),
    ("/slots/", {"lease": "99999999999999999999"}),
    ("/slots/rows/", {"page": "²"}),
    ("/audit/", {"since": "2026-13-45"}),
    ("/audit/", {"until": "2026-13-45"}),
    ("/audit/", {"until": "9999-12-31"}),
    ("/audit.csv", {"since": "2026-02-30"}),
    ("/audit.csv", {"until": "2026-13-45"}),
    ("/instances/", {"lease": "99999999999999999999"}),
    ("/instances/²-1-0/", {}),
    ("/instances/99999999999999999999-1-0/", {}),
    # Past the 4,300 digits int() reads from text: it raises ValueError there.
    ("/slots/", {"pages": "9" * 5000}),
    ("/slots/rows/", {"page": "9" * 5000}),
    ("/slots/", {"lease": "9" * 5000}),
    ("/instances/", {"lease": "9" * 5000}),
    (f"/instances/{'9' * 5000}-1-0/", {}),
    (f"/instances/1-{'9' * 5000}-0/", {}),
    # Windows at the calendar's ends: the window's end, a pan or a zoom's centre ran past year 9999 or before 1.
    ("/slots/", {"from": "0001-01-01T00:00:00Z"}),
    ("/slots/", {"from": "0001-01-02T00:00:00Z"}),
    ("/slots/", {"from": "9999-12-31T22:00:00Z"}),
    ("/slots/", {"from": "9999-12-31T23:00:00Z", "zoom": "1h"}),
    ("/slots/", {"from": "9999-12-28T00:00:00Z", "zoom": "7d"}),
    ("/slots/rows/", {"from": "9999-12-31T22:00:00Z"}),
]


@pytest.mark.parametrize(("path", "query"), HOSTILE_GETS)
def test_a_hostile_query_is_never_a_500(ada, fleet, path, query):
    response = ada.get(path, query)
    # 400: a value the page says it cannot read (the slot table, as the board); never a 500.
    assert response.status_code in (200, 400, 404), (path, query, response.status_code)


# The lease list answers a value it cannot read as the board does: 400, naming it, with the list without it. A page
# number past any database offset is a page past the end (200, saying so).
HOSTILE_LEASE_LIST = [
    ({"page": "abc"}, 400),
    ({"page": "-1"}, 400),
    ({"page": "0"}, 400),
    ({"page": "²"}, 400),
    ({"page": "1.5"}, 400),
    ({"page": "9" * 5000}, 400),
    ({"page": "99999999999999999999"}, 200),
    ({"state": "zzz"}, 400),
    ({"state": "<b>queued</b>"}, 400),
    ({"state": "suspended queued"}, 400),
    ({"state": "x" * 5000, "page": "²"}, 400),
]


@pytest.mark.parametrize(("query", "status"), HOSTILE_LEASE_LIST)
@pytest.mark.parametrize("htmx", [False, True])
def test_a_hostile_lease_list_query_is_a_message_never_a_500(ada, fleet, query, status, htmx):
    headers = {"HX-Request": "true"} if htmx else {}
    response = ada.get("/leases/", query, headers=headers)
    assert response.status_code == status, (query, response.status_code)
    if status == 400 and not htmx:
        body = response.content.decode()
        assert 'id="lease-list-problems"' in body and "<b>queued" not in body


# The live slot table's patch (a POST: the versions of its rows do not fit a URL): the table's state in the query, what
# it shows in the body. A 400 with a message, or a 409 that sends the table to fetch itself whole; never a 500.
HOSTILE_PATCHES = [
    ({}, {}),
    ({"pages": "²"}, {}),
    ({"from": "2026-13-45"}, {}),
    ({"from": "9999-12-31T22:00:00Z"}, {}),
    ({"from": "0001-01-01T00:00:00Z"}, {"at": "0001-01-01T00:00:00Z"}),
    ({"expand": "²,99999999999999999999"}, {}),
    ({"lease": "9" * 5000}, {}),
    ({}, {"at": "²"}),
    ({}, {"at": "9999-12-31T23:59:59+00:00"}),
    ({}, {"nodes": "9" * 5000}),
    ({}, {"pages": "," * 5000}),
    ({}, {"rows": "99999999999999999999.0"}),
    ({}, {"rows": f"{'9' * 5000}.0"}),
    ({}, {"rows": "1." + "f" * 5000}),
    ({}, {"summary": "\x00"}),
]


@pytest.mark.parametrize(("query", "body"), HOSTILE_PATCHES)
def test_a_hostile_slot_patch_is_never_a_500(ada, fleet, query, body):
    from urllib.parse import urlencode

    shown = {"at": "2026-12-09T08:00:00+00:00", "nodes": "3", "now_line": "0", "pages": "0", "rows": ""}
    query = {"from": "2026-12-09T08:00:00+00:00", **query}
    response = ada.post(f"/slots/patch/?{urlencode(query)}", {**shown, **body})
    assert response.status_code in (200, 400, 409), (query, body, response.status_code)


@pytest.mark.parametrize("page", ["confirm", "approve"])
@pytest.mark.parametrize(("ids", "version"), [(["²"], "1"), (["99999999999999999999999"], "1"), (["1"], "²")])
def test_tampered_reschedule_ids_or_versions_are_never_a_500(ada, fleet, page, ids, version):
    response = ada.post(f"/reschedules/{page}", {"id": ids, "v1": version})
    assert response.status_code < 500


def test_a_bare_date_still_means_that_whole_day_and_a_false_one_filters_nothing():
    from datetime import UTC, datetime

    from django.db.models import Q

    from slotkeeper.views import until_q

    assert until_q("2026-11-30") == Q(at__lt=datetime(2026, 12, 1, tzinfo=UTC))
    assert until_q("2026-13-45") == Q()


def test_a_window_past_the_years_the_api_takes_is_no_window_the_table_follows_now(ada, fleet):
    import re

    from django.utils import timezone

    body = ada.get("/slots/", {"from": "9999-12-31T22:00:00Z"}).content.decode()
    shown = re.search(r'aria-label="Slot table, (\d{4}-\d\d-\d\d \d\d:\d\d) to', body)
    assert shown, "the chart says its window"
    start = datetime.fromisoformat(shown[1]).replace(tzinfo=UTC)
    assert abs(timezone.now() - start) < timedelta(hours=2), "the window around now, not in year 9999"


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("deadline_min", "99999999999999", "the deadline is at most"),
        ("max_parallel", "99999999999", "moves at once"),
        ("max_parallel", "1001", "moves at once is at most 1,000 instances"),  # the API's bound, one past it
    ],
)
def test_a_drain_figure_past_its_bound_is_refused_with_a_message_not_a_500(otto, fleet, field, value, said):
    from fleet.models import Node

    node = fleet[0]
    form = {"reason": "rack move", "confirm": "1", "deadline_min": "30", "max_parallel": "2", field: value}
    response = otto.post(f"/nodes/{node.pk}/drain", form, follow=True)
    assert response.status_code == 200
    assert said in response.content.decode()
    assert Node.objects.get(pk=node.pk).status == "online", "nothing changed"


@pytest.mark.parametrize(
    "back", ["https://elsewhere.example/", "javascript:alert(1)", "//elsewhere.example/x"]
)
def test_a_tampered_back_link_after_approving_stays_on_this_site(ada, fleet, back):
    response = ada.post("/reschedules/approve", {"id": ["1"], "back": back})
    assert response.status_code == 200
    assert back not in response.content.decode()
    assert 'href="/reschedules/"' in response.content.decode()


@pytest.mark.parametrize("field", ["duration_s", "vms", "cpu_cores", "mem_mib"])
def test_a_lease_form_number_past_the_digits_python_reads_is_a_message_not_a_500(otto, fleet, field):
    from leases.models import Lease

    form = {
        "name": "x",
        "type": "best_effort",
        "duration_s": "60",
        "vms": "1",
        "cpu_cores": "1",
        "mem_mib": "256",
    }
    response = otto.post("/leases/new", {**form, field: "9" * 5000})
    assert response.status_code in (200, 400), response.status_code
    assert not Lease.objects.exists()


@pytest.mark.parametrize("undrain", [False, True])
def test_a_drain_reason_past_the_apis_300_characters_is_refused_with_a_message(otto, fleet, undrain):
    """The console's drain form stored a 5,000-character reason whole (a 500 on PostgreSQL), where the API says 400."""
    from fleet.models import Node

    node = fleet[0]
    form = {"reason": "x" * 5000, "confirm": "1", **({"undrain": "1"} if undrain else {})}
    response = otto.post(f"/nodes/{node.pk}/drain", form, follow=True)
    assert response.status_code == 200
    assert "The reason: Ensure this field has no more than 300 characters." in response.content.decode()
    assert Node.objects.get(pk=node.pk).status == "online" and not Node.objects.get(pk=node.pk).drain_reason


def test_a_slot_table_address_it_cannot_read_is_a_400_naming_each_value_and_shown_without_them(vera, fleet):
    """The table showed its default view for `zoom=13h` or `from=yesterday` and said nothing (the board answers 400
    with a message a value)."""
    response = vera.get(
        "/slots/", {"zoom": "13h", "from": "yesterday", "status": "asleep", "fpage": "-2", "q": "t"}
    )
    assert response.status_code == 400
    import html

    body = html.unescape(response.content.decode())
    assert 'id="slot-problems"' in body and "This table's address has values it cannot read" in body
    for said in ('zoom: "13h" is not a zoom; one of 1h, 6h, 24h, 7d.',
                 'from: "yesterday" is not a date and time',
                 'status: "asleep" is not a node status',
                 'fpage: "-2" is not a page of the queue forecast'):  # fmt: skip
        assert said in body, said
    # Shown without them (the default zoom, following now), the readable filter kept, and so is the way back.
    assert 'hx-get="/slots/?zoom=6h&q=t"' in body
    assert '<a href="/slots/?zoom=6h&q=t">The table without them</a>' in body
    assert vera.get("/slots/", {"zoom": "24h", "from": "2026-12-06T08:00:00Z"}).status_code == 200
