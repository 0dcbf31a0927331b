"""The console says what the placer decided in words (issue 44): the what-if names each outcome as a person says it
(the code stays as a tooltip and a data attribute), takes a window, and the drain preview says where each live
instance would go, asked as a move's approval asks it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.api.serializers import PREVIEW_START_AHEAD
from leases.request_rules import MAX_START_AHEAD
from tests.console.test_views import host_of, submit

pytestmark = pytest.mark.django_db


def what_if(client, **fields):
    body = {"count": "1", "cpu_cores": "1", "mem_mib": "1024", "disk_gib": "0", "duration_s": "600", **fields}
    return client.post(reverse("placement-preview-form"), body).content.decode()


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"capabilities": "accel.tpu"}, "no_capable_node", "no capable node"),
        ({"mem_mib": "1500", "count": "3"}, "fleet_at_capacity", "fleet at capacity"),
        ({}, "placed", "would fit"),
    ],
)
def test_the_what_if_names_each_outcome_in_words_with_the_code_as_a_tooltip(otto, fleet, fields, code, words):
    # Each node allocates 2 GiB (8 GiB declared); one of the three holds a 1.5 GiB VM for an hour.
    submit(mem=1500)
    page = what_if(otto, **fields)
    assert f'data-code="{code}" title="{code}">{words}</span>' in page
    if code != "placed":
        assert "data-outcome-help" in page


def test_the_what_if_asks_for_a_window_as_an_advance_reservation(otto, fleet):
    start = (timezone.now() + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M")
    submit(mem=1500)
    page = what_if(otto, start=start, mem_mib="1500", count="3")
    # Three nodes of 2 GiB allocatable, free again in three hours: each takes one.
    assert 'data-code="placed"' in page and "would run over" in page


def test_a_what_if_window_in_the_past_is_refused_with_the_fields_message(otto, fleet):
    start = (timezone.now() - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M")
    response = otto.post(reverse("placement-preview-form"), {"mem_mib": "1024", "start": start})
    assert response.status_code == 400 and "is in the past" in response.content.decode()


def test_the_preview_window_is_bounded_as_a_leases_start_is():
    assert PREVIEW_START_AHEAD == MAX_START_AHEAD


def test_the_drain_preview_says_where_each_live_instance_would_go(otto, fleet):
    lease = submit()
    node_id = host_of(lease)
    body = otto.get(
        reverse("node-drain-preview", args=[node_id]), {"reason": "kernel upgrade"}
    ).content.decode()
    assert 'id="drain-targets"' in body
    assert "<strong data-target>" in body
    target = body.split("<strong data-target>")[1].split("<")[0]
    names = {n.pk: n.name for n in fleet}
    assert target in names.values() and target != names[node_id]
