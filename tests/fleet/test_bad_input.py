"""Hostile input to the fleet API and to the API's transport (body, query, path): always a 400 (or 404/413/415)
that names the problem, never a 500, and a refused request changes nothing.

Each case is one the outside tester's schemathesis run found: a 500 (the first comment of each block says which
database) or nonsense the API accepted.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from fleet.models import HealthSample, Node, PlacementReport
from tests.conftest import healthy

pytestmark = pytest.mark.django_db

NEW_NODE = {"name": "architect", "cpu_cores": 16, "mem_total_mib": 65536, "disk_total_gib": 900}


# Also sent through the heartbeat's ASGI route (tests/fleet/test_heartbeat_route.py), which must answer the same.
HOSTILE_HEARTBEATS = [
    ({"mem_total_mib": 2**31}, "mem_total_mib"),  # 500 on PostgreSQL (integer column)
    ({"mem_total_mib": 2**63}, "mem_total_mib"),  # 500 on SQLite too
    ({"disk_free_gib": 1e308}, "disk_free_gib"),  # was shown on the board
    ({"load1": 1e308}, "load1"),
    ({"instances": [{"id": "1-1-0", "status": "exited", "exit_code": 1e20}]}, "instances"),
    ({"instances": [{"id": "1-1-0", "gpus": 8}]}, "instances"),
    ({"instances": ["1-1-0\x00"]}, "instances"),  # jsonb refuses NUL: 500 on PostgreSQL
    ({"instances": ["x" * 101]}, "instances"),
    ({"instances": [{"id": "1-1-0", "log_tail": ["x" * 5000]}]}, "instances"),
    ({"gpu_temp_c": 80}, "gpu_temp_c"),  # unknown: was dropped silently
]


@pytest.mark.parametrize(("overrides", "field"), HOSTILE_HEARTBEATS)
def test_a_hostile_heartbeat_is_a_400_naming_the_field_and_stores_nothing(register_node, overrides, field):
    node, agent = register_node()
    response = agent.post(f"/api/nodes/{node.pk}/heartbeat", {**healthy(), **overrides}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    node.refresh_from_db()
    assert node.last_heartbeat_at is None
    assert node.obs_load1 is None
    assert not HealthSample.objects.exists()


def test_an_unknown_field_in_a_node_registration_is_a_400_naming_it(operator):
    response = operator.post("/api/nodes/", {**NEW_NODE, "gpus": 8}, format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {"gpus": ["Unknown field: this API does not take it."]}
    assert not Node.objects.exists()


class TestNamesIgnoringCase:
    def test_a_name_differing_only_in_case_is_a_400(self, operator, register_node):
        register_node(name="architect")
        response = operator.post("/api/nodes/", {**NEW_NODE, "name": "Architect"}, format="json")
        assert response.status_code == 400
        assert "differs only in case" in response.json()["name"][0]
        assert list(Node.objects.values_list("name", flat=True)) == ["architect"]

    def test_a_rename_onto_another_nodes_name_in_other_case_is_a_400(self, admin, register_node):
        register_node(name="tank")
        morpheus, _ = register_node(name="morpheus")
        response = admin.patch(f"/api/nodes/{morpheus.pk}/", {"name": "TANK"}, format="json")
        assert response.status_code == 400
        morpheus.refresh_from_db()
        assert morpheus.name == "morpheus"

    def test_a_node_may_change_the_case_of_its_own_name(self, admin, register_node):
        tank, _ = register_node(name="tank")
        response = admin.patch(f"/api/nodes/{tank.pk}/", {"name": "Tank"}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["name"] == "Tank"

    def test_the_database_refuses_it_too_when_two_requests_race(self, register_node):
        register_node(name="tank")
        with pytest.raises(IntegrityError), transaction.atomic():
            Node.objects.create(name="TANK", cpu_cores=1, mem_total_mib=1, disk_total_gib=0, token_digest="x")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mem_mib": 2**40}, "mem_mib"),
        ({"mem_mib": 1024, "cpu_cores": 1e308}, "cpu_cores"),
        ({"mem_mib": 1024, "preferred_node": "x" * 101}, "preferred_node"),
        ({"mem_mib": 1024, "gpus": 1}, "gpus"),
    ],
)
def test_a_hostile_placement_preview_is_a_400_and_records_no_report(operator, body, field):
    response = operator.post("/api/placement/preview", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not PlacementReport.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "disk", "deadline": "9999-12-31T23:59:59Z"}, "deadline"),
        ({"reason": "disk", "urgent": True}, "urgent"),
    ],
)
def test_a_hostile_drain_is_a_400_and_the_node_stays_as_it_was(operator, register_node, body, field):
    node, _ = register_node()
    response = operator.post(f"/api/nodes/{node.pk}/drain", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    node.refresh_from_db()
    assert node.status != "draining"


class TestTransport:
    def test_json_nested_50000_deep_is_a_400(self, operator):
        body = "[" * 50_000 + "]" * 50_000
        response = operator.generic("POST", "/api/nodes/", body, content_type="application/json")
        assert response.status_code == 400
        assert "JSON parse error" in response.json()["detail"]

    def test_json_deeper_than_32_levels_is_a_400(self, operator):
        nested: dict = {}
        for _ in range(40):
            nested = {"x": nested}
        response = operator.post("/api/nodes/", {**NEW_NODE, "capabilities": [nested]}, format="json")
        assert response.status_code == 400
        assert "nested deeper than 32" in response.json()["detail"]
        assert not Node.objects.exists()

    def test_a_body_larger_than_the_server_reads_is_a_413(self, operator, settings):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
        response = operator.post("/api/nodes/", {**NEW_NODE, "name": "a", "pad": "x" * 2000}, format="json")
        assert response.status_code == 413
        assert not Node.objects.exists()

    def test_a_form_body_is_a_415(self, operator):
        response = operator.post("/api/nodes/", NEW_NODE)  # multipart, as a browser form would send it
        assert response.status_code == 415
        assert not Node.objects.exists()

    def test_a_huge_limit_is_clamped_not_a_500(self, viewer, register_node):
        register_node()
        response = viewer.get("/api/nodes/", {"limit": str(10**30)})
        assert response.status_code == 200
        assert [n["name"] for n in response.json()["results"]] == ["tank"]

    @pytest.mark.parametrize(
        "query, field",
        [("offset=null", "offset"), ("offset=-1", "offset"), ("limit=0", "limit"), ("limit=1.5", "limit")],
    )
    def test_a_limit_or_offset_that_is_not_a_whole_number_is_a_400_not_the_first_page(
        self, viewer, register_node, query, field
    ):
        register_node()
        response = viewer.get(f"/api/nodes/?{query}")
        assert response.status_code == 400
        assert list(response.json()) == [field]

    def test_an_offset_past_the_end_is_an_empty_page(self, viewer, register_node):
        register_node()
        response = viewer.get("/api/nodes/", {"offset": str(2**63 - 1)})
        assert response.status_code == 200
        assert response.json()["results"] == []

    @pytest.mark.parametrize("url", ["/api/nodes/0.5/", "/api/no-such-thing/"])
    def test_a_path_no_route_matches_under_the_api_is_a_json_404(self, viewer, url):
        response = viewer.get(url)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert "detail" in response.json()

    @pytest.mark.parametrize(
        "url",
        ["/api/nodes/?q=a%00b", "/api/nodes/?status=online%00", "/api/groups/a%00b/", "/api/nodes/?%00=1"],
    )
    def test_a_nul_in_the_query_or_path_is_a_400(self, viewer, url):
        response = viewer.get(url)
        assert response.status_code == 400
        assert "NUL" in response.json()["detail"]


def test_the_agents_own_heartbeat_with_generations_is_accepted(register_node):
    # The real agent sends each instance's `generation` (fleet/agent/agent.py `_line`): refusing unknown fields
    # must not refuse the agent's own report.
    from fleet.agent.agent import _line

    node, agent = register_node()
    line = _line("1-1-0", "running", 0, ["booted"], "")
    response = agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(instances=[line]), format="json")
    assert response.status_code == 200, response.content
    node.refresh_from_db()
    assert [i["id"] for i in node.reported_instances] == ["1-1-0"]


async def test_a_nul_in_the_query_is_refused_on_the_async_path_daphne_takes_too(async_client):
    response = await async_client.get("/api/nodes/?q=a%00b")
    assert response.status_code == 400
    assert "NUL" in response.json()["detail"]


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/api/nodes/", {**NEW_NODE, "name": "n1", "capabilities": [0]}, "capabilities"),
        ("/api/nodes/", {**NEW_NODE, "name": 7}, "name"),
        ("/api/groups/", {"name": "g", "policy": "affinity", "leases": {}}, "leases"),
        ("/api/reschedules/approve/", {"ids": [], "group": 0}, "group"),
        ("/api/placement/preview", {"mem_mib": 1, "preferred_node": 0}, "preferred_node"),
    ],
)
def test_a_number_for_a_string_or_an_object_for_a_list_is_a_400(admin, path, body, field):
    """DRF converts these quietly (a capability "0", a node named "7", `{}` read as an empty list); the schema says
    string and array, so the server refuses them by name and stores nothing."""
    response = admin.post(path, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Node.objects.filter(name__in=["n1", "7"]).exists()


def aliases(pk: int) -> list[str]:
    """What int() also reads as `pk`: Arabic-Indic digits, a sign, an underscore, a leading space."""
    return ["".join(chr(0x660 + int(d)) for d in str(pk)), f"+{pk}", f"0_{pk}", f"%20{pk}"]


def test_an_id_is_ascii_digits_only_so_each_object_has_one_path(admin, register_node):
    # int() read each alias as the id: every object answered to several paths, and a probe rotated a node's token
    # through /api/nodes/٣/rotate-token/.
    from leases.models import Lease

    node, agent = register_node()
    assert agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json").status_code == 200
    body = {
        "name": "one",
        "type": "immediate",
        "duration_s": 600,
        "nodes": [{"cpu_cores": 1, "mem_mib": 512}],
    }
    assert admin.post("/api/leases/", body, format="json").status_code == 201
    lease = Lease.objects.get()
    report = PlacementReport.objects.get(subject=f"lease:{lease.pk}")
    for path, pk in (
        ("/api/nodes/{}/", node.pk),
        ("/api/leases/{}/", lease.pk),
        ("/api/placement/reports/{}/", report.pk),
    ):
        assert admin.get(path.format(pk)).status_code == 200
        for alias in aliases(pk):
            response = admin.get(path.format(alias))
            assert response.status_code == 404, (path, alias)
            assert response["Content-Type"] == "application/json"
    assert admin.post(f"/api/nodes/{aliases(node.pk)[0]}/rotate-token/").status_code == 404
    assert agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json").status_code == 200, (
        "token kept"
    )


@pytest.mark.parametrize("sign", ["", "-"])
def test_a_number_of_400_digits_where_a_float_goes_is_a_400_not_a_500(admin, register_node, sign):
    # JSON reads it as an exact integer; float() and math.isfinite raise OverflowError for it.
    from leases.models import Lease

    node, agent = register_node()
    huge = sign + "1" + "0" * 400
    body = '{"name": "p", "type": "best_effort", "duration_s": ' + huge + ', "nodes": [{"mem_mib": 256}]}'
    response = admin.post("/api/leases/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "duration_s" in response.json()
    assert not Lease.objects.exists()
    beat = healthy()
    beat["cpu_pct"] = int(huge)
    assert agent.post(f"/api/nodes/{node.pk}/heartbeat", beat, format="json").status_code == 400


@pytest.mark.parametrize(
    "path",
    [
        "/api/nodes/?offset={}",
        "/api/nodes/?limit={}",
        "/api/nodes/{}/",
        "/api/leases/{}/",
        "/api/slots/?node={}",
    ],
)
def test_a_number_past_the_digits_python_reads_is_a_4xx_not_a_500(viewer, path):
    # int() refuses text of more than 4,300 digits with ValueError; the paging parameters and ids met it unguarded.
    response = viewer.get(path.format("9" * 5000))
    assert response.status_code in (400, 404), response.status_code
    assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize("padding", [" ", "\u00a0", "\n"])
def test_a_text_longer_than_its_limit_as_sent_is_a_400_though_it_fits_trimmed(
    operator, register_node, padding
):
    """The schema says `maxLength: 300` of the text as sent; DRF measured it after trimming, so 301 characters
    that began with a space were accepted (found by Schemathesis against a running server)."""
    node, _ = register_node()
    response = operator.post(f"/api/nodes/{node.pk}/drain", {"reason": padding + "x" * 300}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["reason"] == ["Ensure this field has no more than 300 characters."]
    node.refresh_from_db()
    assert node.status != "draining"
    # Exactly the limit as sent is taken, and trimmed as before.
    response = operator.post(f"/api/nodes/{node.pk}/drain", {"reason": padding + "x" * 299}, format="json")
    assert response.status_code == 200, response.content
    node.refresh_from_db()
    assert node.status == "draining" and node.drain_reason == "x" * 299


@pytest.mark.parametrize("fleet", [False, True])
def test_a_lease_name_longer_than_its_limit_as_sent_is_a_400(operator, register_node, fleet):
    """Without a fleet the serializer words the refusal; with one the plain request's own rules
    (leases/request_rules.py) decide first, and must refuse it too."""
    from leases.models import Lease
    from leases.request_rules import MAX_NAME

    if fleet:
        node, agent = register_node()
        assert agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json").status_code == 200

    body = {
        "name": " " + "n" * MAX_NAME,
        "type": "best_effort",
        "duration_s": 600,
        "nodes": [{"mem_mib": 512}],
    }
    response = operator.post("/api/leases/", body, format="json")
    assert response.status_code == 400, response.content
    assert "name" in response.json()
    assert not Lease.objects.exists()


@pytest.mark.parametrize("capability", [" gpu", "gpu ", "gpu\n", "\tgpu"])
def test_a_capability_with_whitespace_around_it_is_a_400_as_its_pattern_says(
    admin, register_node, capability
):
    """The schema's pattern holds for the text as sent; the field trimmed it first (and Python's `$` matched
    before a final newline), so " gpu" was accepted as "gpu" (found with Schemathesis's ST201 in mind)."""
    from leases.models import Lease

    node, agent = register_node(capabilities=["gpu"])
    assert agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json").status_code == 200
    lease = {"name": "a", "type": "best_effort", "duration_s": 600, "nodes": [{"mem_mib": 1}]}
    for path, body in [
        ("/api/leases/", {**lease, "capabilities": [capability]}),
        ("/api/placement/preview", {"mem_mib": 1, "capabilities": [capability]}),
        ("/api/nodes/", {**NEW_NODE, "name": "n2", "capabilities": [capability]}),
    ]:
        response = admin.post(path, body, format="json")
        assert response.status_code == 400, (path, response.content)
        assert "capabilities" in response.json()
    assert not Lease.objects.exists()
    assert not Node.objects.filter(name="n2").exists()
    # The same capability as the pattern has it is taken.
    response = admin.post("/api/leases/", {**lease, "capabilities": ["gpu"]}, format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("name", [" web", "web ", "web\n", "\tweb"])
def test_a_name_with_whitespace_around_it_is_a_400_as_its_pattern_says(admin, register_node, name):
    """A node's name, a group's name and the groups a lease names: the schema's pattern holds for the text as
    sent. DRF trimmed " web" to "web" before the pattern and stored it (and its `search` with `$` would let
    "web\\n" through once trimming stopped); nothing is stored for a refused one."""
    from leases.models import Group, Lease

    node, agent = register_node()  # a fleet, so the plain lease path (leases/request_rules.py) decides first
    assert agent.post(f"/api/nodes/{node.pk}/heartbeat", healthy(), format="json").status_code == 200
    lease = {"name": "a", "type": "best_effort", "duration_s": 600, "nodes": [{"mem_mib": 1}]}
    assert (
        admin.post("/api/groups/", {"name": "web", "policy": "anti_affinity"}, format="json").status_code
        == 201
    )
    for method, path, body, field in [
        ("post", "/api/nodes/", {**NEW_NODE, "name": name}, "name"),
        ("patch", f"/api/nodes/{node.pk}/", {"name": name}, "name"),
        ("post", "/api/groups/", {"name": name.replace("web", "db"), "policy": "anti_affinity"}, "name"),
        ("patch", "/api/groups/web/", {"name": name.replace("web", "db")}, "name"),
        ("post", "/api/leases/", {**lease, "groups": [name]}, "groups"),
    ]:
        response = getattr(admin, method)(path, body, format="json")
        assert response.status_code == 400, (path, response.content)
        assert field in response.json(), (path, response.content)
    assert set(Node.objects.values_list("name", flat=True)) == {node.name}
    assert list(Group.objects.values_list("name", flat=True)) == ["web"]
    assert not Lease.objects.exists()
    # The names as the patterns have them are taken.
    assert admin.post("/api/leases/", {**lease, "groups": ["web"]}, format="json").status_code == 201
    assert admin.post("/api/groups/", {"name": "db", "policy": "affinity"}, format="json").status_code == 201
    assert admin.post("/api/nodes/", {**NEW_NODE, "name": "web-2"}, format="json").status_code == 201


# -- a list's length before its items, a time as the schema writes it, an id in a query (an outsider's requests) --


def test_a_list_far_past_its_limit_is_refused_by_its_length_at_once_in_one_message(operator, register_node):
    """DRF checked every item before the length: 600,000 bad capabilities took seconds and were answered with
    one message each (40 MB); a heartbeat of 655,000 ids took 122 s to be refused. Every item here is bad, so
    a check of the items first answers with one message per item."""
    node, agent = register_node()
    lease = {
        "name": "j",
        "type": "best_effort",
        "duration_s": 60,
        "nodes": [{"cpu_cores": 1, "mem_mib": 512}],
    }
    cases = [
        (operator, "/api/leases/", {**lease, "capabilities": ["BAD CAP"] * 200_000}, "capabilities"),
        (operator, "/api/nodes/", {**NEW_NODE, "capabilities": ["BAD CAP"] * 200_000}, "capabilities"),
        (
            agent,
            f"/api/nodes/{node.pk}/heartbeat",
            {**healthy(), "instances": ["x\x00"] * 200_000},
            "instances",
        ),
    ]
    for client, path, body, field in cases:
        response = client.post(path, body, format="json")
        assert response.status_code == 400, (path, response.status_code)
        assert len(response.content) < 1000, (path, len(response.content))
        assert "no more than" in str(response.json()[field]), (path, response.json())
    assert not Node.objects.filter(name=NEW_NODE["name"]).exists()


@pytest.mark.parametrize(
    "text",
    [
        "2031-01-07T00:00:00Z\x00",
        "2031-01-07T00:00:00Z\n",
        "\u0662\u0660\u0663\u0661-01-05T00:00:00Z",  # Arabic-Indic digits
        "2031-01-02",  # a date alone
        "2031-W01-1T00:00Z",  # an ISO week
        "20310103T000000Z",  # the basic format
        " 2031-01-07T00:00:00Z",
    ],
)
def test_a_time_not_written_as_the_schema_s_date_time_is_a_400_and_stores_nothing(
    operator, register_node, text
):
    from leases.models import Lease

    node, _ = register_node()
    lease = {
        "name": "ar",
        "type": "advance_reservation",
        "start": text,
        "duration_s": 60,
        "nodes": [{"cpu_cores": 1, "mem_mib": 512}],
    }
    response = operator.post("/api/leases/", lease, format="json")
    assert response.status_code == 400 and "start" in response.json(), response.content
    assert not Lease.objects.exists()
    response = operator.post(f"/api/nodes/{node.pk}/drain", {"reason": "r", "deadline": text}, format="json")
    assert response.status_code == 400 and "deadline" in response.json(), response.content
    node.refresh_from_db()
    assert node.status != "draining"
    assert operator.get("/api/slots/", {"start": text}).status_code == 400


def test_the_schema_s_date_times_are_taken(operator, register_node):
    for text in (
        "2031-01-07T00:00:00Z",
        "2031-01-07T00:00:00.123456+02:00",
        "2031-01-07 00:00",
    ):
        assert operator.get("/api/slots/", {"start": text}).status_code == 200, text


@pytest.mark.parametrize("alias", ["\u0661", "+1", "1.0", " 1", "0_1", "1 "])
def test_a_node_id_in_the_slots_query_is_ascii_digits_only(viewer, register_node, alias):
    response = viewer.get("/api/slots/", {"node": alias})
    assert response.status_code == 400 and "node" in response.json(), (alias, response.content)
    assert viewer.get("/api/slots/", {"node": "1"}).status_code == 200
