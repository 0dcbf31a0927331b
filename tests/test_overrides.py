"""What each replacement of framework behaviour (docs/overrides.md) relies on in the pinned Django, DRF, Daphne,
Twisted and asgiref, held so that an upgrade that changes it fails here instead of silently in production.

Two kinds of test: a differential one (the override's answer against the framework's own path for the same
input: they must agree), and a pin of the framework behaviour the override's gain or correctness depends on (a
signature it calls, the source of a method it copies, a cycle it breaks). A failure here is not a bug to patch
around: it means the framework moved, and docs/overrides.md says per override what to check and how."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import inspect
import json
from datetime import UTC, datetime
from unittest.mock import Mock

import pytest
from asgiref import sync
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.handlers.asgi import ASGIHandler
from django.db import connection, models, transaction
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from twisted.internet.testing import StringTransport
from twisted.web import http

from slotkeeper import bulk, statements
from slotkeeper.asgi import django_asgi_app
from slotkeeper.handler import OneHopASGIHandler
from slotkeeper.management.commands.issue_token import issue
from slotkeeper.renderers import FastJSONRenderer
from tests import asgi
from tests.conftest import T0, requires_postgres


def source_digest(func) -> str:
    return hashlib.sha256(inspect.getsource(func).encode()).hexdigest()[:16]


# -- handler: slotkeeper/handler.py (Django's ASGIHandler) ----------------------------------------------------------


async def call(app, path, **options):
    """One request through an ASGI application; returns (status, headers without the per-request ones, body)."""
    status, sent, content = await asgi.request(app, path, **options)
    return status, sorted(h for h in sent if h[0].lower() != b"x-request-id"), content


@pytest.mark.django_db(transaction=True)
def test_the_one_hop_handler_answers_every_kind_of_request_as_djangos_own_handler_does():
    """Differential: the same requests through Django's ASGIHandler and through ours (both behind the static files
    handler, as asgi.py builds them): status, headers and body the same."""
    raw = issue("differential", "operator")
    connection.close()  # the requests run on threads of their own
    auth = [(b"authorization", f"Bearer {raw}".encode())]
    json_body = [(b"content-type", b"application/json")]
    djangos = ASGIStaticFilesHandler(ASGIHandler())
    asks = [
        ("/healthz", {}),
        ("/api/alerts/?limit=1", {"headers": auth}),
        ("/api/alerts/", {}),  # 401, no token
        ("/api/no-such-thing/", {"headers": auth}),  # 404
        ("/api/alerts/", {"headers": auth, "host": b"evil.example"}),  # 400, a host not served
        ("/api/leases/", {"method": "POST", "headers": auth + json_body, "body": b'{"name": ""}'}),  # 400
        ("/api/leases/", {"method": "POST", "headers": auth + json_body, "body": b"{" * 40}),  # 400 parse
        ("/", {}),  # the console: a redirect to sign in
        ("/static/console/favicon.svg", {}),  # the static files handler, in front of both
    ]
    for path, options in asks:
        ours = asyncio.run(call(django_asgi_app, path, **options))
        theirs = asyncio.run(call(djangos, path, **options))
        assert ours == theirs, path


def test_djangos_asgi_handler_is_the_one_the_one_hop_handler_copies():
    """`OneHopASGIHandler.handle` and `__call__` are Django 5.2's, reordered (docs/overrides.md, handler). A
    Django whose handler changed (a security release touched request bodies and disconnects in 5.x) must be
    re-read against ours before this digest is updated: the change may need copying."""
    assert source_digest(ASGIHandler.__call__) == "f756809e9c9308dc"
    assert source_digest(ASGIHandler.handle) == "98faeb5bef800331"
    for name, params in {
        "read_body": ["self", "receive"],
        "create_request": ["self", "scope", "body_file"],
        "send_response": ["self", "response", "send"],
        "listen_for_disconnect": ["self", "receive"],
        "load_middleware": ["self", "is_async"],
        "get_response": ["self", "request"],
    }.items():
        assert list(inspect.signature(getattr(ASGIHandler, name)).parameters) == params, name
    assert ASGIHandler.chunk_size == 2**16


def test_asgiref_runs_a_thread_sensitive_call_on_the_executor_a_context_is_given():
    """The kept request threads rely on asgiref 3.13's ThreadSensitiveContext(executor=...)."""
    from concurrent.futures import ThreadPoolExecutor

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="given")
    try:

        async def run():
            async with sync.ThreadSensitiveContext(executor=executor):
                return await sync.sync_to_async(
                    lambda: __import__("threading").current_thread().name, thread_sensitive=True
                )()

        assert asyncio.run(run()).startswith("given")
    finally:
        executor.shutdown()


@pytest.mark.django_db(transaction=True)
def test_djangos_own_handler_still_hands_each_of_its_middleware_to_a_thread(hops):
    """The handler's gain (docs/benchmarks/overrides.md) comes from Django running each MiddlewareMixin hook as a
    thread hand-off of its own under ASGI (17 for an API read in Django 5.2). A Django that stops doing so makes
    the override's gain small: measure it again (bench/bench_overrides.py --only handler)."""
    raw = issue("hops", "operator")
    connection.close()
    asyncio.run(
        call(ASGIHandler(), "/api/alerts/?limit=1", headers=[(b"authorization", f"Bearer {raw}".encode())])
    )
    assert hops["n"] >= 10, hops["n"]
    hops["n"] = 0
    asyncio.run(
        call(
            OneHopASGIHandler(),
            "/api/alerts/?limit=1",
            headers=[(b"authorization", f"Bearer {raw}".encode())],
        )
    )
    assert hops["n"] <= 3, hops["n"]


# -- raw_body: slotkeeper/serving.py (Daphne's request, Twisted's form parsing) --------------------------------------


def _receive(factory_kwargs: dict, raw: bytes) -> dict:
    """What a Twisted request made with `factory_kwargs` holds when it is processed, for the bytes `raw`."""
    seen: dict = {}

    class Recording(http.Request):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, **factory_kwargs})

        def process(self):
            seen["args"] = dict(self.args)
            seen["body"] = self.content.read()
            self.setResponseCode(200)
            self.finish()

    channel = http.HTTPChannel()
    channel.requestFactory = Recording
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    seen["answer"] = transport.value()
    return seen


FORM_POST = (
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    b"Content-Length: 7\r\n\r\na=1&b=2"
)
BAD_MULTIPART = (
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Type: multipart/form-data; boundary=zz\r\n"
    b"Content-Length: 9\r\n\r\nnot-parts"
)


def test_twisted_parses_form_bodies_unless_a_request_says_not_to():
    """Differential on Twisted itself: by default a form POST is parsed into `args` on the reactor (and a bad
    multipart body answered 400 by Twisted, the application never called); with parsePOSTFormSubmission=False,
    which RawBodyRequest passes, the body reaches the application as sent."""
    parsed = _receive({}, FORM_POST)
    assert parsed["args"] == {b"a": [b"1"], b"b": [b"2"]}
    raw = _receive({"parsePOSTFormSubmission": False}, FORM_POST)
    assert raw["args"] == {} and raw["body"] == b"a=1&b=2"
    assert "args" not in _receive({}, BAD_MULTIPART)  # Twisted's own 400, before the application
    assert _receive({"parsePOSTFormSubmission": False}, BAD_MULTIPART)["body"] == b"not-parts"


def test_daphne_looks_its_request_class_up_when_it_builds_each_connection():
    """keep_post_bodies_raw() replaces daphne.http_protocol.WebRequest, which only works while Daphne's factory
    reads that module global per connection (daphne 4.2: HTTPFactory.buildProtocol)."""
    from daphne import http_protocol

    from slotkeeper.serving import RawBodyRequest, keep_post_bodies_raw

    keep_post_bodies_raw()  # asgi.py did already, on import; idempotent
    protocol = http_protocol.HTTPFactory(Mock()).buildProtocol(("127.0.0.1", 1))
    assert protocol.requestFactory is RawBodyRequest
    # Daphne's WebRequest hands its keyword arguments on to Twisted's Request, which keeps the flag.
    assert RawBodyRequest(Mock())._parsePOSTFormSubmission is False
    assert issubclass(RawBodyRequest, http.Request)
    assert "parsePOSTFormSubmission" in inspect.signature(http.Request.__init__).parameters


def test_twisted_still_calls_line_length_exceeded_for_a_line_over_16_kib():
    """answer_lines_too_long() replaces HTTPChannel.lineLengthExceeded (tests/test_serving.py holds the answers
    themselves): a Twisted that stops calling it, or renames the first-line mark, goes back to hanging up."""
    called = []
    channel = http.HTTPChannel()
    channel.lineLengthExceeded = lambda line: called.append(len(line))  # type: ignore[method-assign]
    channel.makeConnection(StringTransport())
    channel.dataReceived(b"GET /" + b"a" * 17000 + b" HTTP/1.1\r\n")
    assert called and channel.MAX_LENGTH == 16384
    assert hasattr(http.HTTPChannel(), "_HTTPChannel__first_line")


# -- heartbeat_route: slotkeeper/heartbeat_route.py (DRF's view, in front of Django) ---------------------------------


@pytest.mark.parametrize(
    "now",
    [datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC), datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)],
)
def test_the_routes_server_time_is_written_as_drfs_datetime_field_writes_it(now):
    """The route formats the view's `server_time` itself; DRF 3.18 writes an aware UTC time as ISO 8601 with "Z"
    (and without a fraction when there is none). (The whole answer, headers too, is compared with the view's in
    tests/fleet/test_heartbeat_route.py, test_the_buffered_answer_is_the_views_answer.)"""
    drf = serializers.DateTimeField().to_representation(now)
    assert now.isoformat().replace("+00:00", "Z") == drf


def test_the_media_types_the_route_takes_are_ones_drfs_json_parser_takes():
    """The route buffers only bodies whose Content-Type its `_JSON` pattern matches; each must be one the view's
    parser accepts too, or the route would answer 200 where the view answers 415."""
    from rest_framework.negotiation import DefaultContentNegotiation
    from rest_framework.test import APIRequestFactory

    from slotkeeper.heartbeat_route import _JSON
    from slotkeeper.parsers import BoundedJSONParser

    for media_type in [
        "application/json",
        "application/json; charset=utf-8",
        'Application/JSON;charset="UTF-8"',
    ]:
        assert _JSON.fullmatch(media_type.encode())
        request = APIRequestFactory().post("/", b"{}", content_type=media_type)
        assert DefaultContentNegotiation().select_parser(request, [BoundedJSONParser()]) is not None, (
            media_type
        )


# -- statements: slotkeeper/statements.py (Django's compiler, run once) -----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_template_a_lease_request_uses_reads_what_its_queryset_reads(monkeypatch, register_node):
    """Differential: every statement template a lease's submission and its read back go through (the API token,
    the lease, its reservations, events and reports, the fleet's shapes...) gives, for the values of that call,
    the rows Django's own queryset gives for them."""
    from rest_framework.test import APIClient

    built: dict[int, tuple] = {}
    calls: list[tuple] = []
    original_template, original_rows = statements.template, statements.Template.rows

    def recording_template(alias, name, build, *markers):
        got = original_template(alias, name, build, *markers)
        built[id(got)] = (name, build)
        return got

    def recording_rows(self, alias, *values):
        rows = original_rows(self, alias, *values)
        name, build = built[id(self)]
        queryset = build(*values).using(
            alias
        )  # read at once: the request may change the row next (a token's use)
        if self.attnames is not None:
            expected = [[getattr(obj, a) for a in self.attnames] for obj in queryset]
        else:
            expected = [list(row) for row in queryset]
        calls.append((name, [list(row) for row in rows], expected))
        return rows

    monkeypatch.setattr(statements, "template", recording_template)
    monkeypatch.setattr(statements.Template, "rows", recording_rows)
    for i in range(3):
        node, agent = register_node(name=f"n{i}", now=datetime.now(UTC))
        agent.post(
            f"/api/nodes/{node.pk}/heartbeat", json.dumps({**HEALTHY}), content_type="application/json"
        )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue('templates', 'operator')}")
    lease = client.post("/api/leases/", LEASE, format="json")
    assert lease.status_code == 201, lease.content
    assert client.get(f"/api/leases/{lease.json()['id']}/").status_code == 200
    for name, rows, expected in calls:
        assert rows == expected, name
    assert {"auth.api_token", "leases.by_id", "leases.reservations_of"} <= {c[0] for c in calls}


HEALTHY = {"mem_total_mib": 61440, "mem_used_mib": 6144, "disk_free_gib": 400.0, "cpu_pct": 5.0, "load1": 0.3}
LEASE = {
    "name": "pin",
    "type": "best_effort",
    "duration_s": 600,
    "nodes": [{"cpu_cores": 1, "mem_mib": 1024}],
}


def test_djangos_compiler_still_offers_what_a_template_reads_from_it():
    """A template reads the compiler's select list, column count, converters and klass_info (Django 5.2)."""
    from django.db.models.sql.compiler import SQLCompiler

    from leases.models import Lease

    compiler = Lease.objects.filter(pk=-1).query.get_compiler(using="default")
    _, params = compiler.as_sql()
    assert -1 in params
    columns = [s[0] for s in compiler.select[: compiler.col_count]]
    assert len(columns) == len(Lease._meta.concrete_fields)
    assert list(compiler.klass_info["select_fields"]) == list(range(len(columns)))
    assert list(inspect.signature(SQLCompiler.get_converters).parameters) == ["self", "expressions"]
    assert all(column.target.attname for column in columns)


def test_djangos_postgresql_backend_still_has_what_a_prepared_statement_is_made_with():
    """`prepared` builds its cursor as Django's PostgreSQL backend builds its own (Django 5.2, psycopg 3): the
    server-binding cursor class, the time zone loader, `_prepare_cursor`. (On PostgreSQL, test_statements.py
    compares a prepared lookup's answer with the unprepared one.)"""
    from django.db.backends.postgresql import base
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    assert base.TIMESTAMPTZ_OID == 1184
    assert callable(register_tzloader)
    assert "prepare" in inspect.signature(base.ServerBindingCursor.execute).parameters
    for name in ("_prepare_cursor", "close_if_health_check_failed", "ensure_connection"):
        assert callable(getattr(base.DatabaseWrapper, name)), name


# -- bulk: slotkeeper/bulk.py (bulk_create, bulk_update, save) -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rows_written_by_bulk_read_back_as_djangos_bulk_create_and_bulk_update_write_them(settings):
    """Differential: the same audit rows inserted and then updated through slotkeeper.bulk and through Django's
    own bulk_create and bulk_update (SLOTKEEPER_OVERRIDES_OFF=bulk), read back field by field."""
    from slotkeeper.models import AuditEntry

    def written(off: bool) -> list[list]:
        settings.OVERRIDES_OFF = frozenset({"bulk"} if off else set())
        rows = [
            bulk.Row(
                at=T0,
                actor_id=None,
                actor_label="tank",
                action=f"pin.{i}",
                target_type="node",
                target_id=str(i),
                target_label="",
                reason="",
                details={"n": i, "k": ["é", None]},
            )
            for i in range(3)
        ]
        with transaction.atomic():
            bulk.insert_many(rows, model=AuditEntry)
            bulk.update_many(
                [bulk.Row(pk=r.pk, reason=f"moved {i}", at=T0) for i, r in enumerate(rows)],
                ["reason", "at"],
                model=AuditEntry,
            )
        fields = [f.attname for f in AuditEntry._meta.concrete_fields if not f.primary_key]
        stored = AuditEntry.objects.filter(pk__in=[r.pk for r in rows]).order_by("pk")
        # Keys differ between the two writes; what is compared is every other column, and that each got its own.
        return [[getattr(e, f) for f in fields] + [e.pk == r.pk] for e, r in zip(stored, rows, strict=True)]

    assert written(off=False) == written(off=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (models.CharField(max_length=9), "tank"),
        (models.TextField(), "morpheus"),
        (models.IntegerField(), 7),
        (models.BigIntegerField(), 2**40),
        (models.PositiveIntegerField(), 3),
        (models.BooleanField(), True),
        (models.FloatField(), 0.5),
    ],
)
@pytest.mark.django_db
def test_a_plain_fields_preparation_hands_its_value_on_unchanged(field, value):
    """bulk skips get_db_prep_save for the field classes in bulk._PLAIN_TYPES, on the promise that Django would
    hand such a value on as it is; a Django whose preparation converts it breaks that promise."""
    assert bulk._plain(field) is type(value)
    prepared = field.get_db_prep_save(value, connection)
    assert prepared == value
    if type(prepared) is not type(value):
        # Django 5.2 on PostgreSQL tags an integer with psycopg's size (Int2/Int4/Int8, adapt_integerfield_value)
        # for server-side binding; bulk's arrays are cast to the column's type by the statement (`%b::integer[]`),
        # which gives the server the same. Anything else would be a preparation bulk skips.
        assert connection.vendor == "postgresql" and isinstance(value, int) and isinstance(prepared, int)


@requires_postgres
@pytest.mark.django_db
def test_an_aware_time_is_handed_on_unchanged_by_djangos_postgresql_backend():
    field = models.DateTimeField()
    assert bulk._unchanged(field)(T0)
    assert field.get_db_prep_save(T0, connection) is T0


# -- renderer: slotkeeper/renderers.py (DRF's JSONRenderer) ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_real_leases_answer_renders_to_drfs_bytes(register_node):
    """Differential on an answer the API gives (a lease and its placement report), not only a sample payload
    (tests/test_renderers.py): the fast renderer's bytes are DRF's renderer's."""
    from rest_framework.test import APIClient

    for i in range(3):
        node, agent = register_node(name=f"n{i}", now=datetime.now(UTC))
        agent.post(f"/api/nodes/{node.pk}/heartbeat", json.dumps(HEALTHY), content_type="application/json")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue('renderer', 'operator')}")
    data = client.post("/api/leases/", LEASE, format="json").json()
    assert FastJSONRenderer().render(data, "application/json") == JSONRenderer().render(
        data, "application/json"
    )


def test_drfs_json_renderer_is_the_one_the_fast_renderer_reproduces():
    """FastJSONRenderer writes what DRF 3.18's JSONRenderer.render writes (compact, UTF-8, U+2028/U+2029
    escaped, DRF's encoder for the rest). A DRF whose render changed must be re-read before this is updated."""
    assert source_digest(JSONRenderer.render) == "9a136d750c0b09d1"
    assert JSONRenderer.compact is True and JSONRenderer.ensure_ascii is False
    assert settings.REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"] == ["slotkeeper.renderers.FastJSONRenderer"]


# -- release_rendered: slotkeeper/middleware.py ReleaseRenderedMiddleware (DRF's response cycle) ----------------------


@pytest.mark.django_db
def test_drf_still_leaves_a_response_in_a_cycle_with_its_view():
    """The middleware breaks the cycle DRF 3.18 makes (response -> renderer_context -> view -> response). A DRF
    that no longer makes it lets the middleware go; one that keeps the data elsewhere makes it useless."""
    from rest_framework.test import APIRequestFactory, force_authenticate

    from leases.instances.api.views import AlertViewSet

    request = APIRequestFactory().get("/api/alerts/")
    force_authenticate(request, user=_user("cycle", "viewer"))
    response = AlertViewSet.as_view({"get": "list"})(request)
    response.render()
    assert response.renderer_context["view"].response is response
    assert gc.is_tracked(response)


def _user(name: str, role: str):
    from django.contrib.auth import get_user_model

    issue(name, role)
    return get_user_model().objects.get(username=name)


# -- JSONTextField: fleet/models.py (Django's JSONField stored as jsonb) ------------------------------------------


@pytest.mark.parametrize(
    "name", ["db_type", "get_db_prep_value", "from_db_value", "get_transform", "get_lookup"]
)
def test_json_text_field_overrides_methods_django_s_json_field_still_has_with_the_same_signature(name):
    """A Django that renamed or re-signed one of these would call its own in their place (jsonb again, or a lookup
    the text column cannot answer) without an error. (tests/fleet/test_report_storage.py holds the storage.)"""
    from fleet.models import JSONTextField

    assert name in JSONTextField.__dict__
    assert inspect.signature(getattr(JSONTextField, name)) == inspect.signature(
        getattr(models.JSONField, name)
    )


# -- framework internals read elsewhere (not replacements, held all the same) ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_djangos_on_commit_list_is_still_of_triples_whose_second_is_the_function():
    """slotkeeper/outbox.py and events.py look for their own callback among connection.run_on_commit (Django 5.2:
    (savepoint ids, func, robust) triples) to register it once per transaction."""
    marker = lambda: None  # noqa: E731
    with transaction.atomic():
        transaction.on_commit(marker)
        (entry,) = [e for e in connection.run_on_commit if e[1] is marker]
        assert len(entry) == 3


def test_asgiref_still_remembers_the_loop_a_sync_call_came_from():
    """slotkeeper/events.py finds the serving loop through SyncToAsync.threadlocal.main_event_loop (asgiref 3.13)."""

    async def run():
        return await sync.sync_to_async(
            lambda: getattr(sync.SyncToAsync.threadlocal, "main_event_loop", None), thread_sensitive=False
        )(), asyncio.get_running_loop()

    seen, loop = asyncio.run(run())
    assert seen is loop


def test_the_collector_offers_what_the_tuning_and_its_metrics_use():
    """slotkeeper/collector.py: CPython's gc.freeze and the callbacks' (phase, info) with generation and collected."""
    infos = []

    def callback(phase, info):
        infos.append((phase, info))

    gc.callbacks.append(callback)
    try:
        gc.collect(0)
    finally:
        gc.callbacks.remove(callback)
    assert [p for p, _ in infos] == ["start", "stop"]
    assert {"generation", "collected"} <= set(infos[-1][1])
    assert callable(gc.freeze) and callable(gc.get_freeze_count)
