"""Fleet API: nodes and stored placement reports. Every write calls fleet/actions.py. The node operations that
touch instances, and the placement preview (which needs the instances' claims), are composed in
leases/instances/api/nodes.py."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied, ValidationError
from rest_framework.response import Response

from fleet import actions, filters
from fleet.api import serializers as s
from fleet.filters import NodeFilterSet
from fleet.models import Node, PlacementReport
from slotkeeper.auth import IsAdmin, IsNodeAgent, IsOperator, IsViewer, NodeToken, node_tokens
from slotkeeper.fields import ID_PATH, is_id


def validated(serializer_class, data):
    ser = serializer_class(data=data)
    ser.is_valid(raise_exception=True)
    return ser.validated_data


# The node list's filters (fleet/filters.py), as the schema states them.
NODE_LIST_PARAMETERS = [
    OpenApiParameter(
        "status",
        {"type": "string", "pattern": filters.STATUS_PATTERN},
        description="One status or several, comma-separated: online, draining, offline, dead.",
    ),
    OpenApiParameter(
        "q",
        {"type": "string", "maxLength": filters.MAX_SEARCH, "pattern": "^[^\\u0000]*$"},
        description="Part of a node's name or of one of its capabilities, any case.",
    ),
    OpenApiParameter(
        "sort",
        {"type": "string", "pattern": filters.SORT_PATTERN},
        description="name, status, age (of the last heartbeat), declared, allocatable, committed (now, of "
        "allocatable memory), observed (memory used, of declared), capabilities or drain; a leading '-' reverses "
        "it. The fleet board sorts the same way.",
    ),
]


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    lookup_value_regex = ID_PATH
    # What fleet alone can do with a node. The operations that touch what runs on it (the agent's heartbeat and
    # assignments, drain, declare-dead, delete) are added one layer up, where instances are known
    # (leases/instances/api/nodes.py); the URLconf routes that class.
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

    def node_data(self, node: Node) -> dict:
        """One node as the API shows it, with the figures the layer above adds to the context."""
        return dict(s.NodeSerializer(node, context=self.node_context([node.pk])).data)

    def node_context(self, node_ids) -> dict:
        """The serializer's context; the instances layer adds each node's `committed` figures."""
        return {"request": self.request, "view": self}

    def filterset(self, params, queryset) -> NodeFilterSet:
        """The node list's filters (fleet/filters.py); the layer above adds the sort by committed capacity."""
        return NodeFilterSet(params, queryset)

    def get_queryset(self):
        qs = super().get_queryset()
        if self.action != "list":
            return qs
        # The fleet board's filters: status (one or several), a search over names and capabilities, the sort.
        # A bad value is a 400 naming it, not an empty or unsorted list.
        query = self.request.query_params
        params = {k: query[k] for k in ("q", "sort") if k in query}
        if (
            "status" in query
        ):  # comma-separated or repeated (`status=online&status=dead`: the last alone was read)
            params["status"] = ",".join(query.getlist("status"))
        filterset = self.filterset(params, qs)
        if not filterset.is_valid():
            raise ValidationError({name: [message] for name, message in filterset.messages().items()})
        return filterset.sorted(filterset.qs, filterset.form.cleaned_data.get("sort", ""))

    @extend_schema(parameters=NODE_LIST_PARAMETERS)
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=s.NodeWriteSerializer, responses={201: s.NodeCreatedSerializer})
    def create(self, request):
        data = validated(s.NodeWriteSerializer, request.data)
        node, token = actions.do_register_node(request.user, now=timezone.now(), **data)
        body = self.node_data(node)
        body["token"] = token
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.NodeWriteSerializer, responses={200: s.NodeSerializer})
    def partial_update(self, request, pk=None):
        ser = s.NodeWriteSerializer(data=request.data, partial=True, node_id=self._pk(pk))
        ser.is_valid(raise_exception=True)
        node = actions.do_update_node(
            request.user, self._pk(pk), dict(ser.validated_data), now=timezone.now()
        )
        return Response(self.node_data(node))

    @extend_schema(request=s.NodeWriteSerializer, responses={200: s.NodeSerializer})
    def update(self, request, pk=None):
        ser = s.NodeWriteSerializer(data=request.data, node_id=self._pk(pk))
        ser.is_valid(raise_exception=True)
        node = actions.do_update_node(request.user, self._pk(pk), ser.validated_data, now=timezone.now())
        return Response(self.node_data(node))

    @extend_schema(request=s.OptionalReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None):
        reason = validated(s.OptionalReasonSerializer, request.data)["reason"]
        node = actions.do_undrain(request.user, self._pk(pk), reason=reason, now=timezone.now())
        return Response(self.node_data(node))

    @extend_schema(
        request=s.ReasonSerializer,
        responses={200: s.NodeSerializer, 409: OpenApiResponse(description="the node is not fenced")},
    )
    @action(detail=True, methods=["post"])
    def readmit(self, request, pk=None):
        """Takes back a node that was declared dead (fenced): it is offline until its next heartbeat."""
        reason = validated(s.ReasonSerializer, request.data)["reason"]
        node = actions.do_readmit(request.user, self._pk(pk), reason=reason, now=timezone.now())
        return Response(self.node_data(node))

    @extend_schema(request=None, responses={200: s.NodeCreatedSerializer})
    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request, pk=None):
        token = actions.do_rotate_token(request.user, self._pk(pk), now=timezone.now())
        body = self.node_data(actions.get_node(self._pk(pk)))
        body["token"] = token
        return Response(body)

    def _pk(self, pk) -> int:
        # ASCII digits within bigint: int() also reads "٣" (Arabic-Indic), "1_0" and " 3" as ids, so one node
        # answered to several paths (a probe rotated node 3's token through /api/nodes/٣/rotate-token/).
        if not is_id(str(pk)):
            raise actions.NotFound(f"node {pk} does not exist")
        return int(pk)

    def _own_node(self, request, pk) -> Node:
        if isinstance(request.auth, Node) and request.auth.pk == self._pk(pk):
            return request.auth  # read by the token lookup already
        if isinstance(request.auth, NodeToken) and request.auth.node_id == self._pk(pk):
            # Remembered from an earlier request: read by id and the digest together, so a token rotated (or a
            # node deleted) in another process is refused here too.
            node = Node.objects.filter(pk=request.auth.node_id, token_digest=request.auth.digest).first()
            if node is None:
                node_tokens.forget(request.auth.digest)
                raise AuthenticationFailed("Invalid or revoked token.")
            return node
        node = actions.get_node(self._pk(pk))
        if request.user.node_id != node.pk:
            raise PermissionDenied(
                f"This token belongs to node {request.user.node_name}, not to {node.name}."
            )
        return node


class PlacementReportViewSet(viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH
    queryset = PlacementReport.objects.all()
    serializer_class = s.PlacementReportSerializer
    permission_classes = [IsViewer]

    def get_queryset(self):
        qs = super().get_queryset()
        if subject := self.request.query_params.get("subject"):
            qs = qs.filter(subject=subject)
        return qs
