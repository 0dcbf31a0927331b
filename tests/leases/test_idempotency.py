"""A lease request's Idempotency-Key: a retry whose first answer was lost is answered with the first request's lease
and decision, never with a second lease (leases/actions.py do_submit_lease)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from fleet.models import Node
from leases import actions
from leases.models import Lease
from tests.conftest import client_with_token, issue, requires_postgres
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def submit(client, key: str | None, **body):
    payload = {"name": "job", "type": "best_effort", "duration_s": 3600, "nodes": [vm()], **body}
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post("/api/leases/", payload, format="json", headers=headers)


def test_a_retry_with_the_same_key_and_body_is_the_first_requests_answer_and_stores_nothing(operator, fleet):
    first = submit(operator, "job-7f3a")
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    again = submit(operator, "job-7f3a")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.json()["state"] == first.json()["state"]
    assert Lease.objects.count() == 1
    # Without a key, or with another, a request is a new lease, as always.
    assert submit(operator, None).json()["id"] != first.json()["id"]
    assert submit(operator, "job-7f3b").json()["id"] != first.json()["id"]
    assert Lease.objects.count() == 3


def test_a_rejected_requests_retry_is_the_same_rejection(operator, fleet):
    start = (timezone.now() + timedelta(hours=2)).isoformat()
    body = {
        "type": "advance_reservation",
        "start": start,
        "nodes": [vm(cores=4)] * 5,
    }  # 5 x 4 cores on 4 nodes
    first = submit(operator, "ar-1", **body)
    assert first.status_code == 409
    again = submit(operator, "ar-1", **body)
    assert again.status_code == 409 and again["Idempotent-Replayed"] == "true"
    assert again.json()["lease"] == first.json()["lease"] and again.json()["state"] == "rejected"
    assert Lease.objects.count() == 1


def test_the_same_key_with_another_body_is_422_and_changes_nothing(operator, fleet):
    first = submit(operator, "k-1")
    response = submit(operator, "k-1", duration_s=60)
    assert response.status_code == 422
    assert f"lease {first.json()['id']}" in response.json()["detail"]
    assert Lease.objects.count() == 1


def test_keys_are_each_accounts_own(operator, fleet):
    other = client_with_token(issue("olga", "operator"))
    mine, theirs = submit(operator, "shared-name"), submit(other, "shared-name")
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"] and "Idempotent-Replayed" not in theirs


@pytest.mark.parametrize("key", ["", " ", "a b", "x" * 256, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_400_naming_the_header_and_stores_nothing(operator, fleet, key):
    response = submit(operator, key)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()
    assert not Lease.objects.exists()


def test_a_retry_of_a_request_stored_but_never_answered_waits_for_its_decision(operator, fleet):
    # A server killed after storing the request (an intent in state new) and before answering it: the retry finds
    # the intent, waits for the pass that decides it, and answers with that decision; no second lease.
    body = {"name": "job", "type": "best_effort", "duration_s": 3600, "nodes": [vm()]}
    user = Lease._meta.get_field("submitted_by").related_model.objects.get(username="otto")
    from leases.api import serializers as s

    class Request:  # what idempotency_of reads of a request
        headers = {"Idempotency-Key": "lost-1"}
        data = body

    lease = Lease.objects.create(
        name="job", type="best_effort", submitted_at=timezone.now(), duration_s=3600, vnodes=[vm()],
        submitted_by=user, idempotency_key="lost-1", request_digest=s.idempotency_of(Request).digest,
    )  # fmt: skip
    assert lease.state == "new"
    again = submit(operator, "lost-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == lease.pk and again.json()["state"] != "new"
    assert Lease.objects.count() == 1


def test_a_retry_is_answered_even_when_its_body_would_no_longer_pass(operator, fleet, register_node):
    # The first answer stands: a retry is not validated again (the only node its VM fitted is gone since).
    big, _ = register_node(name="big", mem_total_mib=40_000, cpu_cores=8)
    first = submit(operator, "big-1", nodes=[vm(mem=20_000)])
    assert first.status_code == 201
    Node.objects.filter(pk=big.pk).update(status="dead")
    assert submit(operator, None, nodes=[vm(mem=20_000)]).status_code == 400  # a new request is refused
    again = submit(operator, "big-1", nodes=[vm(mem=20_000)])
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_two_requests_with_one_key_at_once_store_one_lease(fleet):
    # Both in flight at once, neither finding the other's lease first: the unique constraint refuses the second
    # insert (after the first commits), which then answers with the first's lease.
    issue("racer", "operator")
    user = Lease._meta.get_field("submitted_by").related_model.objects.get(username="racer")
    spec = actions.LeaseSpec(name="race", type="best_effort", duration_s=600, vnodes=[vm()])
    key = actions.Idempotency("race-1", "d" * 64)
    barrier, answers, errors = threading.Barrier(2), [], []

    def run():
        try:
            barrier.wait(timeout=10)
            answers.append(actions.do_submit_lease(user, spec, now=timezone.now(), idempotency=key))
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(answers) == 2 and answers[0].lease.pk == answers[1].lease.pk
    assert sorted(a.replayed for a in answers) == [False, True]
    assert Lease.objects.filter(idempotency_key="race-1").count() == 1


def test_the_admin_finds_a_lease_by_the_key_its_client_gave(operator, fleet):
    from django.contrib.auth import get_user_model
    from django.test import Client

    lease_id = submit(operator, "nightly-2026-12-05").json()["id"]
    submit(operator, "nightly-2026-12-06")
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser(username="root", password="x"))
    found = admin.get("/admin/leases/lease/", {"q": "nightly-2026-12-05"})
    assert found.status_code == 200 and found.context["cl"].result_count == 1
    page = admin.get(f"/admin/leases/lease/{lease_id}/change/")
    assert page.status_code == 200 and b"nightly-2026-12-05" in page.content
