"""The event feed (issue 47): every change to a lease, an instance or a node is an event written with it, numbered
in commit order; `GET /api/events/` pages through them after a seq, filtered by lease, type prefix or node, and says
where to resume; a seq older than retention is a 410; with `Accept: text/event-stream` they stream."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from slotkeeper import feed, outbox
from slotkeeper.models import Event
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def submit(client, name, type_="best_effort", **extra):
    body = {"name": name, "type": type_, "duration_s": 600, "nodes": [vm(cores=4, mem=8192)], **extra}
    return client.post("/api/leases/", body, format="json")


def events(client, **query):
    response = client.get("/api/events/", query)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_leases_life_is_on_the_feed_in_order_with_why(operator, viewer, fleet):
    lease = submit(operator, "story").json()
    operator.post(f"/api/leases/{lease['id']}/cancel", {"reason": "done with it"}, format="json")
    page = events(viewer, lease=lease["id"], type="lease.")
    types = [e["type"] for e in page["results"]]
    assert types == ["lease.submitted", "lease.placed", "lease.started", "lease.cancelled"]
    seqs = [e["seq"] for e in page["results"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    started = page["results"][2]
    assert started["data"]["nodes"] and started["data"]["to"] == "active"
    assert "cancelled" in page["results"][3]["data"]["message"]


def test_instances_and_nodes_are_on_it_too(operator, viewer, admin, fleet):
    lease = submit(operator, "one", "immediate").json()
    node = fleet[0]
    admin.post(f"/api/nodes/{node.pk}/declare-dead", {"reason": "PSU"}, format="json")
    by_type = {e["type"] for e in events(viewer, limit=1000)["results"]}
    assert {"instance.placed", "node.dead"} <= by_type
    assert [e["type"] for e in events(viewer, node=node.pk, type="node.")["results"]][-1] == "node.dead"
    assert lease["id"]


def test_paging_after_a_seq_resumes_without_missing_or_repeating(operator, viewer, fleet):
    for i in range(6):
        submit(operator, f"job-{i}")
    everything = events(viewer, limit=5000)["results"]
    seen, after = [], 0
    while True:
        page = events(viewer, after=after, limit=7)
        seen.extend(page["results"])
        if page["last_seq"] == after:
            break
        after = page["last_seq"]
    assert [e["seq"] for e in seen] == [e["seq"] for e in everything]
    # The head, when nothing more: asked again after it, an empty page and the same head.
    assert events(viewer, after=after) == {"results": [], "last_seq": after}


def test_an_event_is_numbered_only_once_its_transaction_commits_and_never_if_it_rolls_back(fleet):
    head = outbox.sequence()
    with transaction.atomic():
        outbox.append("node.test", timezone.now(), node=fleet[0].pk)
        transaction.set_rollback(True)
    assert outbox.sequence() == head
    assert not Event.objects.filter(type="node.test").exists()


def test_a_seq_older_than_retention_is_a_410(operator, viewer, fleet, settings):
    submit(operator, "old")
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "EVENT_RETENTION_S": 60}
    assert outbox.prune(timezone.now() + timedelta(hours=1)) > 0
    response = viewer.get("/api/events/", {"after": 0})
    assert response.status_code == 410 and "last_seq" in response.json()
    head = response.json()["last_seq"]
    assert viewer.get("/api/events/", {"after": head}).status_code == 200
    # Numbers go on from there: none is given twice, even once its event is gone.
    submit(operator, "new")
    assert min(e["seq"] for e in events(viewer, after=head)["results"]) == head + 1


@pytest.mark.parametrize(
    "query",
    [{"after": "-1"}, {"after": "x"}, {"limit": "0"}, {"limit": "5001"}, {"type": "Lease;"}, {"lease": "+1"}],
)
def test_a_bad_query_is_a_400(viewer, query):
    assert viewer.get("/api/events/", query).status_code == 400


def test_the_feed_needs_a_viewer(anonymous):
    assert anonymous.get("/api/events/").status_code == 401


@pytest.mark.django_db(
    transaction=True
)  # the stream reads on worker threads: what it reads must be committed
def test_the_stream_sends_each_event_with_its_seq_as_id_and_a_heartbeat_when_quiet(
    operator, fleet, monkeypatch
):
    lease = submit(operator, "streamed").json()
    monkeypatch.setattr(feed, "POLL_S", 0.01)
    monkeypatch.setattr(feed, "HEARTBEAT_S", 0.0)

    async def first_chunks(n):
        out = []
        stream = feed._stream(0, 500, {"lease": lease["id"], "node": None, "type": None})
        async for chunk in stream:
            out.append(chunk.decode())
            if len(out) == n:
                break
        await stream.aclose()
        return out

    from asgiref.sync import async_to_sync

    chunks = async_to_sync(first_chunks)(6)
    assert chunks[0] == "retry: 2000\n\n"
    ids = [c.split("\n")[0] for c in chunks[1:4]]
    assert all(i.startswith("id: ") for i in ids) and "event: lease.submitted" in chunks[1]
    assert chunks[-1].startswith(": still here")


def test_a_negative_seq_is_told_what_a_seq_is(viewer):
    """`after=-1` was told "A valid integer is required": it is one."""
    response = viewer.get("/api/events/", {"after": "-1"})
    assert response.json() == {"after": ["Must be a whole number of 0 or more, in digits."]}
