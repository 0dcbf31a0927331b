"""Lease arrays (issue 47): `POST /api/leases/batch` decides up to 1,000 lease bodies in one planning pass, in order,
each answered as its single request would be (201, 409 or 400, with its decision), a bad item stopping none of the
others; keys per item make a retried array safe; the array is one audit row plus one per lease."""

from __future__ import annotations

import pytest

from leases.models import Lease
from slotkeeper.models import AuditEntry
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def lease(name, type_="best_effort", **extra):
    return {"name": name, "type": type_, "duration_s": 600, "nodes": [vm(cores=4, mem=8192)], **extra}


def batch(client, items, **headers):
    return client.post("/api/leases/batch", {"leases": items}, format="json", headers=headers)


def test_each_item_gets_the_answer_its_single_request_would_get_in_order(operator, fleet):
    items = [lease(f"im-{i}", "immediate") for i in range(5)]  # four nodes: the fifth finds none
    items.insert(2, {"name": "broken", "type": "immediate", "duration_s": -1, "nodes": [vm()]})
    items.append(lease("waits"))
    response = batch(operator, items)
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["index"] for r in results] == list(range(7))
    assert [r["status"] for r in results] == [201, 201, 400, 201, 201, 409, 201]
    assert "duration_s" in results[2]["errors"] and "id" not in results[2]
    assert results[5]["code"] == "fleet_at_capacity" and results[5]["state"] == "rejected"
    assert results[6]["state"] == "ready"  # backfilling's future reservation, after the first ones end
    # Decided in order, as if submitted one after another: the first four took the four nodes.
    ids = [r["id"] for r in results if "id" in r]
    assert ids == sorted(ids)
    assert all("summary" in r for r in results if r["status"] != 400)
    assert AuditEntry.objects.filter(action="lease.batch").count() == 1
    assert AuditEntry.objects.filter(action="lease.submit").count() == 6


def test_a_minimal_answer_leaves_the_verdicts_summary_out(operator, fleet):
    response = batch(operator, [lease("a")], Prefer="return=minimal")
    [result] = response.json()["results"]
    assert response["Preference-Applied"] == "return=minimal"
    assert set(result) == {"index", "status", "id", "state", "message"}


def test_a_retried_array_with_keys_stores_each_lease_once(operator, fleet):
    items = [lease("a", idempotency_key="job-1-a"), lease("b", idempotency_key="job-1-b")]
    first = batch(operator, items).json()["results"]
    again = batch(operator, items).json()["results"]
    assert [r["id"] for r in again] == [r["id"] for r in first]
    assert all(r.get("idempotent_replayed") for r in again)
    assert Lease.objects.count() == 2
    # The same key with another body is refused for that item alone.
    changed = batch(operator, [lease("a2", idempotency_key="job-1-a"), lease("c")]).json()["results"]
    assert changed[0]["status"] == 400 and "idempotency_key" in changed[0]["errors"]
    assert changed[1]["status"] == 201


def test_one_key_twice_in_an_array_is_a_400_for_the_second(operator, fleet):
    results = batch(operator, [lease("a", idempotency_key="k"), lease("b", idempotency_key="k")]).json()[
        "results"
    ]
    assert [r["status"] for r in results] == [201, 400]


@pytest.mark.parametrize(
    "body",
    [{}, {"leases": []}, {"leases": "x"}, {"leases": [1]}, {"leases": [lease("a")], "extra": 1}, []],
)
def test_a_body_that_is_not_such_a_list_is_a_400_and_stores_nothing(operator, fleet, body):
    response = operator.post("/api/leases/batch", body, format="json")
    assert response.status_code == 400
    assert not Lease.objects.exists()


def test_more_than_a_thousand_items_is_a_400(operator, fleet):
    assert batch(operator, [lease("x")] * 1001).status_code == 400


def test_a_viewer_cannot_submit_an_array(viewer, fleet):
    assert batch(viewer, [lease("a")]).status_code == 403


def test_the_console_form_submits_n_copies_as_one_array(fleet):
    from django.test import Client
    from django.urls import reverse

    from tests.console.conftest import signed_in

    otto: Client = signed_in("otto", "operator")
    form = {"name": "render", "type": "best_effort", "duration_s": "600", "vms": "1", "copies": "3",
            "cpu_cores": "1", "mem_mib": "1024", "disk_gib": "0"}  # fmt: skip
    response = otto.post(reverse("lease-new"), form)
    assert response.status_code == 302 and response["Location"] == reverse("lease-list")
    assert sorted(Lease.objects.values_list("name", flat=True)) == ["render-1", "render-2", "render-3"]
    assert AuditEntry.objects.filter(action="lease.batch").count() == 1
    bad = otto.post(reverse("lease-new"), {**form, "copies": "0"})
    assert bad.status_code == 400 and "copies" in bad.content.decode()
