"""Console pages of the instances package: instances with their state and restart history, reschedule proposals (approve one or
many through one confirmation, reject with a reason), open alerts, and a draining node's progress.

Each page URL also serves its live fragment to htmx (same URL, `HX-Request`), re-fetched on "instance-changed",
"reschedule-changed" and "alert-raised" events. Every write goes through leases/instances/actions (do_approve,
do_reject); the views re-check the role (a hidden checkbox is not a permission) and turn domain errors into result lines.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import replace_url

from fleet.models import Node
from leases.instances import forms, reads
from leases.instances.actions import alerts as alert_actions
from leases.instances.actions import reschedules
from leases.instances.filters import AlertFilterSet, InstanceFilterSet, RescheduleFilterSet, filtered
from leases.instances.models import Reschedule, RescheduleStatus
from leases.instances.results import result_lines
from leases.lifecycle import InstanceState, parse_instance_id
from leases.models import Alert, Group, Instance
from slotkeeper.decorators import role_required
from slotkeeper.domain import DomainError, StaleVersion
from slotkeeper.fields import INT32_MAX, is_id

PAGE = 500  # rows of a list; beyond it the page says so and the filters narrow it
CAUSES = ("node_dead", "drain")


def fragment(request: HttpRequest) -> bool:
    return bool(request.htmx) and not request.htmx.boosted


def ints(values: list[str]) -> list[int]:
    """Ids from a form, in order, without repeats or junk: a tampered field must not reach do_approve as a 500."""
    out: list[int] = []
    for v in values:
        if is_id(v) and int(v) not in out:
            out.append(int(v))
    return out


# -- instances -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceFilters:
    node: str = ""
    lease: str = ""
    state: str = ""

    @classmethod
    def from_query(cls, params: QueryDict) -> InstanceFilters:
        lease = params.get("lease", "").strip()
        state = params.get("state", "").strip()
        return cls(
            node=params.get("node", "").strip(),
            lease=lease if is_id(lease) else "",
            state=state if state in InstanceState._value2member_map_ else "",
        )

    def query_string(self) -> str:
        return urlencode({k: v for k, v in self.__dict__.items() if v})

    def apply(self, qs: QuerySet[Instance]) -> QuerySet[Instance]:
        return filtered(InstanceFilterSet, {k: v for k, v in self.__dict__.items() if v}, qs)


@role_required("viewer")
@vary_on_headers("HX-Request")
def instance_list(request):
    f = InstanceFilters.from_query(request.GET)
    rows = list(
        f.apply(
            Instance.objects.select_related("node", "lease").order_by("lease_id", "vnode", "-generation")
        )[: PAGE + 1]
    )
    context = {
        "instances": rows[:PAGE],
        "more": len(rows) > PAGE,
        "filters": f,
        "query": f.query_string(),
        "states": [s.value for s in InstanceState],
        "nodes": list(Node.objects.order_by("name").values_list("name", flat=True)),
        "page": PAGE,
    }
    template = "instances/_instance_table.html" if fragment(request) else "instances/list.html"
    return render(request, template, context)


def successor(iid: str) -> Instance | None:
    """The instance an old id now goes by. A restart gives the same row a new generation (and so a new id), so a
    page left open on a crash-looping instance would 404 at its first restart without this."""
    try:
        lease_part, vnode, generation = parse_instance_id(iid)
    except ValueError:  # not an instance id ("²".isdigit() is True, and int("²") raises this)
        return None
    if not is_id(lease_part) or max(vnode, generation) > INT32_MAX:
        return None  # past the columns: the database would overflow, not answer
    lease = int(lease_part)
    return (
        Instance.objects.filter(lease_id=lease, vnode=vnode, generation__gt=generation)
        .order_by("generation")
        .first()
    )


@role_required("viewer")
@vary_on_headers("HX-Request")
def instance_detail(request, iid: str):
    inst = Instance.objects.select_related("node", "lease", "replaces").filter(iid=iid).first()
    if inst is None:
        inst = successor(iid)
        if inst is None:
            raise Http404(f"instance {iid} does not exist")
        if not fragment(request):
            return redirect("instance-detail", iid=inst.iid)
    context = {
        "inst": inst,
        "events": list(inst.events.all()),
        "restarts": list(inst.restarts.all()),
        "reschedules": list(inst.reschedules.select_related("proposed_node", "new_instance__node")),
        "replaced_by": Instance.objects.filter(replaces=inst).only("iid").first(),
        "alerts": list(inst.alerts.filter(resolved_at=None)),
    }
    if not fragment(request):
        return render(request, "instances/detail.html", context)
    response = render(request, "instances/_instance_body.html", context)
    # The id moved on (a restart): keep the address bar on the id the page now shows.
    return replace_url(response, reverse("instance-detail", args=[inst.iid])) if inst.iid != iid else response


# -- reschedules -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RescheduleFilters:
    status: str = RescheduleStatus.PENDING
    group: str = ""
    cause: str = ""

    @classmethod
    def from_query(cls, params: QueryDict) -> RescheduleFilters:
        # No status parameter means the work queue (pending); an empty one, chosen as "any status", means all.
        status = params.get("status", RescheduleStatus.PENDING).strip()
        cause = params.get("cause", "").strip()
        return cls(
            status=status if status in RescheduleStatus.values else "",
            group=params.get("group", "").strip(),
            cause=cause if cause in CAUSES else "",
        )

    def query_string(self) -> str:
        return urlencode({"status": self.status, **{k: v for k, v in self.__dict__.items() if v}})

    def apply(self, qs: QuerySet[Reschedule]) -> QuerySet[Reschedule]:
        return filtered(RescheduleFilterSet, {k: v for k, v in self.__dict__.items() if v}, qs)


def proposals(f: RescheduleFilters) -> QuerySet[Reschedule]:
    # The report is linked by its id only: its verdicts (one per node) are the heavy part and the list never
    # shows them.
    return (
        f.apply(Reschedule.objects.all())
        .select_related("instance__node", "lease", "proposed_node", "new_instance__node")
        .defer("lease__vnodes", "lease__spec", "lease__images", "lease__message")
        .prefetch_related("lease__groups")
        .order_by("-created_at", "-id")
    )


def pending_count() -> int:
    return Reschedule.objects.filter(status=RescheduleStatus.PENDING).count()


@role_required("viewer")
@vary_on_headers("HX-Request")
def reschedule_list(request):
    f = RescheduleFilters.from_query(request.GET)
    rows = list(proposals(f)[: PAGE + 1])
    context = {
        "proposals": rows[:PAGE],
        "more": len(rows) > PAGE,
        "filters": f,
        "query": f.query_string(),
        # A live re-fetch sends the boxes still ticked, so an update arriving mid-selection keeps the selection.
        "checked": set(ints(request.GET.getlist("id"))),
        "selectable": any(r.status == RescheduleStatus.PENDING for r in rows),
        "statuses": RescheduleStatus.values,
        "causes": CAUSES,
        "groups": list(Group.objects.order_by("name").values_list("name", flat=True)),
        "pending_count": pending_count(),
        "page": PAGE,
    }
    template = "instances/_reschedule_table.html" if fragment(request) else "instances/reschedules.html"
    return render(request, template, context)


@role_required("viewer")
def reschedule_pending_count(request):
    return render(request, "instances/_pending_badge.html", {"pending_count": pending_count()})


def chosen_ids(post: QueryDict) -> list[int]:
    """The ticked ids, or every pending proposal matching the list's filters when "all matching" was asked."""
    if post.get("all"):
        f = RescheduleFilters.from_query(post)
        f = RescheduleFilters(status=RescheduleStatus.PENDING, group=f.group, cause=f.cause)
        return list(f.apply(Reschedule.objects.all()).order_by("pk").values_list("pk", flat=True))
    return ints(post.getlist("id"))


@role_required("operator")
@require_POST
@vary_on_headers("HX-Request")
def reschedule_confirm(request):
    """The one confirmation step: exactly what will move where, read now, with the versions shown carried on."""
    ids = chosen_ids(request.POST)
    seen = {pk: request.POST.get(f"v{pk}", "") for pk in ids}
    rows = list(
        Reschedule.objects.filter(pk__in=ids)
        .select_related("instance__node", "lease", "proposed_node")
        .order_by("pk")
    )
    context = {
        "rows": [(r, seen[r.pk] not in ("", str(r.version))) for r in rows],
        "ready": [r for r in rows if r.status == RescheduleStatus.PENDING],
        "back": f"{reverse('reschedule-list')}?{RescheduleFilters.from_query(request.POST).query_string()}",
    }
    template = (
        "instances/_reschedule_confirm.html" if fragment(request) else "instances/reschedule_confirm.html"
    )
    return render(request, template, context)


def _local(request, url: str) -> str:
    """`url` if it is a path on this site, else "": the posted "back" becomes a link on the result page, and a
    tampered one must not point elsewhere (or run `javascript:`)."""
    ok = url.startswith("/") and url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()})
    return url if ok else ""


def approve_all(user, ids: list[int], versions: dict[int, int]) -> list[reschedules.ApprovalResult]:
    try:
        return reschedules.do_approve(user, ids, now=timezone.now(), versions=versions)
    except StaleVersion as exc:  # raised only for a single id
        return [reschedules.ApprovalResult(ids[0], False, "", str(exc), code="stale")]
    except DomainError as exc:
        return [reschedules.ApprovalResult(ids[0], False, "", str(exc), code="conflict")]


@role_required("operator")
@require_POST
@vary_on_headers("HX-Request")
def reschedule_approve(request):
    ids = ints(request.POST.getlist("id"))
    if not ids:
        messages.error(request, "Select at least one proposal to approve.")
        return redirect("reschedule-list")
    versions = {pk: int(v) for pk in ids if is_id(v := request.POST.get(f"v{pk}", ""))}
    lines = result_lines(approve_all(request.user, ids, versions))
    context = {
        "lines": lines,
        "moved": sum(line.kind == "moved" for line in lines),
        # (label, count) pairs: a Counter in a template answers `.items` as a missing key, 0.
        "counts": sorted(Counter(line.label for line in lines if line.kind != "moved").items()),
        "back": _local(request, request.POST.get("back", "")) or reverse("reschedule-list"),
    }
    template = (
        "instances/_reschedule_result.html" if fragment(request) else "instances/reschedule_result.html"
    )
    return render(request, template, context)


@role_required("operator")
@require_POST
def reschedule_reject(request, pk: int):
    reason = request.POST.get("reason", "").strip()
    try:
        if not reason:
            raise DomainError("a rejection needs a reason")
        proposal = reschedules.do_reject(request.user, pk, now=timezone.now(), reason=reason)
        messages.success(request, f"Reschedule of {proposal.instance.iid} rejected.")
    except DomainError as exc:
        messages.error(request, str(exc))
    f = RescheduleFilters.from_query(request.POST)
    return redirect(f"{reverse('reschedule-list')}?{f.query_string()}")


# -- alerts ----------------------------------------------------------------------------------------------------


@role_required("viewer")
@vary_on_headers("HX-Request")
def alert_list(request):
    kind = request.GET.get("kind", "").strip()
    include_resolved = request.GET.get("resolved") == "1"
    alerts = filtered(
        AlertFilterSet,
        {"open": "" if include_resolved else "1", "kind": kind},
        Alert.objects.select_related("lease", "instance", "node").defer("lease__vnodes", "lease__spec"),
    )
    rows = list(alerts[: PAGE + 1])
    query = urlencode({k: v for k, v in (("kind", kind), ("resolved", "1" if include_resolved else "")) if v})
    context = {
        "alerts": rows[:PAGE],
        "more": len(rows) > PAGE,
        "kind": kind,
        "resolved": include_resolved,
        "query": query,
        "kinds": list(Alert.objects.order_by("kind").values_list("kind", flat=True).distinct()),
        "page": PAGE,
    }
    template = "instances/_alert_table.html" if fragment(request) else "instances/alerts.html"
    return render(request, template, context)


@role_required("operator")
def alert_resolve(request, pk: int):
    """Resolves an open alert by hand, with an optional reason (audited). The alert list posts here from each open
    row; a GET shows the same form on a page of its own."""
    alert = get_object_or_404(Alert.objects.select_related("lease", "instance", "node"), pk=pk)
    if request.method != "POST":
        return render(request, "instances/alert_resolve.html", {"alert": alert, "values": {}, "errors": {}})
    checked = forms.check_resolve(request.POST)
    if not checked.ok:
        context = {"alert": alert, "values": checked.values, "errors": checked.errors}
        return render(request, "instances/alert_resolve.html", context, status=400)
    try:
        alert_actions.do_resolve_alert(request.user, pk, now=timezone.now(), reason=checked.data["reason"])
        messages.success(request, f"Alert {pk} ({alert.kind}) resolved.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("alert-list")


# -- drain progress ----------------------------------------------------------------------------------------------


@role_required("viewer")
@vary_on_headers("HX-Request")
def drain_progress(request, node_id: int):
    node = get_object_or_404(Node, pk=node_id)
    context = {"node": node, "progress": reads.drain_progress(node)}
    template = "instances/_drain_progress.html" if fragment(request) else "instances/drain_progress.html"
    return render(request, template, context)
