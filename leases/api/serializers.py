"""Request and response shapes of the leases API. Validation only: the writes happen in leases/actions.py."""

from __future__ import annotations

import functools
import hashlib
import json
import re

from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet import nodestate
from fleet.api.serializers import (
    MAX_CPU_CORES,
    MAX_DISK_GIB,
    MAX_MEM_MIB,
    AlternativeSerializer,
    BlockingLeaseSerializer,
    VerdictSerializer,
)
from fleet.live_shapes import FIGURES, live_shapes
from fleet.models import Node, PlacementReport
from leases.actions import Idempotency
from leases.models import Group, Lease, LeaseEvent, LeaseType, Reservation
from leases.request_rules import (
    MAX_CAPABILITIES,
    MAX_DURATION_S,
    MAX_GROUPS,
    MAX_NAME,
    MAX_NOTIFY_BEFORE_S,
    MAX_RESCHEDULES,
    MAX_START_AHEAD,
    MAX_VMS,
    plain_lease,
    unprintable,
)
from slotkeeper import statements
from slotkeeper.fields import (
    LATEST_TIME,
    AsSentSlugField,
    BoundedDateTimeField,
    BoundedJSONDictField,
    BoundedListField,
    CapabilityField,
    IdQueryField,
    StrictBooleanField,
    StrictFloatField,
    StrictIntegerField,
    json_blob_problem,
)
from slotkeeper.serializers import StrictSerializer

# The driver spec is copied into every assignment the agent reads: bounded, as 2.3 MB of `env` was accepted.
MAX_ARG = 4096
MAX_ENV_VARS = 200
MAX_SPEC_BYTES = 64 * 1024
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")


class VNodeSerializer(StrictSerializer):
    cpu_cores = StrictFloatField(min_value=0, max_value=MAX_CPU_CORES, required=False, default=1)
    mem_mib = StrictIntegerField(min_value=1, max_value=MAX_MEM_MIB)
    disk_gib = StrictIntegerField(min_value=0, max_value=MAX_DISK_GIB, required=False, default=0)


class RestartPolicySerializer(StrictSerializer):
    max_restarts = StrictIntegerField(min_value=0, max_value=1000, required=False)
    window_s = StrictFloatField(min_value=1, max_value=7 * 86400, required=False)
    backoff_initial_s = StrictFloatField(min_value=0, max_value=3600, required=False)
    backoff_max_s = StrictFloatField(min_value=0, max_value=86400, required=False)

    def validate(self, attrs):
        # One bound sent alone moves the other's default (1 s first wait, 30 s cap; leases/instances/rules.py) out
        # of its way: `backoff_max_s: 0.5` alone was refused for a first wait the client never sent.
        if "backoff_initial_s" not in attrs and "backoff_max_s" in attrs:
            attrs["backoff_initial_s"] = min(1.0, attrs["backoff_max_s"])
        if "backoff_max_s" not in attrs and "backoff_initial_s" in attrs:
            attrs["backoff_max_s"] = max(30.0, attrs["backoff_initial_s"])
        if attrs.get("backoff_initial_s", 1.0) > attrs.get("backoff_max_s", 30.0):
            raise serializers.ValidationError({"backoff_max_s": "Must be at least backoff_initial_s."})
        return attrs


class DriverSpecSerializer(StrictSerializer):
    # The agent runs the command as this argv, with this environment (fleet/agent/drivers.py): every character as
    # sent. DRF's CharField trims by default, so `["printf", "%s\n"]` ran as `["printf", "%s"]`, `" a "` as `"a"`, an
    # environment value lost its spaces, and an empty argument (`ssh-keygen -N ""`) was refused.
    command = BoundedListField(
        child=serializers.CharField(max_length=MAX_ARG, allow_blank=True, trim_whitespace=False),
        required=False,
        max_length=200,
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=MAX_ARG, trim_whitespace=False),
        required=False,
    )
    cwd = serializers.CharField(required=False, allow_null=True, max_length=MAX_ARG, trim_whitespace=False)
    stop_grace_s = StrictFloatField(min_value=0, max_value=3600, required=False)
    sim = BoundedJSONDictField(max_bytes=4096, max_depth=4, required=False)

    def validate_env(self, env: dict) -> dict:
        if len(env) > MAX_ENV_VARS:
            raise serializers.ValidationError(f"At most {MAX_ENV_VARS} variables (got {len(env)}).")
        bad = sorted(name for name in env if not ENV_NAME_RE.match(name))[:5]
        if bad:
            raise serializers.ValidationError(
                f"Variable names are letters, digits and '_', not starting with a digit: {', '.join(map(repr, bad))}."
            )
        return env

    def validate(self, attrs):
        if problem := json_blob_problem(attrs, max_bytes=MAX_SPEC_BYTES, max_depth=8):
            raise serializers.ValidationError(problem)
        command = attrs.get("command")
        if command and not command[0].strip():
            raise serializers.ValidationError(
                {"command": "The program (the command's first item) may not be blank."}
            )
        if attrs.get("cwd") is not None and not attrs["cwd"].strip():
            raise serializers.ValidationError({"cwd": "This field may not be blank."})
        return attrs


# NameField's rule as a pattern (ECMA-262, as JSON Schema reads it): no control character and no text-direction
# control anywhere, and one character at least that is none of those nor whitespace (the server trims, then refuses
# blank), so that the schema refuses what the server refuses.
_UNPRINTABLE = "\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069"
NAME_PATTERN = f"^[^{_UNPRINTABLE}]*[^\\s{_UNPRINTABLE}][^{_UNPRINTABLE}]*$"


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": NAME_PATTERN})
class NameField(serializers.CharField):
    """A name a person reads (a lease's): no control character and no text-direction control
    (`request_rules.unprintable`), which would make it read as something else."""

    default_error_messages = {
        "unprintable": "Must not contain control characters or text-direction controls (found {found}).",
    }

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if bad := unprintable(value):
            self.fail("unprintable", found=", ".join(bad[:5]))
        return value


class LeaseCreateSerializer(StrictSerializer):
    name = NameField(max_length=MAX_NAME)
    type = serializers.ChoiceField(choices=LeaseType.choices)
    start = BoundedDateTimeField(required=False, allow_null=True, default=None)
    duration_s = StrictFloatField(min_value=1, max_value=MAX_DURATION_S)
    nodes = VNodeSerializer(many=True, allow_empty=False, max_length=MAX_VMS)
    capabilities = BoundedListField(
        child=CapabilityField(), required=False, default=list, max_length=MAX_CAPABILITIES
    )
    preemptible = StrictBooleanField(required=False, default=True)
    groups = BoundedListField(
        child=AsSentSlugField(max_length=100), required=False, default=list, max_length=MAX_GROUPS
    )
    migratable = StrictBooleanField(required=False, default=True)
    restart_policy = RestartPolicySerializer(required=False, default=dict)
    max_reschedules = StrictIntegerField(min_value=0, max_value=MAX_RESCHEDULES, required=False, default=5)
    auto_approve_reschedules = StrictBooleanField(required=False, default=False)
    driver = serializers.ChoiceField(choices=["sim", "process"], required=False, default="sim")
    spec = DriverSpecSerializer(required=False, default=dict)
    real_duration_s = StrictFloatField(
        min_value=0,
        max_value=MAX_DURATION_S,
        required=False,
        allow_null=True,
        default=None,
        help_text="Simulation and demos only: the lease really ends after this much run time.",
    )
    notify_before_s = StrictIntegerField(
        min_value=0,
        max_value=MAX_NOTIFY_BEFORE_S,
        required=False,
        allow_null=True,
        default=None,
        help_text="Seconds before the lease's end at which a `lease.ending` event is sent on the event feed (once "
        "per end: an extension gets its own); 0 for none; default the server's SLOTKEEPER_NOTIFY_BEFORE_S "
        "(10 minutes).",
    )

    def validate(self, attrs):
        # The request's arrival time, when the caller gives one: the same instant it submits the lease with, so
        # "in the past" means the same here and in the scheduler (which judges it at the request's arrival).
        now = self.context.get("now") or timezone.now()
        if attrs["type"] == LeaseType.ADVANCE_RESERVATION:
            if attrs["start"] is None:
                raise serializers.ValidationError({"start": "An advance reservation needs its exact start."})
            if attrs["start"] < now:
                raise serializers.ValidationError({"start": f"{attrs['start'].isoformat()} is in the past."})
            if attrs["start"] > now + MAX_START_AHEAD:
                raise serializers.ValidationError(
                    {"start": f"An advance reservation starts at most {MAX_START_AHEAD.days} days ahead."}
                )
        elif attrs["start"] is not None:
            raise serializers.ValidationError({"start": "Only an advance reservation takes a start time."})
        check_against_fleet(attrs)
        if attrs["driver"] == "process" and not attrs["spec"].get("command"):
            raise serializers.ValidationError({"spec": "The process driver needs a command."})
        return attrs


def validated_lease(data, now):
    """A lease request's validated body: LeaseCreateSerializer's `validated_data`, or its ValidationError.

    The plain shape is checked by leases/request_rules.py without building the serializer (its fields' deep copy
    was a tenth of a minimal answer), then against the fleet as the serializer's `validate` does; anything that
    shape leaves undecided, or the fleet refuses, goes through the serializer, which words the refusal."""
    plain = plain_lease(data, now, _parse_start)
    if plain is not None:
        try:
            check_against_fleet(plain)
        except serializers.ValidationError:
            pass  # refused: the serializer runs the same check and words the 400 as it always has
        else:
            return plain
    ser = LeaseCreateSerializer(data=data, context={"now": now})
    ser.is_valid(raise_exception=True)
    return ser.validated_data


# The start field's own parsing, shared: to_internal_value keeps nothing on the field, so threads may share it.
_START_FIELD = BoundedDateTimeField()


def _parse_start(text: str):
    try:
        return _START_FIELD.to_internal_value(text)
    except serializers.ValidationError:
        return None


# An Idempotency-Key: 1-255 visible ASCII characters (a UUID, a job's own id), as the header's draft standard
# (draft-ietf-httpapi-idempotency-key-header) leaves its form to the server.
_IDEMPOTENCY_KEY = re.compile(r"[!-~]{1,255}")


def idempotency_of(request) -> Idempotency | None:
    """The request's Idempotency-Key header with a digest of its body, None without the header; a malformed key
    is a 400 naming the header."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise serializers.ValidationError(
            {"Idempotency-Key": ["Must be 1-255 visible ASCII characters (no spaces), e.g. a UUID."]}
        )
    data = request.data
    if hasattr(data, "lists"):  # a form's QueryDict: every value of every field
        data = dict(data.lists())
    body = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return Idempotency(key, hashlib.sha256(body.encode()).hexdigest())


def check_against_fleet(attrs) -> None:
    """What a lease request's body is checked against in the database: every VM fits some live node, every group
    exists. Raises the serializer's ValidationError."""
    _check_sizes(attrs["nodes"], attrs.get("capabilities") or ())
    if attrs["groups"]:  # most requests name none: no queryset built for them
        known = set(Group.objects.filter(name__in=attrs["groups"]).values_list("name", flat=True))
        if missing := sorted(set(attrs["groups"]) - known):
            raise serializers.ValidationError({"groups": f"Unknown group(s): {', '.join(missing)}."})


def _check_sizes(vnodes, capabilities=()):
    """Each VM must fit on one node's allocatable capacity (docs/capacity.md): larger can never be placed. The
    message names the largest node that has the lease's capabilities (the one it would need to outgrow), or says
    that none has them."""
    # Per distinct shape, not per node: a fleet has a few, and this runs for every lease request (reading
    # 1,000 nodes' figures was a few ms of each).
    shapes = {shape: nodestate.allocatable(*shape) for shape in live_shapes()}
    if not shapes:
        raise serializers.ValidationError({"nodes": "The fleet has no nodes yet."})
    largest = max(shapes.values(), key=lambda lim: lim.mem_mib)
    max_cpu = max(lim.cpu_cores for lim in shapes.values())
    max_disk = max(lim.disk_gib for lim in shapes.values())
    errors = {}
    for i, v in enumerate(vnodes):
        problems = []
        if v["mem_mib"] > largest.mem_mib:
            problems.append(f"mem_mib {v['mem_mib']} exceeds {_largest_named(largest.mem_mib, capabilities)}")
        if v["cpu_cores"] > max_cpu:
            problems.append(f"cpu_cores {v['cpu_cores']} exceeds the largest node's {max_cpu} cores")
        if v["disk_gib"] > max_disk:
            problems.append(f"disk_gib {v['disk_gib']} exceeds the largest node's {max_disk} GiB allocatable")
        if problems:
            errors[i] = "; ".join(problems)
    if errors:
        raise serializers.ValidationError({"nodes": {str(i): msg for i, msg in errors.items()}})


def _largest_named(largest_mib: int, capabilities) -> str:
    """ "the largest node (tank, 51200 MiB allocatable)", or with capabilities the largest node that has them all
    (by allocatable memory, then name), among the nodes not dead, as the check itself. Read only when a request is
    refused: every live node's row."""
    wanted = set(capabilities)
    live = sorted(
        (-nodestate.allocatable(*shape).mem_mib, name, set(caps or ()))
        for name, caps, *shape in Node.objects.exclude(status="dead").values_list(
            "name", "capabilities", *FIGURES
        )
    )
    if not wanted:
        name = next((name for mem, name, _ in live if -mem == largest_mib), "a node since removed")
        return f"the largest node ({name}, {largest_mib} MiB allocatable)"
    with_caps = [(name, -mem) for mem, name, caps in live if wanted <= caps]
    listed = ", ".join(sorted(wanted))
    if not with_caps:
        return f"the largest node ({largest_mib} MiB allocatable), and no live node has {listed}"
    name, mem = with_caps[0]
    return f"the largest node with {listed} ({name}, {mem} MiB allocatable)"


class ReservationSerializer(serializers.ModelSerializer):
    lease_name = serializers.CharField(source="lease.name", read_only=True)
    lease_type = serializers.CharField(source="lease.type", read_only=True)
    node_ids = serializers.SerializerMethodField()

    class Meta:
        model = Reservation
        fields = [
            "rid",
            "lease",
            "lease_name",
            "lease_type",
            "kind",
            "start",
            "end",
            "status",
            "nodes",
            "node_ids",
        ]
        read_only_fields = fields

    def get_node_ids(self, r: Reservation) -> list[int]:
        return sorted(set(r.nodes.values()))


class LeaseEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = LeaseEvent
        fields = ["at", "from_state", "to_state", "message"]
        read_only_fields = fields


class ReportBriefSerializer(serializers.ModelSerializer):
    summary = serializers.CharField(read_only=True)
    counts = serializers.DictField(child=serializers.IntegerField(), read_only=True)
    verdicts = VerdictSerializer(source="rows", many=True, read_only=True)

    class Meta:
        model = PlacementReport
        fields = ["id", "created_at", "outcome", "message", "summary", "counts", "chosen", "verdicts"]
        read_only_fields = fields


class ReportSummarySerializer(ReportBriefSerializer):
    """A placement report without its per-node verdicts, and where to read them in full."""

    verdicts = None  # DRF's way of leaving out a field declared on the parent
    url = serializers.SerializerMethodField(help_text="The whole report, every node's verdict in it.")

    class Meta(ReportBriefSerializer.Meta):
        fields = [*(f for f in ReportBriefSerializer.Meta.fields if f != "verdicts"), "url"]
        read_only_fields = fields

    def get_url(self, report) -> str:
        # The documented path, with its slash (the router resolves both and reverses to the bare one).
        return reverse("api:placement-report-detail", args=[report.pk]).rstrip("/") + "/"


MAX_BATCH_ITEMS = 1000


class LeaseBatchSerializer(StrictSerializer):
    leases = BoundedListField(
        child=serializers.DictField(),
        min_length=1,
        max_length=MAX_BATCH_ITEMS,
        help_text="Up to 1,000 lease bodies, each exactly as POST /api/leases/ takes it (plus `idempotency_key`), "
        "decided in one planning pass, in order, as if submitted one after another.",
    )


class LeaseBatchSchemaSerializer(StrictSerializer):
    """The request as the schema states it: any objects, 1 to 1,000 of them, each checked on its own as a lease
    request (`LeaseCreateRequest`, and an optional `idempotency_key`) and answered in its own result, so that a bad item does not stop the others
    (a 400 in its `status`, not for the whole array)."""

    leases = serializers.ListField(
        child=serializers.DictField(),
        min_length=1,
        max_length=MAX_BATCH_ITEMS,
        help_text="Each a lease request as `POST /api/leases/` takes it (`LeaseCreateRequest`), with an optional "
        "`idempotency_key` (1-255 visible ASCII characters, as the Idempotency-Key header of a single request); one "
        "that is not is answered 400 in its own result.",
    )


class LeaseBatchResultSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="The item's place in the request, from 0.")
    status = serializers.ChoiceField(
        choices=[201, 409, 400], help_text="What the single request would answer."
    )
    id = serializers.IntegerField(required=False, help_text="The lease (absent for a 400).")
    state = serializers.CharField(required=False, help_text="Its state (absent for a 400).")
    message = serializers.CharField()
    code = serializers.CharField(required=False, help_text="For a 409: as the single request's `code`.")
    errors = serializers.DictField(required=False, help_text="For a 400: the field errors.")
    idempotent_replayed = serializers.BooleanField(
        required=False, help_text="The answer of an earlier request with this item's key."
    )
    summary = serializers.CharField(
        required=False, help_text="Unless Prefer: return=minimal: the verdicts' line."
    )
    counts = serializers.DictField(child=serializers.IntegerField(), required=False)
    report = serializers.IntegerField(required=False, help_text="The decision's placement report.")
    alternatives = AlternativeSerializer(
        many=True,
        required=False,
        help_text="A 409 advance reservation with no room: as the single request's (for the array's first 50 such "
        "items; the what-if answers the same for any window).",
    )
    blocking = BlockingLeaseSerializer(
        many=True, required=False, help_text="With `alternatives`: as the single request's."
    )


class LeaseBatchResponseSerializer(serializers.Serializer):
    results = LeaseBatchResultSerializer(many=True)


def idempotency_of_item(key, item: dict) -> Idempotency | None:
    """An array item's key with the digest of its body (the item less its key), as `idempotency_of` makes them for
    a single request's header and body; a malformed key is a ValidationError for the item."""
    if key is None:
        return None
    if not isinstance(key, str) or not _IDEMPOTENCY_KEY.fullmatch(key):
        raise serializers.ValidationError(
            {"idempotency_key": ["Must be 1-255 visible ASCII characters (no spaces), e.g. a UUID."]}
        )
    body = json.dumps(item, sort_keys=True, separators=(",", ":"), default=str)
    return Idempotency(key, hashlib.sha256(body.encode()).hexdigest())


class LeaseRejectedSerializer(serializers.Serializer):
    """The answer to a lease request that was not placed (409), for the schema: the view writes it."""

    detail = serializers.CharField(
        help_text="Why, in words: the missing capability, the largest capable node..."
    )
    code = serializers.ChoiceField(
        choices=["no_capable_node", "fleet_at_capacity", "fleet_unreadable", "rejected"],
        help_text="no_capable_node: no node could ever take it (permanent: not queued, do not retry as it is); "
        "fleet_at_capacity: capable nodes exist and are full or booked over the window (transient); "
        "fleet_unreadable: capable nodes exist but none can be read now (offline, silent: NOT a full fleet); "
        "rejected: refused for its window (an advance reservation whose whole window passed).",
    )
    lease = serializers.IntegerField()
    state = serializers.CharField()
    alternatives = AlternativeSerializer(
        many=True,
        required=False,
        help_text="An advance reservation with no room: up to three earliest windows of the same duration, at or "
        "after the asked start, in which the whole lease would be placed now (earliest first); resubmit with one "
        "`start` to take it.",
    )
    blocking = BlockingLeaseSerializer(
        many=True,
        required=False,
        help_text="An advance reservation with no room: the leases whose reservations stand in the asked window on "
        "the nodes that could take it and that it may not preempt (the largest share of the window first).",
    )
    verdicts = VerdictSerializer(many=True, required=False, help_text="Every node's verdict.")
    report = ReportSummarySerializer(
        required=False, help_text="With Prefer: return=minimal, instead of verdicts."
    )


class LeaseSerializer(serializers.ModelSerializer):
    nodes = serializers.JSONField(source="vnodes", read_only=True)
    start = serializers.DateTimeField(source="requested_start", read_only=True, allow_null=True)
    estimated_start = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="A queued lease only: when it would start were every queued lease reserved in queue order, as "
        "conservative backfilling would (an estimate, refreshed as the plan changes). Null otherwise, or when "
        "none can be given (estimate_note says why).",
    )
    estimated_end = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="With estimated_start: when it would end."
    )
    estimate_note = serializers.CharField(
        read_only=True,
        help_text="Why a queued lease has no estimated_start (for example: no usable node has the capability it "
        "needs); empty otherwise.",
    )

    class Meta:
        model = Lease
        fields = [
            "id",
            "name",
            "type",
            "state",
            "submitted_at",
            "start",
            "duration_s",
            "nodes",
            "capabilities",
            "preemptible",
            "first_start",
            "ended_at",
            "run_time_s",
            "lost_run_time_s",
            "message",
            "estimated_start",
            "estimated_end",
            "estimate_note",
            "migratable",
            "restart_policy",
            "max_reschedules",
            "auto_approve_reschedules",
            "driver",
            "spec",
            "groups",
            "notify_before_s",
            "ending_notified_for",
        ]
        read_only_fields = fields

    groups = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)


def plain(serializer_class, instance, **kwargs):
    """`serializer_class(instance).data` as plain dicts and lists, held by nothing else.

    Without other arguments than `many`, one serializer of each class is built once and shared: it holds no
    instance and no context, and DRF rebuilt its fields on every answer (a lease's answer builds five
    serializers; their fields were about a millisecond of each answer).

    `.data` keeps what it returns on the serializer, as the serializer keeps `instance` (a queryset keeps the rows
    it read, and a report its decoded rows), and the data points back at the serializer, whose fields point back
    at it: a reference cycle that kept a lease's placement reports (a dict per node, 1,000 of them at 1,000
    nodes) alive after the answer until the cyclic collector's next pass, which then paused whichever request ran
    (docs/benchmarks/burst-http.md, the seventh session's run). The representation alone is the same JSON."""
    if kwargs.keys() <= {"many"}:
        return _shared(serializer_class, kwargs.get("many", False)).to_representation(instance)
    return serializer_class(**kwargs).to_representation(instance)  # the serializer never holds the instance


@functools.cache
def _shared(serializer_class, many: bool):
    """One serializer of `serializer_class` for every answer: `to_representation` reads its fields and writes
    nothing on it, so threads share it (the first ones may each build its fields; one is kept)."""
    return serializer_class(many=many)


class LeaseDetailSerializer(LeaseSerializer):
    reservations = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()
    placement_reports = serializers.SerializerMethodField()

    class Meta(LeaseSerializer.Meta):
        fields = [*LeaseSerializer.Meta.fields, "reservations", "history", "placement_reports"]
        read_only_fields = fields

    # The three reads below come from statements compiled once (slotkeeper/statements.py): a lease's whole
    # answer is read on every full answer to a lease request, and building its querysets was a part of each.

    def get_reservations(self, lease) -> list[dict]:
        rows = statements.instances(Reservation, "leases.reservations_of", _reservations_of, -1, lease.pk)
        for row in rows:
            row.lease = lease  # what select_related("lease") gave: the name and type the rows show
        return plain(ReservationSerializer, rows, many=True)

    def get_history(self, lease) -> list[dict]:
        rows = statements.instances(LeaseEvent, "leases.events_of", _events_of, -1, lease.pk)
        return plain(LeaseEventSerializer, rows, many=True)

    def get_placement_reports(self, lease) -> list[dict]:
        subject = f"lease:{lease.pk}"
        reports = statements.instances(
            PlacementReport, "reports.about", _reports_about, "\x00subject", subject
        )
        return plain(ReportBriefSerializer, reports, many=True)


def _reservations_of(lease_id: int):
    # A reservation cancelled before it started was superseded by a re-plan (the history step that replaced it
    # says from where to where): it is not part of the lease's story, so it is not listed.
    return Reservation.objects.filter(lease_id=lease_id).exclude(status="cancelled").order_by("start", "rid")


def _events_of(lease_id: int):
    return LeaseEvent.objects.filter(lease_id=lease_id).order_by("at", "id")


def _reports_about(subject: str):
    return PlacementReport.objects.filter(subject=subject).order_by("created_at", "id")


class LeaseMinimalSerializer(LeaseSerializer):
    """The answer to a lease request sent with `Prefer: return=minimal` (RFC 7240): the lease and its decision's
    report without the per-node verdicts, which are most of a full answer at fleet scale (about 330 KiB at 1,000
    nodes); `placement_report.url` reads them."""

    placement_report = ReportSummarySerializer(read_only=True)

    class Meta(LeaseSerializer.Meta):
        fields = [*LeaseSerializer.Meta.fields, "placement_report"]
        read_only_fields = fields

    @staticmethod
    def answer(lease: Lease, report: PlacementReport) -> dict:
        """This serializer's representation of `lease` with `report`, from the shared serializers (`plain`)."""
        return {**plain(LeaseSerializer, lease), "placement_report": plain(ReportSummarySerializer, report)}


class CancelSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class ExtendSerializer(StrictSerializer):
    """`end` or `by_s`, exactly one (issue 48)."""

    end = BoundedDateTimeField(required=False, help_text="The new end of the lease's current plan.")
    by_s = StrictFloatField(
        required=False,
        min_value=-MAX_DURATION_S,
        max_value=MAX_DURATION_S,
        help_text="Seconds to move the end by: positive extends, negative shortens.",
    )
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")

    def validate(self, attrs):
        if ("end" in attrs) == ("by_s" in attrs):
            raise serializers.ValidationError({"end": ["Give either 'end' or 'by_s'."]})
        return attrs


class DryRunSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField(required=False, default=False)


class EndVerdictSerializer(serializers.Serializer):
    node = serializers.CharField()
    fits = serializers.BooleanField()
    reason = serializers.CharField()


class ExtendAnswerSerializer(serializers.Serializer):
    lease = serializers.IntegerField()
    dry_run = serializers.BooleanField()
    from_end = serializers.DateTimeField(
        allow_null=True, help_text="The end before the change (null: the lease has no plan to change)."
    )
    end = serializers.DateTimeField(
        allow_null=True, help_text="The end asked for (and, when done, the lease's end)."
    )
    message = serializers.CharField()
    detail = serializers.CharField(required=False, help_text="Why not (409), as `message`.")
    replanned = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Best-effort leases whose future plans make way, planned again after it.",
    )
    code = serializers.ChoiceField(
        choices=["blocked", "too_early", "not_changeable"],
        required=False,
        help_text="Why not (409): blocked (its nodes are booked by leases it may not move: `blocking`, "
        "`latest_end`), too_early (the end asked is before its start or now), not_changeable (not placed or "
        "running).",
    )
    blocking = BlockingLeaseSerializer(many=True, required=False)
    latest_end = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="The latest end that fits now (null: not even the current one).",
    )
    verdicts = EndVerdictSerializer(many=True, required=False)


class SlotWindowSerializer(serializers.Serializer):
    """The query string of GET /api/slots/ (not strict: a query string may carry `limit` and friends)."""

    start = BoundedDateTimeField(required=False, help_text="ISO time; default an hour ago")
    end = BoundedDateTimeField(required=False, help_text="ISO time; default 25 h after start")
    node = IdQueryField(required=False, help_text="only reservations on this node")

    def validate(self, attrs):
        now = timezone.now()
        attrs.setdefault("start", now - timezone.timedelta(hours=1))
        # start < LATEST_TIME (year 9000), so the default end cannot overflow (it did at 9999-12-31T20:00Z).
        attrs.setdefault("end", min(attrs["start"] + timezone.timedelta(hours=25), LATEST_TIME))
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "The window's end must be after its start."})
        if attrs["end"] - attrs["start"] > timezone.timedelta(days=31):
            raise serializers.ValidationError({"end": "A window is at most 31 days long."})
        return attrs


class SlotWindowResponseSerializer(serializers.Serializer):
    """What GET /api/slots/ answers: the window it used (defaults filled in) and the reservations in it."""

    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    reservations = ReservationSerializer(many=True)
