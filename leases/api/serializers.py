"""Request and response shapes of the leases API. Validation only: the writes happen in leases/actions.py."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import serializers

from fleet.models import Node, PlacementReport
from leases.models import Group, Lease, LeaseEvent, LeaseType, Reservation
from slotkeeper.fields import CapabilityField, StrictFloatField, StrictIntegerField

MAX_DURATION_S = 366 * 24 * 3600


class VNodeSerializer(serializers.Serializer):
    cpu_cores = StrictFloatField(min_value=0, max_value=4096, required=False, default=1)
    mem_mib = StrictIntegerField(min_value=1)
    disk_gib = StrictIntegerField(min_value=0, required=False, default=0)


class RestartPolicySerializer(serializers.Serializer):
    max_restarts = StrictIntegerField(min_value=0, max_value=1000, required=False)
    window_s = StrictFloatField(min_value=1, max_value=7 * 86400, required=False)
    backoff_initial_s = StrictFloatField(min_value=0, max_value=3600, required=False)
    backoff_max_s = StrictFloatField(min_value=0, max_value=86400, required=False)

    def validate(self, attrs):
        if attrs.get("backoff_initial_s", 1.0) > attrs.get("backoff_max_s", 30.0):
            raise serializers.ValidationError({"backoff_max_s": "Must be at least backoff_initial_s."})
        return attrs


class DriverSpecSerializer(serializers.Serializer):
    command = serializers.ListField(child=serializers.CharField(), required=False, max_length=200)
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    cwd = serializers.CharField(required=False, allow_null=True)
    stop_grace_s = StrictFloatField(min_value=0, max_value=3600, required=False)
    sim = serializers.DictField(required=False)


class LeaseCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    type = serializers.ChoiceField(choices=LeaseType.choices)
    start = serializers.DateTimeField(required=False, allow_null=True, default=None)
    duration_s = StrictFloatField(min_value=1, max_value=MAX_DURATION_S)
    nodes = VNodeSerializer(many=True, allow_empty=False, max_length=1000)
    capabilities = serializers.ListField(child=CapabilityField(), required=False, default=list, max_length=50)
    preemptible = serializers.BooleanField(required=False, default=True)
    groups = serializers.ListField(child=serializers.SlugField(), required=False, default=list, max_length=20)
    migratable = serializers.BooleanField(required=False, default=True)
    restart_policy = RestartPolicySerializer(required=False, default=dict)
    max_reschedules = StrictIntegerField(min_value=0, max_value=1000, required=False, default=5)
    auto_approve_reschedules = serializers.BooleanField(required=False, default=False)
    driver = serializers.ChoiceField(choices=["sim", "process"], required=False, default="sim")
    spec = DriverSpecSerializer(required=False, default=dict)
    real_duration_s = StrictFloatField(
        min_value=0,
        required=False,
        allow_null=True,
        default=None,
        help_text="Simulation and demos only: the lease really ends after this much run time.",
    )

    def validate(self, attrs):
        now = timezone.now()
        if attrs["type"] == LeaseType.ADVANCE_RESERVATION:
            if attrs["start"] is None:
                raise serializers.ValidationError({"start": "An advance reservation needs its exact start."})
            if attrs["start"] < now:
                raise serializers.ValidationError({"start": f"{attrs['start'].isoformat()} is in the past."})
        elif attrs["start"] is not None:
            raise serializers.ValidationError({"start": "Only an advance reservation takes a start time."})
        self._check_sizes(attrs["nodes"])
        missing = sorted(
            set(attrs["groups"])
            - set(Group.objects.filter(name__in=attrs["groups"]).values_list("name", flat=True))
        )
        if missing:
            raise serializers.ValidationError({"groups": f"Unknown group(s): {', '.join(missing)}."})
        if attrs["driver"] == "process" and not attrs["spec"].get("command"):
            raise serializers.ValidationError({"spec": "The process driver needs a command."})
        return attrs

    def _check_sizes(self, vnodes):
        largest = Node.objects.exclude(status="dead").order_by("-mem_total_mib").first()
        if largest is None:
            raise serializers.ValidationError({"nodes": "The fleet has no nodes yet."})
        biggest = Node.objects.exclude(status="dead").values_list(
            "cpu_cores", "mem_total_mib", "disk_total_gib"
        )
        max_cpu = max(c for c, _, _ in biggest)
        max_disk = max(d for _, _, d in biggest)
        errors = {}
        for i, v in enumerate(vnodes):
            problems = []
            if v["mem_mib"] > largest.mem_total_mib:
                problems.append(
                    f"mem_mib {v['mem_mib']} exceeds the largest node ({largest.name}, {largest.mem_total_mib} MiB)"
                )
            if v["cpu_cores"] > max_cpu:
                problems.append(f"cpu_cores {v['cpu_cores']} exceeds the largest node's {max_cpu} cores")
            if v["disk_gib"] > max_disk:
                problems.append(f"disk_gib {v['disk_gib']} exceeds the largest node's {max_disk} GiB")
            if problems:
                errors[i] = "; ".join(problems)
        if errors:
            raise serializers.ValidationError({"nodes": {str(i): msg for i, msg in errors.items()}})


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
    class Meta:
        model = PlacementReport
        fields = ["id", "created_at", "outcome", "message", "verdicts"]
        read_only_fields = fields


class LeaseSerializer(serializers.ModelSerializer):
    nodes = serializers.JSONField(source="vnodes", read_only=True)
    start = serializers.DateTimeField(source="requested_start", read_only=True)

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
            "migratable",
            "restart_policy",
            "max_reschedules",
            "auto_approve_reschedules",
            "driver",
            "spec",
            "groups",
        ]
        read_only_fields = fields

    groups = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)


class LeaseDetailSerializer(LeaseSerializer):
    reservations = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()
    placement_reports = serializers.SerializerMethodField()

    class Meta(LeaseSerializer.Meta):
        fields = [*LeaseSerializer.Meta.fields, "reservations", "history", "placement_reports"]
        read_only_fields = fields

    def get_reservations(self, lease) -> list[dict]:
        rows = lease.reservations.select_related("lease").order_by("start", "rid")
        return ReservationSerializer(rows, many=True).data

    def get_history(self, lease) -> list[dict]:
        return LeaseEventSerializer(lease.events.all(), many=True).data

    def get_placement_reports(self, lease) -> list[dict]:
        reports = PlacementReport.objects.filter(subject=f"lease:{lease.pk}").order_by("created_at", "id")
        return ReportBriefSerializer(reports, many=True).data


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class SlotWindowSerializer(serializers.Serializer):
    start = serializers.DateTimeField(required=False)
    end = serializers.DateTimeField(required=False)
    node = serializers.IntegerField(required=False, min_value=1)

    def validate(self, attrs):
        now = timezone.now()
        attrs.setdefault("start", now - timezone.timedelta(hours=1))
        attrs.setdefault("end", attrs["start"] + timezone.timedelta(hours=25))
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "The window's end must be after its start."})
        if attrs["end"] - attrs["start"] > timezone.timedelta(days=31):
            raise serializers.ValidationError({"end": "A window is at most 31 days long."})
        return attrs
