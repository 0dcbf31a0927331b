"""The node API as the agent and the operators use it: fleet's NodeViewSet with the operations that touch what
runs on a node, each calling the composed action (leases/instances/actions/nodes.py), and the placement preview
with the instances' claims. The URLconf routes these classes; the paths and the schema are fleet's as before.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import actions
from fleet import heartbeats as fleet_heartbeats
from fleet.api import serializers as s
from fleet.api import views as fleet_views
from fleet.api.views import validated
from leases import reads as lease_reads
from leases.instances import reads
from leases.instances.actions import nodes
from leases.instances.filters import NodeFilterSet
from slotkeeper import metrics
from slotkeeper.auth import IsOperator, NodeToken


class NodeViewSet(fleet_views.NodeViewSet):
    # No docstring: the schema would show it as the description of every operation on nodes.

    def get_serializer_context(self):
        # List and retrieve: every node's committed figures in one aggregate query.
        return {**super().get_serializer_context(), "committed": lease_reads.committed_now(timezone.now())}

    def filterset(self, params, queryset):
        return NodeFilterSet(params, queryset, now=timezone.now())

    def node_context(self, node_ids) -> dict:
        return {
            **super().node_context(node_ids),
            "committed": lease_reads.committed_now(timezone.now(), node_ids),
        }

    def destroy(self, request, pk=None):
        nodes.do_delete_node(request.user, self._pk(pk), now=timezone.now())
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
        now = timezone.now()
        if isinstance(request.auth, NodeToken) and request.auth.node_id == self._pk(pk):
            # A token this process resolved recently: the fast path, checked against the row as it writes.
            report = actions.HealthReport(**validated(s.HeartbeatSerializer, request.data))
            # Unmeasured here: this path reads no node row (tests/fleet/test_node_tokens.py), and the row is
            # what a heartbeat's age is measured against. With the buffer on (the default) it carries only what
            # the route in front of Django leaves to the view; the buffered flush measures the rest.
            ages: list[float] = []
            status_ = nodes.do_heartbeat_known(request.auth, report, now=now)
            if status_ is None:
                raise AuthenticationFailed("Invalid or revoked token.")
        else:
            node = self._own_node(request, pk)
            report = actions.HealthReport(**validated(s.HeartbeatSerializer, request.data))
            ages = fleet_heartbeats.ages_since({node.pk: node.last_heartbeat_at}, {node.pk: [now]})
            status_ = nodes.do_heartbeat(node, report, now=now).status
        metrics.inc("slotkeeper_heartbeats_total")
        fleet_heartbeats.count_ages(ages)
        return Response({"status": status_, "server_time": timezone.now()})

    @extend_schema(request=None, responses={200: dict})
    @action(detail=True, methods=["get"])
    def assignments(self, request, pk=None):
        node = self._own_node(request, pk)
        if node.fenced_at is not None:
            # A fenced node is told so on every call, and given nothing to run.
            actions.refuse_fenced(node, timezone.now())
        return Response(reads.assignments_for(node, timezone.now()))

    @extend_schema(request=s.DrainSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        data = validated(s.DrainSerializer, request.data)
        node = nodes.do_drain(
            request.user,
            self._pk(pk),
            reason=data["reason"],
            now=timezone.now(),
            deadline=data["deadline"],
            max_parallel=data["max_parallel"],
        )
        return Response(self.node_data(node))

    @extend_schema(request=s.ReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"], url_path="declare-dead")
    def declare_dead(self, request, pk=None):
        reason = validated(s.ReasonSerializer, request.data)["reason"]
        node = nodes.do_declare_dead(request.user, self._pk(pk), reason=reason, now=timezone.now())
        return Response(self.node_data(node))


class PlacementPreviewView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(request=s.PreviewSerializer, responses={200: s.PlacementResultSerializer})
    def post(self, request):
        data = validated(s.PreviewSerializer, request.data)
        return Response(nodes.do_preview_placement(request.user, data, now=timezone.now()))
