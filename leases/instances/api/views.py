"""Instances, reschedules, groups and alerts over the API, and a drain's progress. Every write calls an action of
leases/instances/actions/; the lists filter with the same FilterSets as the console (leases/instances/filters.py)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.models import Node
from leases.instances import reads
from leases.instances.actions import alerts, groups, instances, reschedules
from leases.instances.filters import AlertFilterSet, InstanceFilterSet, RescheduleFilterSet, filtered
from leases.instances.models import Reschedule, RestartRecord
from leases.lifecycle import InstanceState
from leases.models import Alert, Group, GroupPolicy, Instance, InstanceEvent, Lease
from slotkeeper.auth import IsOperator, IsViewer
from slotkeeper.domain import NotFound
from slotkeeper.fields import (
    ID_PATH,
    INT32_MAX,
    INT64_MAX,
    AsSentSlugField,
    BoundedListField,
    StrictBooleanField,
    StrictIntegerField,
    is_id,
)
from slotkeeper.schema import NOT_BLANK
from slotkeeper.serializers import StrictModelSerializer, StrictSerializer


class RestartRecordSerializer(serializers.ModelSerializer):
    class Meta:
        model = RestartRecord
        fields = ["at", "attempt", "reason", "decision", "next_eligible_at", "explanation"]
        read_only_fields = fields


class InstanceEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = InstanceEvent
        fields = ["at", "from_state", "to_state", "reason"]
        read_only_fields = fields


class InstanceSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", default=None, read_only=True, allow_null=True)

    class Meta:
        model = Instance
        fields = [
            "iid",
            "lease",
            "vnode",
            "generation",
            "node",
            "node_id",
            "state",
            "desired_state",
            "created_at",
            "state_changed_at",
            "restart_not_before",
            "last_exit_code",
            "log_tail",
            "detail",
        ]
        read_only_fields = fields


class InstanceDetailSerializer(InstanceSerializer):
    restarts = RestartRecordSerializer(many=True, read_only=True)
    history = InstanceEventSerializer(source="events", many=True, read_only=True)

    class Meta(InstanceSerializer.Meta):
        fields = [*InstanceSerializer.Meta.fields, "restarts", "history"]
        read_only_fields = fields


class TransitionSerializer(StrictSerializer):
    state = serializers.ChoiceField(choices=[s.value for s in InstanceState])
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class InstanceViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = InstanceSerializer
    lookup_field = "iid"
    lookup_value_regex = r"[0-9]+-[0-9]+-[0-9]+"

    def get_permissions(self):
        return [IsOperator()] if self.action == "transition" else [IsViewer()]

    def get_serializer_class(self):
        return InstanceDetailSerializer if self.action == "retrieve" else InstanceSerializer

    def get_queryset(self):
        qs = Instance.objects.select_related("node").order_by("lease_id", "vnode", "-generation")
        lease = self.request.query_params.get("lease")
        if lease and not is_id(lease):
            raise serializers.ValidationError({"lease": "A lease id is a number."})
        qs = filtered(InstanceFilterSet, self.request.query_params, qs)
        if self.action == "retrieve":
            qs = qs.prefetch_related("restarts", "events")
        return qs

    @extend_schema(
        request=TransitionSerializer,
        responses={200: InstanceDetailSerializer, 409: OpenApiResponse(description="illegal transition")},
    )
    @action(detail=True, methods=["post"])
    def transition(self, request, iid=None):
        data = TransitionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        target, reason = data.validated_data["state"], data.validated_data["reason"]
        inst = instances.do_transition_instance(request.user, iid, target, now=timezone.now(), reason=reason)
        return Response(InstanceDetailSerializer(Instance.objects.get(pk=inst.pk)).data)


class RescheduleSerializer(serializers.ModelSerializer):
    instance = serializers.CharField(source="instance.iid", read_only=True)
    proposed_node = serializers.CharField(
        source="proposed_node.name", default=None, read_only=True, allow_null=True
    )
    verdicts = serializers.JSONField(source="report.rows", default=list, read_only=True)
    new_instance = serializers.CharField(
        source="new_instance.iid", default=None, read_only=True, allow_null=True
    )
    held_until = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="While pending with a proposed node: its room there is held for this move until then (then "
        "released and proposed again against the fleet as it is).",
    )

    class Meta:
        model = Reschedule
        fields = [
            "id",
            "instance",
            "lease",
            "status",
            "cause",
            "proposed_node",
            "blocked_by",
            "message",
            "version",
            "held_until",
            "created_at",
            "decided_at",
            "decided_by",
            "new_instance",
            "verdicts",
        ]
        read_only_fields = fields


class ApproveOneSerializer(StrictSerializer):
    version = StrictIntegerField(
        required=False, min_value=1, max_value=INT32_MAX, help_text="the version you saw; 412 if stale"
    )


class ApproveManySerializer(StrictSerializer):
    ids = BoundedListField(
        child=StrictIntegerField(min_value=1, max_value=INT64_MAX), required=False, max_length=10_000
    )
    group = serializers.CharField(required=False, max_length=100)

    def validate(self, attrs):
        if bool(attrs.get("ids")) == bool(attrs.get("group")):
            raise serializers.ValidationError({"ids": "Give either 'ids' or 'group'."})
        return attrs


# The body as the schema states it: exactly one of `ids` (at least one) or `group`, as `validate` requires.
APPROVE_MANY_SCHEMA = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "ids": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
                    "minItems": 1,
                    "maxItems": 10_000,
                }
            },
            "required": ["ids"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "group": {"type": "string", "minLength": 1, "maxLength": 100, "pattern": NOT_BLANK}
            },
            "required": ["group"],
            "additionalProperties": False,
        },
    ],
    "description": "Exactly one of `ids` (the proposals, in the order they are approved) or `group` (every pending "
    "proposal of the group's members).",
}


class ApprovalResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    ok = serializers.BooleanField()
    code = serializers.ChoiceField(choices=["applied", "pending", "stale", "conflict", "not_found"])
    status = serializers.CharField()
    message = serializers.CharField()
    node = serializers.CharField(allow_null=True)
    new_instance = serializers.CharField(allow_null=True)


class ApprovalResultsSerializer(serializers.Serializer):
    results = ApprovalResultSerializer(many=True)


class RejectSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class RescheduleViewSet(viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH
    serializer_class = RescheduleSerializer

    def get_permissions(self):
        return [IsOperator()] if self.action in {"approve", "reject", "approve_many"} else [IsViewer()]

    def get_queryset(self):
        qs = Reschedule.objects.select_related("instance", "proposed_node", "report", "new_instance")
        return filtered(RescheduleFilterSet, self.request.query_params, qs)

    @extend_schema(
        request=ApproveOneSerializer,
        responses={
            200: ApprovalResultSerializer,
            409: OpenApiResponse(description="already applied or rejected"),
            412: OpenApiResponse(description="the proposal changed since you saw it"),
        },
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        pk = _int_pk(pk)
        data = ApproveOneSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        versions = {pk: data.validated_data["version"]} if "version" in data.validated_data else None
        [result] = reschedules.do_approve(request.user, [pk], now=timezone.now(), versions=versions)
        return Response(result.as_dict())

    @extend_schema(request=RejectSerializer, responses={200: RescheduleSerializer})
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        data = RejectSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        proposal = reschedules.do_reject(
            request.user, _int_pk(pk), now=timezone.now(), reason=data.validated_data["reason"]
        )
        return Response(RescheduleSerializer(proposal).data)

    @extend_schema(
        operation_id="reschedules_approve_many",
        request={"application/json": APPROVE_MANY_SCHEMA},
        responses={200: ApprovalResultsSerializer, 404: OpenApiResponse(description="no such group")},
    )
    @action(detail=False, methods=["post"], url_path="approve")
    def approve_many(self, request):
        data = ApproveManySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if group := data.validated_data.get("group"):
            if not Group.objects.filter(name=group).exists():
                raise NotFound(f"group {group} does not exist")
            ids = list(
                Reschedule.objects.filter(status="pending", lease__groups__name=group)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
        else:
            ids = data.validated_data["ids"]
        results = reschedules.do_approve(request.user, ids, now=timezone.now()) if ids else []
        return Response({"results": [r.as_dict() for r in results]})


def _int_pk(pk) -> int:
    if not is_id(str(pk)):
        raise NotFound(f"reschedule {pk} does not exist")
    return int(pk)


MAX_GROUP_LEASES = 1000


class GroupSerializer(StrictModelSerializer):
    leases = serializers.PrimaryKeyRelatedField(many=True, queryset=Lease.objects.all(), required=False)
    hard = StrictBooleanField(required=False, default=True)
    # At least one (a CHECK constraint: 0 was a 500), at most what the `integer` column holds, and the schema says so.
    max_per_node = StrictIntegerField(
        required=False,
        default=1,
        min_value=1,
        max_value=INT32_MAX,
        help_text="anti-affinity: members allowed on one node",
    )

    # The name's pattern holds for the name as sent (slotkeeper/fields.py): " web" is refused, not stored as "web".
    serializer_field_mapping = {
        **StrictModelSerializer.serializer_field_mapping,
        models.SlugField: AsSentSlugField,
    }

    class Meta:
        model = Group
        fields = ["id", "name", "policy", "hard", "max_per_node", "leases", "created_at"]
        read_only_fields = ["id", "created_at"]
        # A name taken already is a conflict with what exists (409, from the action), as a node's name is: the
        # serializer's own uniqueness check made it a 400, which the schema could not say.
        extra_kwargs = {"name": {"validators": []}}

    def to_internal_value(self, data):
        # Checked before the field looks each id up: one query per id, so the length is bounded first.
        leases = data.get("leases") if isinstance(data, dict) else None
        if isinstance(leases, list) and len(leases) > MAX_GROUP_LEASES:
            raise serializers.ValidationError({"leases": [f"At most {MAX_GROUP_LEASES} leases in a group."]})
        return super().to_internal_value(data)

    def validate(self, attrs):
        policy = attrs.get("policy", getattr(self.instance, "policy", None))
        hard = attrs.get("hard", getattr(self.instance, "hard", True))
        max_per_node = attrs.get("max_per_node", getattr(self.instance, "max_per_node", 1))
        leases = attrs.get("leases", list(self.instance.leases.all()) if self.instance else [])
        if hard:
            problem = groups.violation(policy, max_per_node, [lease.pk for lease in leases])
            if problem:
                raise serializers.ValidationError(
                    {"policy": f"The current members already violate it: {problem}"}
                )
        return attrs


class GroupViewSet(viewsets.ModelViewSet):
    serializer_class = GroupSerializer
    queryset = Group.objects.prefetch_related("leases")
    lookup_field = "name"

    def get_permissions(self):
        return [IsViewer()] if self.action in {"list", "retrieve"} else [IsOperator()]

    def get_object(self):
        group = Group.objects.prefetch_related("leases").filter(name=self.kwargs["name"]).first()
        if group is None:
            raise NotFound(f"group {self.kwargs['name']} does not exist")
        return group

    # The serializer validates; the actions write (with their audit rows), never serializer.save().
    def perform_create(self, serializer):
        serializer.instance = groups.do_create_group(
            self.request.user, now=timezone.now(), **serializer.validated_data
        )

    def perform_update(self, serializer):
        serializer.instance = groups.do_update_group(
            self.request.user, serializer.instance, now=timezone.now(), **serializer.validated_data
        )

    def perform_destroy(self, instance):
        groups.do_delete_group(self.request.user, instance, now=timezone.now())


class AlertSerializer(serializers.ModelSerializer):
    instance = serializers.CharField(source="instance.iid", default=None, read_only=True, allow_null=True)
    node = serializers.CharField(source="node.name", default=None, read_only=True, allow_null=True)

    class Meta:
        model = Alert
        fields = [
            "id", "kind", "message", "created_at", "resolved_at", "count", "last_seen_at", "resolution", "lease",
            "instance", "node",
        ]  # fmt: skip
        read_only_fields = fields


class AlertViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    lookup_value_regex = ID_PATH
    serializer_class = AlertSerializer

    def get_permissions(self):
        return [IsOperator()] if self.action == "resolve" else [IsViewer()]

    @extend_schema(
        request=RejectSerializer,
        responses={200: AlertSerializer, 409: OpenApiResponse(description="already resolved")},
    )
    @action(detail=True, methods=["post"])
    def resolve(self, request, pk=None):
        data = RejectSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if not is_id(str(pk)):
            raise NotFound(f"alert {pk} does not exist")
        alert_id = int(pk)
        alert = alerts.do_resolve_alert(
            request.user, alert_id, now=timezone.now(), reason=data.validated_data["reason"]
        )
        return Response(AlertSerializer(alert).data)

    def get_queryset(self):
        qs = Alert.objects.select_related("instance", "node")
        return filtered(AlertFilterSet, self.request.query_params, qs)


__all__ = ["AlertViewSet", "GroupPolicy", "GroupViewSet", "InstanceViewSet", "RescheduleViewSet", "status"]


class DrainProgressView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(responses={200: dict})
    def get(self, request, node_id: int):
        node = Node.objects.filter(pk=node_id).first()
        if node is None:
            raise NotFound(f"node {node_id} does not exist")
        return Response(reads.drain_progress(node))
