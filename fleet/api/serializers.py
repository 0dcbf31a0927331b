"""Request and response shapes of the fleet API. Validation only: the writes happen in fleet/actions.py."""

from __future__ import annotations

import functools
from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet import nodestate, reports
from fleet.capacity import ReasonCode
from fleet.heartbeat_rules import MAX_CPU_CORES, MAX_DISK_GIB, MAX_LOAD1, MAX_MEM_MIB
from fleet.models import Node, PlacementReport
from slotkeeper.fields import (
    INT32_MAX,
    INT32_MIN,
    AsSentRegexField,
    BoundedDateTimeField,
    BoundedListField,
    CapabilityField,
    StrictFloatField,
    StrictIntegerField,
)
from slotkeeper.serializers import StrictSerializer

# The physical bounds of one machine live with the heartbeat's pure rules, which check the common heartbeat
# without this module (fleet/heartbeat_rules.py); the same numbers bound every serializer here.
MAX_LOG_LINE = 4000
# A drain's moves at once, in the API and the console's drain form alike.
MAX_PARALLEL_MOVES = 1000
REASON_CODES = {str(c) for c in ReasonCode}
NODE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


class ResourcesSerializer(serializers.Serializer):
    cpu_cores = serializers.FloatField()
    mem_mib = serializers.IntegerField()
    disk_gib = serializers.IntegerField()


def resources(cpu_cores: float, mem_mib: int, disk_gib: int) -> dict:
    return {"cpu_cores": cpu_cores, "mem_mib": mem_mib, "disk_gib": disk_gib}


class NodeSerializer(serializers.ModelSerializer):
    """A node with its capacity figures (docs/capacity.md): `allocatable` (declared less the host reserve and
    baseline), `committed` (what the slot table holds on it now) and `free_now` (the difference, negative when
    running work exceeds allocatable, which `over_allocatable` flags). `committed` comes from the caller's context
    (`committed`: node id -> (cores, MiB, GiB)), read in one query by the layer that knows leases."""

    drained_by = serializers.SerializerMethodField()
    allocatable = serializers.SerializerMethodField()
    committed = serializers.SerializerMethodField()
    free_now = serializers.SerializerMethodField()
    over_allocatable = serializers.SerializerMethodField()
    health_age_s = serializers.SerializerMethodField()
    observed = serializers.SerializerMethodField()
    fenced = serializers.BooleanField(read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "cpu_cores",
            "mem_total_mib",
            "disk_total_gib",
            "capabilities",
            "status",
            "status_reason",
            "status_changed_at",
            "drain_reason",
            "drained_by",
            "drained_at",
            "drain_deadline",
            "drain_max_parallel",
            "last_heartbeat_at",
            "health_age_s",
            "observed",
            "idle_baseline_mib",
            "allocatable",
            "committed",
            "free_now",
            "over_allocatable",
            "fenced",
            "fenced_at",
            "fence_reason",
            "last_fenced_heartbeat_at",
            "version",
        ]
        read_only_fields = fields

    def _figures(self, node: Node) -> nodestate.CapacityFigures:
        committed = self.context.get("committed", {}).get(node.pk)
        return nodestate.capacity_figures(
            node.cpu_cores, node.mem_total_mib, node.disk_total_gib, node.idle_baseline_mib, committed
        )

    @extend_schema_field(ResourcesSerializer)
    def get_allocatable(self, node: Node) -> dict:
        return resources(*self._figures(node).allocatable)

    @extend_schema_field(ResourcesSerializer)
    def get_committed(self, node: Node) -> dict:
        return resources(*self._figures(node).committed)

    @extend_schema_field(ResourcesSerializer)
    def get_free_now(self, node: Node) -> dict:
        return resources(*self._figures(node).free)

    def get_over_allocatable(self, node: Node) -> bool:
        return self._figures(node).over_allocatable

    def get_drained_by(self, node: Node) -> str | None:
        return node.drained_by.get_username() if node.drained_by_id else None

    def get_health_age_s(self, node: Node) -> float | None:
        if node.last_heartbeat_at is None:
            return None
        return round((timezone.now() - node.last_heartbeat_at).total_seconds(), 1)

    def get_observed(self, node: Node) -> dict:
        return {
            "mem_total_mib": node.obs_mem_total_mib,
            "mem_used_mib": node.obs_mem_used_mib,
            "disk_free_gib": node.obs_disk_free_gib,
            "cpu_pct": node.obs_cpu_pct,
            "load1": node.obs_load1,
            "instances": node.reported_instances,
        }


class NodeWriteSerializer(StrictSerializer):
    name = AsSentRegexField(
        NODE_NAME_RE,
        max_length=100,
        error_messages={"invalid": "Letters, digits, '.', '_' and '-' only; at most 100 characters."},
    )
    cpu_cores = StrictIntegerField(min_value=1, max_value=MAX_CPU_CORES)
    mem_total_mib = StrictIntegerField(min_value=1, max_value=MAX_MEM_MIB)
    disk_total_gib = StrictIntegerField(min_value=0, max_value=MAX_DISK_GIB)
    capabilities = BoundedListField(child=CapabilityField(), required=False, default=list, max_length=200)

    def __init__(self, *args, node_id: int | None = None, **kwargs):
        self.node_id = node_id  # the node being edited, whose own name is no clash
        super().__init__(*args, **kwargs)

    def validate_name(self, name: str) -> str:
        # Names are unique ignoring case (a DB constraint on Lower(name) backs this up under races): "Tank" beside
        # "tank" reads as one machine on the board and in every log line. The exact same name stays a 409 conflict,
        # raised by the action, as it always was.
        clash = Node.objects.filter(name__iexact=name).exclude(name=name)
        if self.node_id is not None:
            clash = clash.exclude(pk=self.node_id)
        if other := clash.values_list("name", flat=True).first():
            raise serializers.ValidationError(
                f"{name!r} differs only in case from the existing node {other!r}."
            )
        return name


class NodeCreatedSerializer(NodeSerializer):
    token = serializers.CharField(help_text="The node agent's token. Shown once; only its digest is stored.")

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "token"]
        read_only_fields = fields


class InstanceReportSerializer(StrictSerializer):
    id = serializers.CharField(max_length=100)
    status = serializers.ChoiceField(
        choices=["starting", "running", "exited", "failed", "stopped", "unhealthy"],
        required=False,
        default="running",
    )
    # Stored in an `integer` column; a process exit status is far smaller (1e20 was a 500 on PostgreSQL).
    exit_code = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=INT32_MIN, max_value=INT32_MAX
    )
    log_tail = BoundedListField(
        child=serializers.CharField(allow_blank=True, max_length=MAX_LOG_LINE),
        required=False,
        default=list,
        max_length=1000,
    )
    detail = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    # The agent reports the generation it runs (fleet/agent/agent.py); the server reads the generation from its own
    # rows, so it is checked and then left out, as before. Known, so not refused as an unknown field.
    generation = StrictIntegerField(required=False, allow_null=True, min_value=0, write_only=True)


@extend_schema_field(
    {
        "oneOf": [
            {
                "type": "string",
                "minLength": 1,
                "maxLength": 100,
                "description": "an instance id, reported running",
            },
            {
                "type": "object",
                "required": ["id"],
                "properties": {
                    "id": {"type": "string", "minLength": 1, "maxLength": 100},
                    "status": {
                        "type": "string",
                        "enum": ["starting", "running", "exited", "failed", "stopped", "unhealthy"],
                    },
                    "exit_code": {
                        "type": "integer",
                        "nullable": True,
                        "minimum": INT32_MIN,
                        "maximum": INT32_MAX,
                    },
                    "log_tail": {
                        "type": "array",
                        "items": {"type": "string", "maxLength": MAX_LOG_LINE},
                        "maxItems": 1000,
                    },
                    "detail": {"type": "string", "maxLength": 2000},
                    "generation": {
                        "type": "integer",
                        "nullable": True,
                        "minimum": 0,
                        "maximum": INT32_MAX,
                        "description": "the generation the agent runs (informational)",
                    },
                },
                "additionalProperties": False,
            },
        ]
    }
)
class InstanceEntryField(serializers.Field):
    """An instance in a heartbeat: either its id alone, or an object with its status."""

    def to_internal_value(self, data):
        if isinstance(data, str) and data:
            # The same checks as the object form's id (length, no NUL): it is stored in the node row's JSON.
            ident = _instance_id_field().run_validation(data)
            return {"id": ident, "status": "running", "exit_code": None, "log_tail": [], "detail": ""}
        if isinstance(data, dict):
            ser = InstanceReportSerializer(data=data)
            ser.is_valid(raise_exception=True)
            out = dict(ser.validated_data)
            out.pop("generation", None)
            out["log_tail"] = out["log_tail"][-50:]
            return out
        raise serializers.ValidationError("An instance is an id string or an object with 'id' and 'status'.")

    def to_representation(self, value):
        return value


@functools.cache
def _instance_id_field() -> serializers.Field:
    # Built once, not per id: a serializer's fields are deep copies, and a report of 10,000 ids built 10,000.
    # Validating keeps nothing on the field, so threads may share it.
    return InstanceReportSerializer().fields["id"]


class HeartbeatSerializer(StrictSerializer):
    mem_total_mib = StrictIntegerField(min_value=1, max_value=MAX_MEM_MIB)
    mem_used_mib = StrictIntegerField(min_value=0, max_value=MAX_MEM_MIB)
    disk_free_gib = StrictFloatField(min_value=0, max_value=MAX_DISK_GIB)
    cpu_pct = StrictFloatField(min_value=0, max_value=100)
    load1 = StrictFloatField(min_value=0, max_value=MAX_LOAD1)
    instances = BoundedListField(child=InstanceEntryField(), required=False, default=list, max_length=10_000)

    def validate(self, attrs):
        if attrs["mem_used_mib"] > attrs["mem_total_mib"]:
            raise serializers.ValidationError(
                {
                    "mem_used_mib": f"Used memory ({attrs['mem_used_mib']} MiB) exceeds the total ({attrs['mem_total_mib']} MiB)."
                }
            )
        return attrs


class HeartbeatAckSerializer(serializers.Serializer):
    status = serializers.CharField()
    server_time = serializers.DateTimeField()


class ReasonSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=300, trim_whitespace=True)


class DrainSerializer(ReasonSerializer):
    deadline = BoundedDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="With a deadline the node's instances are moved off; what is left at the deadline is stopped.",
    )
    max_parallel = StrictIntegerField(min_value=1, max_value=MAX_PARALLEL_MOVES, required=False, default=2)


class OptionalReasonSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


# How far ahead a what-if's window may start: a lease's own bound (leases/request_rules.MAX_START_AHEAD, which fleet
# may not import; a test holds the two equal).
PREVIEW_START_AHEAD = timedelta(days=10 * 366)


class PreviewSerializer(StrictSerializer):
    mem_mib = StrictIntegerField(min_value=1, max_value=MAX_MEM_MIB)
    disk_gib = StrictIntegerField(min_value=0, max_value=MAX_DISK_GIB, required=False, default=0)
    cpu_cores = StrictFloatField(min_value=0, max_value=MAX_CPU_CORES, required=False, default=0)
    capabilities = BoundedListField(child=CapabilityField(), required=False, default=list, max_length=50)
    count = StrictIntegerField(min_value=1, max_value=1000, required=False, default=1)
    preferred_node = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, default=None, max_length=100
    )
    duration_s = StrictFloatField(
        min_value=1,
        max_value=10 * 365 * 86400,
        required=False,
        default=3600,
        help_text="How long the VMs would run (from `start`, or from now): the window the verdicts are about.",
    )
    start = BoundedDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Ask as an advance reservation for [start, start + duration_s) would be decided (at or after "
        "now, at most about ten years ahead); without it, as an immediate lease from now.",
    )

    def validate(self, attrs):
        start = attrs.get("start")
        if start is not None:
            now = timezone.now()
            if start < now:
                raise serializers.ValidationError({"start": f"{start.isoformat()} is in the past."})
            if start > now + PREVIEW_START_AHEAD:
                raise serializers.ValidationError(
                    {"start": f"An advance reservation starts at most {PREVIEW_START_AHEAD.days} days ahead."}
                )
        return attrs


class VerdictRows(serializers.ListSerializer):
    """A report's verdicts. The rows `PlacementReport.rows` decodes are already exactly this shape (the fields
    below, in JSON types), so they go out as they are: DRF's field-by-field representation of a 1,000-node
    report's rows was a third of a Daphne process's time answering `POST /api/leases/` (docs/benchmarks/burst-http.md,
    the seventh session's run). A row of any other shape (reports stored before they were compact) goes
    through the fields as before. Rows a compact report decoded (`reports.Rows`) are all of that shape by
    construction: the list goes out whole, without its 1,000 rows' keys compared."""

    def to_representation(self, data):
        if type(data) is reports.Rows:
            return data
        keys = frozenset(self.child.fields)
        represent = self.child.to_representation
        return [row if type(row) is dict and row.keys() == keys else represent(row) for row in data]


class VerdictSerializer(serializers.Serializer):
    """One node's verdict (docs/capacity.md): `fit` exactly when `holds` > 0; otherwise a `reason_code` from the
    closed list and a `reason` in user units; `numbers` are the short dimension's figures over the window."""

    class Meta:
        list_serializer_class = VerdictRows

    node = serializers.CharField()
    node_id = serializers.IntegerField(allow_null=True, required=False)
    fit = serializers.BooleanField()
    holds = serializers.IntegerField(
        required=False, help_text="How many of the request's VMs the node could take."
    )
    reason_code = serializers.ChoiceField(choices=sorted(REASON_CODES), allow_null=True)
    reason = serializers.CharField(allow_null=True)
    rank = serializers.IntegerField(
        allow_null=True, required=False, help_text="The order the node was tried in."
    )
    chosen = serializers.BooleanField(required=False)
    slots = serializers.IntegerField(allow_null=True)
    headroom = serializers.FloatField(allow_null=True)
    blockers = serializers.ListField(
        child=serializers.IntegerField(), required=False, help_text="Leases in the way."
    )
    numbers = serializers.DictField(required=False)


class AlternativeSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    nodes = serializers.ListField(
        child=serializers.CharField(), help_text="The nodes it would run on, by name."
    )


class BlockingLeaseSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class PlacementResultSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(
        choices=["placed", "no_capable_node", "fleet_at_capacity", "fleet_unreadable"]
    )
    nodes = serializers.ListField(child=serializers.CharField())
    message = serializers.CharField()
    preferred_note = serializers.CharField(allow_null=True, required=False)
    start = serializers.DateTimeField(help_text="The window asked about: from now, or the `start` given.")
    end = serializers.DateTimeField()
    preempts = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Best-effort leases an advance reservation for this window would suspend or requeue.",
    )
    report = serializers.IntegerField(help_text="Id of the stored placement report.")
    summary = serializers.CharField(
        required=False, help_text="What the fleet holds of the request, in one line."
    )
    alternatives = AlternativeSerializer(
        many=True,
        required=False,
        help_text="A window (`start` given) with no room: up to three earliest windows of the same duration, at or "
        "after it, in which the whole request would be placed now.",
    )
    blocking = BlockingLeaseSerializer(
        many=True,
        required=False,
        help_text="A window with no room: the leases in the way that it may not preempt.",
    )
    verdicts = VerdictSerializer(many=True)


class PlacementReportSerializer(serializers.ModelSerializer):
    summary = serializers.CharField(
        read_only=True, help_text="What the fleet holds of the request, in one line."
    )
    counts = serializers.DictField(
        child=serializers.IntegerField(),
        read_only=True,
        help_text="Nodes evaluated, fit, and per reason code.",
    )
    verdicts = VerdictSerializer(source="rows", many=True, read_only=True)

    class Meta:
        model = PlacementReport
        fields = [
            "id",
            "created_at",
            "subject",
            "request",
            "outcome",
            "message",
            "summary",
            "counts",
            "chosen",
            "preferred_note",
            "verdicts",
            "requested_by",
        ]
        read_only_fields = fields
