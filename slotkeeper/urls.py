from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from fleet import views as fleet_views
from fleet.api.views import PlacementReportViewSet
from leases import views as lease_views
from leases.api.views import LeaseViewSet, SlotsView
from leases.instances import node_views
from leases.instances import views as instance_views
from leases.instances.api.nodes import NodeViewSet, PlacementPreviewView
from leases.instances.api.views import (
    AlertViewSet,
    DrainProgressView,
    GroupViewSet,
    InstanceViewSet,
    RescheduleViewSet,
)
from slotkeeper import ops, preferences
from slotkeeper import views as console_views
from slotkeeper.decorators import role_required
from slotkeeper.feed import EventFeedView


class Router(DefaultRouter):
    """Both `/api/nodes/7` and `/api/nodes/7/` resolve: the API's documented paths mix the two styles, and a
    client should never get a redirect (which drops a POST body) for a missing slash."""

    include_format_suffixes = False

    def __init__(self):
        super().__init__()
        self.trailing_slash = "/?"


router = Router()
router.register("nodes", NodeViewSet, basename="node")
router.register("placement/reports", PlacementReportViewSet, basename="placement-report")
router.register("leases", LeaseViewSet, basename="lease")
router.register("instances", InstanceViewSet, basename="instance")
router.register("reschedules", RescheduleViewSet, basename="reschedule")
router.register("groups", GroupViewSet, basename="group")
router.register("alerts", AlertViewSet, basename="alert")

# The docs are HTML pages for people: signed out, they redirect to the sign-in page (and back), as every console
# page does, instead of answering the API's JSON 401. The schema itself stays an API endpoint (401/403 JSON).
swagger_ui = role_required("viewer")(SpectacularSwaggerView.as_view(url_name="schema"))
# ReDoc is not served: its page fetched Google Fonts and its bundle a logo from cdn.redoc.ly, which no setting turns
# off (two errors on a closed network). Its old address leads to Swagger UI, which needs nothing from outside.
redoc = RedirectView.as_view(pattern_name="api-docs", permanent=False)

api_urls = [
    path("placement/preview", PlacementPreviewView.as_view(), name="placement-preview"),
    path("slots/", SlotsView.as_view(), name="slots"),
    path("events/", EventFeedView.as_view(), name="events"),
    path("nodes/<int:node_id>/drain-progress", DrainProgressView.as_view(), name="drain-progress"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", swagger_ui, name="api-docs"),
    path("redoc/", redoc, name="api-redoc"),
    # The router's names live in their own namespace ("api:node-detail"): un-namespaced, "node-detail" and
    # "lease-detail" would shadow the console's pages of the same name, and every console link went to JSON.
    path("", include((router.urls, "api"))),
]


def moved_admin(request, rest: str):
    """Reschedules and restart records moved to the instances app; their admin pages moved with the app label.
    308 keeps the method and the body, so an old bookmark or a scripted admin action still lands."""
    query = f"?{request.META['QUERY_STRING']}" if request.META.get("QUERY_STRING") else ""
    return HttpResponsePermanentRedirect(f"/admin/instances/{rest}{query}", status=308)


handler400 = "slotkeeper.api.bad_request"
handler404 = "slotkeeper.api.not_found"

urlpatterns = [
    path("", node_views.board, name="fleet-board"),
    path("board/patch/", node_views.board_patch, name="fleet-board-patch"),
    path("nodes/<int:node_id>/", node_views.node_detail, name="node-detail"),
    path("nodes/<int:node_id>/drain", node_views.drain, name="node-drain"),
    path("nodes/<int:node_id>/drain/preview", node_views.drain_preview, name="node-drain-preview"),
    path("nodes/<int:node_id>/declare-dead", node_views.declare_dead, name="node-declare-dead"),
    path("nodes/<int:node_id>/readmit", node_views.readmit, name="node-readmit"),
    path("placement/preview", node_views.placement_preview, name="placement-preview-form"),
    path("placement/<int:report_id>/", fleet_views.report_detail, name="placement-report"),
    path("slots/", lease_views.slot_table, name="slot-table"),
    path("slots/rows/", lease_views.slot_rows, name="slot-rows"),
    path("slots/patch/", lease_views.slot_table_patch, name="slot-patch"),
    path("leases/", lease_views.lease_list, name="lease-list"),
    path("leases/new", lease_views.lease_new, name="lease-new"),
    path("leases/<int:lease_id>/", lease_views.lease_detail, name="lease-detail"),
    path("leases/<int:lease_id>/cancel", lease_views.lease_cancel, name="lease-cancel"),
    path("leases/<int:lease_id>/resubmit", lease_views.lease_resubmit, name="lease-resubmit"),
    path("leases/<int:lease_id>/end", lease_views.lease_change_end, name="lease-change-end"),
    path("instances/", instance_views.instance_list, name="instance-list"),
    path("instances/<str:iid>/", instance_views.instance_detail, name="instance-detail"),
    path("reschedules/", instance_views.reschedule_list, name="reschedule-list"),
    path(
        "reschedules/pending-count", instance_views.reschedule_pending_count, name="reschedule-pending-count"
    ),
    path("reschedules/confirm", instance_views.reschedule_confirm, name="reschedule-confirm"),
    path("reschedules/approve", instance_views.reschedule_approve, name="reschedule-approve"),
    path("reschedules/<int:pk>/reject", instance_views.reschedule_reject, name="reschedule-reject"),
    path("alerts/", instance_views.alert_list, name="alert-list"),
    path("alerts/<int:pk>/resolve", instance_views.alert_resolve, name="alert-resolve"),
    path("nodes/<int:node_id>/drain-progress/", instance_views.drain_progress, name="node-drain-progress"),
    path("audit/", console_views.audit_feed, name="audit-feed"),
    path("audit.csv", console_views.audit_csv, name="audit-csv"),
    path("preferences/shortcuts", preferences.shortcuts, name="console-shortcuts"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    re_path(r"^admin/leases/(?P<rest>(?:reschedule|restartrecord)/.*)$", moved_admin),
    path("admin/", admin.site.urls),
    path("api/", include(api_urls)),
    # Browsers ask for /favicon.ico on every page that names none (the admin, the API docs): a redirect to the
    # console's icon instead of a 404 in every log.
    path("favicon.ico", RedirectView.as_view(url=static("console/favicon.svg"), permanent=True)),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
]
