"""Leases API: submit, read, cancel, and a window of the slot table. Every write calls leases/actions.py."""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from leases import actions, negotiating, reads
from leases.api import serializers as s
from leases.lifecycle import LeaseState
from leases.models import Lease, LeaseType, Reservation
from leases.request_rules import MAX_DURATION_S
from slotkeeper.api import minimal_applied, prefers_minimal
from slotkeeper.auth import IsOperator, IsViewer
from slotkeeper.domain import NotFound
from slotkeeper.fields import DATE_TIME_SCHEMA, ID_PATH, is_id
from slotkeeper.schema import NO_NUL

# The extension's body as the schema states it: exactly one of `end` or `by_s`, as ExtendSerializer requires.
_REASON = {"type": "string", "maxLength": 300, "pattern": NO_NUL}
EXTEND_SCHEMA = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"end": DATE_TIME_SCHEMA, "reason": _REASON},
            "required": ["end"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "by_s": {"type": "number", "minimum": -MAX_DURATION_S, "maximum": MAX_DURATION_S},
                "reason": _REASON,
            },
            "required": ["by_s"],
            "additionalProperties": False,
        },
    ],
    "description": "Exactly one of `end` (the new end of the lease's current plan) or `by_s` (seconds to move it "
    "by: positive extends, negative shortens), and an optional `reason` for its history and audit.",
}


LIST_FILTERS = {"state": [str(v) for v in LeaseState], "type": list(LeaseType.values)}


class LeaseViewSet(viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH
    queryset = Lease.objects.all()

    def get_serializer_class(self):
        return s.LeaseDetailSerializer if self.action == "retrieve" else s.LeaseSerializer

    def get_permissions(self):
        return [IsOperator()] if self.action in {"create", "cancel", "batch", "extend"} else [IsViewer()]

    def retrieve(self, request, *args, **kwargs):
        return Response(s.plain(s.LeaseDetailSerializer, self.get_object()))

    def get_queryset(self):
        """The leases in the states and of the types the list asks for (each comma-separated). A value that is no
        state or type is a 400 naming it, as the node list answers its filters: `?state=zzz` was an empty 200."""
        qs = super().get_queryset()
        params = self.request.query_params
        problems = {}
        for name, allowed in LIST_FILTERS.items():
            if not (raw := params.get(name)):
                continue
            wanted = raw.split(",")
            if unknown := [v for v in wanted if v not in allowed]:
                shown = ", ".join(f'"{v[:40]}"' for v in unknown[:5])
                problems[name] = [f"Not a lease {name}: {shown}; one or more of {', '.join(allowed)}."]
            else:
                qs = qs.filter(**{f"{name}__in": wanted})
        if problems:
            raise ValidationError(problems)
        return qs

    @extend_schema(
        parameters=[
            OpenApiParameter(
                name,
                str,
                description=f"only leases of these {name}s, comma-separated: {', '.join(allowed)}",
                pattern=f"^({'|'.join(allowed)})(,({'|'.join(allowed)}))*$",
            )
            for name, allowed in LIST_FILTERS.items()
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def get_object(self):
        if not is_id(str(self.kwargs["pk"])):  # not int(): it also reads "٣" and "1_0" as ids
            raise NotFound(f"lease {self.kwargs['pk']} does not exist")
        return reads.get_lease(int(self.kwargs["pk"]))

    @extend_schema(
        request=s.LeaseCreateSerializer,
        parameters=[
            OpenApiParameter(
                "Prefer",
                str,
                OpenApiParameter.HEADER,
                enum=["return=minimal", "return=representation"],
                description="`return=minimal` (RFC 7240): the answer leaves out the per-node verdicts of the "
                "decision's report (about 330 KiB at 1,000 nodes) and, on a 201, the lease's reservations and "
                "history; it gives the report's summary, counts, chosen nodes and URL instead, and carries "
                "`Preference-Applied: return=minimal`. Without it, the full answer.",
            ),
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                pattern=r"^[!-~]{1,255}$",
                description="A name the client gives this request (1-255 visible ASCII characters, e.g. a UUID), "
                "unique among its own requests: a retry with the same key and the same body (after a timeout, or a "
                "server restarted mid-request) is answered with the first request's lease and decision, as it "
                "is now, with `Idempotent-Replayed: true`, and stores no second lease; the same key with another "
                "body is refused 422.",
            ),
        ],
        responses={
            201: PolymorphicProxySerializer(
                component_name="LeaseCreated",
                serializers=[s.LeaseDetailSerializer, s.LeaseMinimalSerializer],
                resource_type_field_name=None,
            ),
            409: OpenApiResponse(
                response=s.LeaseRejectedSerializer,
                description="a lease that cannot be placed: an advance reservation or immediate lease with no "
                "room (`code` fleet_at_capacity, or fleet_unreadable when no capable node can be read), or a "
                "lease of any type no node could ever take (`code` no_capable_node: no node has every capability "
                "it asks for, or every such node is too small for its VMs even when empty; `detail` names the "
                "missing capability or the largest capable node, and the lease is never queued). With "
                "`Prefer: return=minimal`, `report` (its summary, counts and URL) instead of `verdicts`.",
            ),
            422: OpenApiResponse(
                description="the Idempotency-Key was used before by this account for a request with another "
                "body: `detail` names the earlier lease"
            ),
            500: OpenApiResponse(
                description="the scheduler could not plan the lease and isolated it (state failed, with the "
                "reason and a lease_isolated alert); the same body as a 409"
            ),
        },
    )
    def create(self, request):
        now = timezone.now()  # the request's arrival: validated against, and submitted with
        idempotency = s.idempotency_of(request)
        result = actions.do_replay_lease(request.user, idempotency, now=now) if idempotency else None
        if result is None:
            spec = actions.LeaseSpec.from_request(s.validated_lease(request.data, now))
            result = actions.do_submit_lease(request.user, spec, now=now, idempotency=idempotency)
        minimal = prefers_minimal(request)
        if not result.decision.accepted:
            # Rejected is the scheduler's answer (409); failed means it could not plan the lease at all, which
            # is the server's fault, not a conflict the client can resolve.
            failed = result.decision.state == LeaseState.FAILED
            body = {
                "detail": result.decision.message,
                "code": result.decision.code,
                "lease": result.lease.pk,
                "state": result.lease.state,
            }
            if not failed and result.decision.code in negotiating.NEGOTIABLE:
                # An advance reservation that did not fit: when it could, and who is in the way (issue 48).
                body.update(negotiating.counter_offers(result.lease, timezone.now()) or {})
            if minimal:
                body["report"] = s.plain(s.ReportSummarySerializer, result.report)
            else:
                body["verdicts"] = result.report.rows
            code = status.HTTP_500_INTERNAL_SERVER_ERROR if failed else status.HTTP_409_CONFLICT
        elif minimal:
            # The lease as the pass left it and the report the pass wrote: both already read, nothing read again.
            body = s.LeaseMinimalSerializer.answer(result.lease, result.report)
            code = status.HTTP_201_CREATED
        else:
            body, code = s.plain(s.LeaseDetailSerializer, result.lease), status.HTTP_201_CREATED
        response = Response(body, status=code, headers={"Vary": "Prefer"})
        if result.replayed:
            response["Idempotent-Replayed"] = "true"
        return minimal_applied(response) if minimal else response

    @extend_schema(
        request=s.LeaseBatchSchemaSerializer,
        parameters=[
            OpenApiParameter(
                "Prefer",
                str,
                OpenApiParameter.HEADER,
                description="`return=minimal`: each result leaves out its verdicts' summary and counts; any other "
                "preference is ignored (RFC 7240).",
            )
        ],
        responses={
            200: s.LeaseBatchResponseSerializer,
            400: OpenApiResponse(description='the body is not `{"leases": [...]}` with 1 to 1,000 objects'),
        },
        description="A lease array: each item is decided as `POST /api/leases/` would decide it (201, 409 or 400 "
        "in its `status`), all in one planning pass, in order; a bad item does not stop the others.",
    )
    @action(detail=False, methods=["post"], url_path="batch")
    def batch(self, request):
        now = timezone.now()
        data = s.LeaseBatchSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        results: list[dict] = [{} for _ in data.validated_data["leases"]]
        items, where = [], []
        keys: dict[str, int] = {}
        for i, raw in enumerate(data.validated_data["leases"]):
            body = dict(raw)
            key = body.pop("idempotency_key", None)
            try:
                idem = s.idempotency_of_item(key, body)
                if idem is not None and idem.key in keys:
                    raise ValidationError(
                        {"idempotency_key": [f"Item {keys[idem.key]} of this array has the same key."]}
                    )
                spec = actions.LeaseSpec.from_request(s.validated_lease(body, now))
            except ValidationError as exc:
                detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
                results[i] = {"index": i, "status": 400, "message": "invalid lease request", "errors": detail}
                continue
            if idem is not None:
                keys[idem.key] = i
            items.append(actions.BatchItem(spec, idem))
            where.append(i)
        if items:
            actions.do_submit_leases(request.user, items, now=now)
        minimal = prefers_minimal(request)
        for i, item in zip(where, items, strict=True):
            results[i] = _batch_result(i, item, minimal)
        _batch_offers(results, where, items)
        response = Response({"results": results})
        return minimal_applied(response) if minimal else response

    @extend_schema(request=s.CancelSerializer, responses={200: s.LeaseDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        lease = self.get_object()
        ser = s.CancelSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        lease = actions.do_cancel_lease(
            request.user, lease.pk, now=timezone.now(), reason=ser.validated_data["reason"]
        )
        return Response(s.plain(s.LeaseDetailSerializer, lease))

    @extend_schema(
        request={"application/json": EXTEND_SCHEMA},
        parameters=[
            OpenApiParameter(
                "dry_run",
                bool,
                OpenApiParameter.QUERY,
                description="`true`: answer what would happen and change nothing.",
            )
        ],
        responses={
            200: s.ExtendAnswerSerializer,
            409: OpenApiResponse(
                response=s.ExtendAnswerSerializer,
                description="`code` blocked: its nodes are booked over the extension by leases it may not move "
                "(`blocking`); `latest_end` is the latest end that fits now; or the lease is not placed or running "
                "(`detail`)",
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        """Extend or shorten a placed or running lease in place (issue 48)."""
        lease = self.get_object()
        ser = s.ExtendSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        query = s.DryRunSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = ser.validated_data
        done = actions.do_change_end(
            request.user,
            lease.pk,
            now=timezone.now(),
            end=data.get("end"),
            by_s=data.get("by_s"),
            dry_run=query.validated_data["dry_run"],
            reason=data["reason"],
        )
        code = status.HTTP_200_OK if done.change.ok else status.HTTP_409_CONFLICT
        return Response(s.plain(s.ExtendAnswerSerializer, done.answer()), status=code)


# The rejected advance reservations of one array given counter-offers, in array order: each is a search over the
# fleet (about 20 ms at 1,000 nodes); the rest can ask the what-if for their window.
BATCH_OFFERS = 50


def _batch_offers(results: list[dict], where: list[int], items: list[actions.BatchItem]) -> None:
    """An array's rejected advance reservations get `alternatives` and `blocking`, as the single request's 409."""
    rejected = [
        (i, item.submitted.lease)
        for i, item in zip(where, items, strict=True)
        if item.submitted is not None
        and results[i]["status"] == 409
        and results[i].get("code") in negotiating.NEGOTIABLE
        and item.submitted.lease.type == "advance_reservation"
    ][:BATCH_OFFERS]
    if not rejected:
        return
    found = negotiating.counter_offers_many([lease for _, lease in rejected], timezone.now())
    for i, lease in rejected:
        results[i].update(found.get(lease.pk, {}))


def _batch_result(index: int, item: actions.BatchItem, minimal: bool) -> dict:
    """One item's answer, as the single request's status and decision say it."""
    if item.refused:
        return {
            "index": index,
            "status": 400,
            "message": item.refused,
            "errors": {"idempotency_key": [item.refused]},
        }
    result = item.submitted
    assert result is not None
    decision = result.decision
    # As the single request answers: a lease the scheduler could not plan at all (isolated, failed) is the
    # server's fault, a 500, not a conflict.
    status = 201 if decision.accepted else 500 if decision.state == LeaseState.FAILED else 409
    out: dict = {
        "index": index,
        "status": status,
        "id": result.lease.pk,
        "state": str(result.lease.state),
        "message": decision.message,
    }
    if not decision.accepted:
        out["code"] = decision.code
    if result.replayed:
        out["idempotent_replayed"] = True
    if not minimal:
        out["summary"] = result.report.summary
        out["counts"] = result.report.counts
        out["report"] = result.report.pk
    return out


class SlotsView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        parameters=[s.SlotWindowSerializer],  # the rules the view applies, so the schema states them
        responses={200: s.SlotWindowResponseSerializer},
    )
    def get(self, request):
        ser = s.SlotWindowSerializer(data=request.query_params)
        ser.is_valid(raise_exception=True)
        window = ser.validated_data
        rows = Reservation.objects.select_related("lease").filter(
            start__lt=window["end"], end__gt=window["start"]
        )
        if node := window.get("node"):
            rows = rows.filter(Q(allocations__node_id=node)).distinct()
        rows = rows.order_by("start", "rid")[:5000]
        return Response(
            {
                "start": window["start"],
                "end": window["end"],
                "reservations": s.ReservationSerializer(rows, many=True).data,
            }
        )
