"""The collector settings a server process takes once start-up is done (slotkeeper/collector.py)."""

import gc
import json

import pytest
from django.test.client import ClientHandler, FakePayload

from slotkeeper import collector


@pytest.fixture
def restored():
    # Whatever ran before in this process (another test's server start-up freezes what it built) is thawed first:
    # under pytest-xdist the order of a worker's tests is not the file order.
    gc.unfreeze()
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tuning_freezes_what_start_up_built_and_collects_the_young_generation_less_often(restored):
    built_at_start_up = [object() for _ in range(10)]  # a container the collector tracks
    collector.tune(12_345)
    assert gc.get_threshold() == (12_345, *collector.GENERATIONS)
    assert gc.get_freeze_count() > 0
    # Frozen: in no generation the collector walks any more.
    assert all(o is not built_at_start_up for o in gc.get_objects())


def test_a_zero_threshold_leaves_the_collector_as_cpython_sets_it(restored):
    before = gc.get_threshold()
    collector.tune(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cyclic_garbage_made_after_start_up_is_still_collected(restored):
    collector.tune(10_000)

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2


@pytest.mark.django_db
def test_metrics_count_collections_and_their_time_per_generation(client):
    """Every process counts its collections (slotkeeper/apps.py installs the callback) and /metrics shows them."""

    def counted() -> dict[str, float]:
        return {f"{name}:{labels['generation']}": value for name, labels, value in collector.gauges()}

    before = counted()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    gc.collect()  # a full collection: generation 2
    after = counted()
    assert after["slotkeeper_gc_collections_total:2"] == before["slotkeeper_gc_collections_total:2"] + 1
    assert after["slotkeeper_gc_seconds_total:2"] > before["slotkeeper_gc_seconds_total:2"]
    assert (
        after["slotkeeper_gc_collected_objects_total:2"]
        >= before["slotkeeper_gc_collected_objects_total:2"] + 2
    )
    text = client.get("/metrics").content.decode()
    assert 'slotkeeper_gc_collections_total{generation="2"}' in text
    assert 'slotkeeper_gc_seconds_total{generation="0"}' in text


def left_to_the_collector(request) -> tuple[bytes, int]:
    """The body `request()` answers and how many objects it left to the cyclic collector: called as a server
    calls Django (ClientHandler; the test client ties responses into cycles of its own), once to warm what first
    use caches, then again with the collector off."""
    assert request().status_code == 200
    gc.collect()
    gc.disable()
    try:
        response = request()
        assert response.status_code == 200
        body = response.content
        del response
        return body, gc.collect()
    finally:
        gc.enable()


def environ(path: str, method: str, role: str) -> dict:
    from django.test.client import RequestFactory

    from slotkeeper.management.commands.issue_token import issue

    token = issue(f"{role}-gc", role)
    return RequestFactory()._base_environ(
        PATH_INFO=path, REQUEST_METHOD=method, HTTP_AUTHORIZATION=f"Bearer {token}"
    )


@pytest.mark.django_db
def test_an_api_responses_data_is_freed_when_its_request_ends_not_left_to_the_collector(register_node):
    """Django REST framework's response, view and request hold one another; the response's data was cyclic
    garbage until the collector's next pass (slotkeeper/middleware.py, ReleaseRenderedMiddleware). What a
    400-node preview leaves to the collector is none of its verdicts."""
    for i in range(400):
        register_node(name=f"n{i:03}")
    body = json.dumps({"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 1, "count": 1}).encode()
    call = {**environ("/api/placement/preview", "POST", "operator"), "CONTENT_TYPE": "application/json"}
    handler = ClientHandler(enforce_csrf_checks=True)
    answer, left = left_to_the_collector(
        lambda: handler({**call, "CONTENT_LENGTH": str(len(body)), "wsgi.input": FakePayload(body)})
    )
    assert answer.count(b'"node_id"') == 400
    # 400 verdicts are 400 dicts and more; what is left (about 210 objects) is the view and its request.
    assert left < 300, left


@pytest.mark.django_db
def test_a_leases_placement_reports_are_freed_when_its_request_ends(register_node, operator):
    """A lease's answer holds its reports' verdicts, a dict per node. Serializers keep their data and their
    instance in cycles of their own (leases/api/serializers.py, `plain`), which kept every verdict alive for the
    collector after each lease answer; now the request's end frees them."""
    for i in range(400):
        register_node(name=f"n{i:03}")
    lease = operator.post(
        "/api/leases/",
        {"name": "j", "type": "best_effort", "duration_s": 600, "nodes": [{"cpu_cores": 1, "mem_mib": 1024}]},
        format="json",
    ).json()["id"]
    call = environ(f"/api/leases/{lease}/", "GET", "viewer")
    handler = ClientHandler(enforce_csrf_checks=True)
    answer, left = left_to_the_collector(lambda: handler(dict(call)))
    assert answer.count(b'"node_id"') == 400
    # 400 verdicts are 800 containers and more; what is left (about 500 objects) is the view, its request and
    # the serializers.
    assert left < 700, left
