"""Words, not codes, where a person reads (issue 46, item 5), through Django's test client: a lease's two-word states,
a reschedule's cause, an alert's kind, an audit row's action and details, and a queued lease's reason for having no
estimate read as words on every page that shows them, with the code kept as the tooltip (and in the API); and the
reschedules filter lists its statuses in the order a person looks for them (pending, what no status means, first;
"any status" last; it listed "any status" first while "pending" was selected).

`missing_capability`, `fleet_at_capacity` and `at_capacity` were shown as codes; the pages are read here the way a
person reads them: their text, tooltips and attribute values left out."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet import wording
from leases.models import Lease
from slotkeeper import audit
from tests.console.test_recovery_pages import crash_looping, two_lost  # noqa: F401 (fixtures)
from tests.console.test_slot_rows import queue

CODE = re.compile(r"\b[a-z]+(?:_[a-z]+)+\b")


class Text(HTMLParser):
    """A page's words as a person reads them: no tags, no attribute values, no <title> (a tooltip), no <script>,
    no <option> (a select's closed list shows one: read separately)."""

    SKIP = {"title", "script", "style", "option"}

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def read(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    parser = Text()
    parser.feed(response.content.decode())
    return " ".join(parser.parts)


def options(client, url: str, name: str) -> list[str]:
    body = client.get(url).content.decode()
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', body, re.S).group(1)
    return [re.sub(r"\s+", " ", o).strip() for o in re.findall(r"<option[^>]*>([^<]*)</option>", select)]


@pytest.fixture
def suspended(fleet):
    lease = Lease.objects.create(
        name="paused-render",
        type="best_effort",
        state="suspended_queued",
        submitted_at=timezone.now(),
        duration_s=600,
        vnodes=[{"cpu_cores": 1, "mem_mib": 512, "disk_gib": 0}],
        estimate_note="no usable node: 2 missing_capability, 1 at_capacity",
    )
    return lease


def test_no_page_shows_a_code_where_a_person_reads(otto, fleet, two_lost, crash_looping, suspended):  # noqa: F811
    audit.record(at=timezone.now(), actor=None, action="node.declare_dead", target=fleet[0], reason="PSU",
                 details={"type": "best_effort", "accepted": True})  # fmt: skip
    pages = [
        reverse("lease-list"),
        reverse("lease-detail", args=[suspended.pk]),
        reverse("reschedule-list"),
        reverse("alert-list"),
        reverse("audit-feed"),
        reverse("instance-list"),
        reverse("instance-detail", args=[crash_looping.iid]),
        reverse("slot-table"),
        reverse("fleet-board"),
        reverse("node-detail", args=[fleet[0].pk]),
    ]
    found = {url: sorted(set(CODE.findall(read(otto, url)))) for url in pages}
    assert not {url: codes for url, codes in found.items() if codes}, found


def test_a_code_stays_as_the_tooltip(otto, fleet, two_lost, suspended):  # noqa: F811
    lease_list = otto.get(reverse("lease-list")).content.decode()
    assert (
        '<span title="suspended_queued" data-code="suspended_queued">suspended, queued</span>' in lease_list
    )
    assert (
        'title="no usable node: 2 missing_capability, 1 at_capacity">no estimate: no usable node: 2 lack a '
        in (lease_list)
    )
    reschedules = otto.get(reverse("reschedule-list")).content.decode()
    assert '<span title="node_dead" data-code="node_dead">node declared dead</span>' in reschedules
    alerts = otto.get(reverse("alert-list")).content.decode()
    assert '<span title="node_dead" data-code="node_dead">node declared dead</span>' in alerts


def test_the_filters_offer_words_and_send_codes(otto, fleet, two_lost, suspended):  # noqa: F811
    assert "suspended, queued" in options(otto, reverse("lease-list"), "state")
    assert options(otto, reverse("reschedule-list"), "cause")[1:] == ["node declared dead", "node drained"]
    assert "node declared dead" in options(otto, reverse("alert-list"), "kind")
    body = otto.get(reverse("reschedule-list")).content.decode()
    assert '<option value="node_dead" >node declared dead</option>' in body


def test_the_reschedules_filter_lists_pending_first_and_any_status_last(otto, two_lost):  # noqa: F811
    assert options(otto, reverse("reschedule-list"), "status") == [
        "pending",
        "applied",
        "rejected",
        "any status",
    ]
    body = otto.get(reverse("reschedule-list")).content.decode()
    assert re.search(r'<option value="pending" selected>pending</option>', body), "no status means pending"
    body = otto.get(reverse("reschedule-list"), {"status": ""}).content.decode()
    assert re.search(r'<option value="" selected>any status</option>', body)


def test_the_queue_forecast_and_the_slot_table_say_no_code(vera, fleet):
    queue(2)
    assert not CODE.findall(read(vera, reverse("slot-table")))


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("suspended_queued", "suspended, queued"),
        ("rejected_by_user", "rejected by its user"),
        ("restarts_exhausted", "restarts used up"),
        ("node_dead", "node declared dead"),
        ("fleet_at_capacity", "fleet at capacity"),
        ("missing_capability", "lacks a capability"),
        ("some_new_code", "some new code"),
        ("running", "running"),
    ],
)
def test_a_code_in_words(code, said):
    assert wording.words(code) == said


def test_counts_agree_with_their_verb():
    assert (
        wording.tally({"missing_capability": 10, "at_capacity": 2}) == "10 lack a capability, 2 at capacity"
    )
    assert wording.tally({"missing_capability": 1}) == "1 lacks a capability"
    assert wording.readable_line("no usable node: 2 missing_capability, 1 draining") == (
        "no usable node: 2 lack a capability, 1 draining"
    )


def test_an_audit_action_and_its_details_in_words():
    assert wording.action_words("node.declare_dead") == "node: declare dead"
    assert wording.action_words("lease.submit") == "lease: submit"
    assert wording.action_words("node.drain") == "node: drain", "not the reschedule cause's words"
    assert wording.detail_words(
        {
            "type": "best_effort",
            "accepted": True,
            "message": "lease 1 queued",
            "deadline": None,
            "max_parallel": 2,
        }
    ) == ("type: best-effort · accepted: yes · message: lease 1 queued · deadline: none · max parallel: 2")
    assert str(wording.coded("running")) == "running"
    assert str(wording.coded("a<b_c")) == '<span title="a&lt;b_c" data-code="a&lt;b_c">a&lt;b c</span>'


def test_the_latest_placement_and_its_report_read_as_words(otto, fleet):
    """The board's "latest placement" line printed the outcome and subject as stored ("fleet_at_capacity
    (lease:7)")."""
    from fleet.models import PlacementReport

    report = PlacementReport.objects.create(
        created_at=timezone.now(), subject="reschedule:web-3", request={"type": "best_effort"},
        outcome="fleet_at_capacity", message="no room",
    )  # fmt: skip
    board = " ".join(read(otto, reverse("fleet-board")).split())
    assert "latest placement: fleet at capacity (reschedule of instance web-3)" in board
    assert not CODE.findall(board)
    page = read(otto, reverse("placement-report", args=[report.pk]))
    assert "reschedule of instance web-3" in page and "reschedule:web-3" not in page
    assert wording.subject_words("lease:7") == "lease 7"
    assert wording.subject_words("preview") == "preview"


def test_a_verdicts_holds_and_the_fits_column_are_told_apart():
    """A fitting node's verdict said "holds 2" beside a column headed "Holds" that said 8: the verdict counts what
    this lease may place there (its own limits applied), the column what fits on the node whatever those limits."""
    from django.template.loader import render_to_string

    verdict = {"node": "a", "node_id": 0, "fit": True, "holds": 2, "slots": 8, "rank": 1, "numbers": {}}
    parser = Text()
    parser.feed(render_to_string("fleet/_verdicts.html", {"verdicts": [verdict]}))
    words = " ".join(" ".join(parser.parts).split())
    assert "Fits" in words and "Holds" not in words
    assert "✔ fit holds 2 8" in words
