"""Fleet API: nodes, health, drain, and the placement preview. Every write calls fleet/actions.py."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import actions, capacity, placement
from fleet.api import serializers as s
from fleet.models import Node, PlacementReport
from slotkeeper import metrics
from slotkeeper.audit import actor_label
from slotkeeper.auth import IsAdmin, IsNodeAgent, IsOperator, IsViewer
from slotkeeper.fields import INT64_MAX


def validated(serializer_class, data):
    ser = serializer_class(data=data)
    ser.is_valid(raise_exception=True)
    return ser.validated_data


class NodeViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    queryset = Node.objects.select_related("drained_by").order_by("name")
    serializer_class = s.NodeSerializer

    def get_permissions(self):
        if self.action in {"heartbeat", "assignments"}:
            return [IsNodeAgent()]
        if self.action in {"create", "drain", "undrain"}:
            return [IsOperator()]
        if self.action in {"partial_update", "update", "destroy", "declare_dead", "readmit", "rotate_token"}:
            return [IsAdmin()]
        return [IsViewer()]

    def get_queryset(self):
        qs = super().get_queryset()
        params = self.request.query_params
        if status_ := params.get("status"):
            qs = qs.filter(status__in=status_.split(","))
        if q := params.get("q"):
            qs = qs.filter(name__icontains=q)
        return qs

    @extend_schema(request=s.NodeWriteSerializer, responses={201: s.NodeCreatedSerializer})
    def create(self, request):
        data = validated(s.NodeWriteSerializer, request.data)
        node, token = actions.do_register_node(request.user, now=timezone.now(), **data)
        body = s.NodeSerializer(node).data
        body["token"] = token
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.NodeWriteSerializer, responses={200: s.NodeSerializer})
    def partial_update(self, request, pk=None):
        ser = s.NodeWriteSerializer(data=request.data, partial=True, node_id=self._pk(pk))
        ser.is_valid(raise_exception=True)
        node = actions.do_update_node(
            request.user, self._pk(pk), dict(ser.validated_data), now=timezone.now()
        )
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=s.NodeWriteSerializer, responses={200: s.NodeSerializer})
    def update(self, request, pk=None):
        ser = s.NodeWriteSerializer(data=request.data, node_id=self._pk(pk))
        ser.is_valid(raise_exception=True)
        node = actions.do_update_node(request.user, self._pk(pk), ser.validated_data, now=timezone.now())
        return Response(s.NodeSerializer(node).data)

    def destroy(self, request, pk=None):
        actions.do_delete_node(request.user, self._pk(pk), now=timezone.now())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=s.HeartbeatSerializer,
        responses={
            200: s.HeartbeatAckSerializer,
            403: OpenApiResponse(description="another node's token"),
            409: OpenApiResponse(
                description='the node was declared dead and is fenced (`"code": "fenced"`): stop every instance '
                "and wait until an admin re-admits it"
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def heartbeat(self, request, pk=None):
        node = self._own_node(request, pk)
        report = actions.HealthReport(**validated(s.HeartbeatSerializer, request.data))
        node = actions.do_heartbeat(node, report, now=timezone.now())
        metrics.inc("slotkeeper_heartbeats_total")
        return Response({"status": node.status, "server_time": timezone.now()})

    @extend_schema(request=None, responses={200: dict})
    @action(detail=True, methods=["get"])
    def assignments(self, request, pk=None):
        node = self._own_node(request, pk)
        if node.fenced_at is not None:
            # A fenced node is told so on every call, and given nothing to run.
            actions.refuse_fenced(node, timezone.now())
        from fleet.assignments import assignments_for

        return Response(assignments_for(node, now=timezone.now()))

    @extend_schema(request=s.DrainSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        data = validated(s.DrainSerializer, request.data)
        node = actions.do_drain(
            request.user,
            self._pk(pk),
            reason=data["reason"],
            now=timezone.now(),
            deadline=data["deadline"],
            max_parallel=data["max_parallel"],
        )
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=s.OptionalReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None):
        reason = validated(s.OptionalReasonSerializer, request.data)["reason"]
        node = actions.do_undrain(request.user, self._pk(pk), reason=reason, now=timezone.now())
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"], url_path="declare-dead")
    def declare_dead(self, request, pk=None):
        reason = validated(s.ReasonSerializer, request.data)["reason"]
        node = actions.do_declare_dead(request.user, self._pk(pk), reason=reason, now=timezone.now())
        return Response(s.NodeSerializer(node).data)

    @extend_schema(
        request=s.ReasonSerializer,
        responses={200: s.NodeSerializer, 409: OpenApiResponse(description="the node is not fenced")},
    )
    @action(detail=True, methods=["post"])
    def readmit(self, request, pk=None):
        """Takes back a node that was declared dead (fenced): it is offline until its next heartbeat."""
        reason = validated(s.ReasonSerializer, request.data)["reason"]
        node = actions.do_readmit(request.user, self._pk(pk), reason=reason, now=timezone.now())
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=None, responses={200: s.NodeCreatedSerializer})
    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request, pk=None):
        token = actions.do_rotate_token(request.user, self._pk(pk), now=timezone.now())
        body = s.NodeSerializer(actions.get_node(self._pk(pk))).data
        body["token"] = token
        return Response(body)

    def _pk(self, pk) -> int:
        try:
            node_id = int(pk)
        except (TypeError, ValueError):
            raise actions.NotFound(f"node {pk} does not exist") from None
        if not 1 <= node_id <= INT64_MAX:  # no id is; and a bigger one overflowed the database driver
            raise actions.NotFound(f"node {pk} does not exist")
        return node_id

    def _own_node(self, request, pk) -> Node:
        if isinstance(request.auth, Node) and request.auth.pk == self._pk(pk):
            return request.auth  # read by the token lookup already
        node = actions.get_node(self._pk(pk))
        if request.user.node_id != node.pk:
            raise PermissionDenied(
                f"This token belongs to node {request.user.node_name}, not to {node.name}."
            )
        return node


class PlacementPreviewView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(request=s.PreviewSerializer, responses={200: s.PlacementResultSerializer})
    def post(self, request):
        data = validated(s.PreviewSerializer, request.data)
        need = capacity.Need(
            mem_mib=data["mem_mib"],
            disk_gib=data["disk_gib"],
            cpu_cores=data["cpu_cores"],
            capabilities=frozenset(data["capabilities"]),
            count=data["count"],
            preferred_node=data["preferred_node"] or None,
        )
        now = timezone.now()
        states = placement.snapshot(now)
        result = placement.place(now, need, states=states)
        metrics.inc("slotkeeper_placements_total", kind="preview", outcome=str(result.outcome))
        report = placement.record(
            now,
            "preview",
            need,
            result,
            requested_by=actor_label(request.user),
            ids_by_name={n.name: n.id for n in states},
        )
        return Response(
            {
                "outcome": str(result.outcome),
                "nodes": list(result.nodes),
                "message": result.message,
                "preferred_note": result.preferred_note,
                "report": report.pk,
                "verdicts": report.verdicts,
            }
        )


class PlacementReportViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = PlacementReport.objects.all()
    serializer_class = s.PlacementReportSerializer
    permission_classes = [IsViewer]

    def get_queryset(self):
        qs = super().get_queryset()
        if subject := self.request.query_params.get("subject"):
            qs = qs.filter(subject=subject)
        return qs
