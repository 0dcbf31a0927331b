"""Django admin for instances, reschedules, groups and alerts, and the node admin composed with them. Changes go
through the action layer, exactly as the API and the console do: reschedules are approved with an admin action that
calls do_approve, a group's save and delete call the group actions (with their audit rows), and the node admin's
drain, declare-dead and delete call the composed node actions, so the node's instances follow."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from fleet import admin as fleet_admin
from fleet.models import Node
from leases.admin import ReadOnly
from leases.instances.actions import groups, nodes, reschedules
from leases.instances.models import Reschedule, RestartRecord
from leases.models import Alert, Group, Instance
from slotkeeper.domain import DomainError


class RestartInline(admin.TabularInline):
    model = RestartRecord
    extra = 0
    can_delete = False
    readonly_fields = ["at", "attempt", "reason", "decision", "next_eligible_at", "explanation"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Instance)
class InstanceAdmin(ReadOnly):
    list_display = ["iid", "lease", "node", "state", "desired_state", "generation", "state_changed_at"]
    list_filter = ["state"]
    search_fields = ["iid"]
    inlines = [RestartInline]


@admin.action(description="Approve selected reschedules (re-planned now; a result per item)")
def approve_reschedules(modeladmin, request, queryset):
    ids = list(queryset.filter(status="pending").order_by("pk").values_list("pk", flat=True))
    if not ids:
        modeladmin.message_user(request, "No pending reschedules selected.", messages.WARNING)
        return
    for result in reschedules.do_approve(request.user, ids, now=timezone.now()):
        level = messages.SUCCESS if result.ok else messages.WARNING
        modeladmin.message_user(request, f"reschedule {result.id}: {result.message}", level)


@admin.action(description="Reject selected reschedules")
def reject_reschedules(modeladmin, request, queryset):
    for proposal in queryset.filter(status="pending"):
        reschedules.do_reject(request.user, proposal.pk, now=timezone.now(), reason="rejected in the admin")
    modeladmin.message_user(request, "Rejected.", messages.SUCCESS)


@admin.register(Reschedule)
class RescheduleAdmin(admin.ModelAdmin):
    list_display = ["id", "instance", "status", "proposed_node", "blocked_by", "message", "created_at"]
    list_filter = ["status", "blocked_by", "cause"]
    actions = [approve_reschedules, reject_reschedules]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class GroupForm(forms.ModelForm):
    class Meta:
        model = Group
        fields = ["name", "policy", "hard", "max_per_node", "leases"]

    def clean(self):
        data = super().clean()
        if data.get("hard"):
            problem = groups.violation(
                data.get("policy"),
                data.get("max_per_node") or 1,
                [lease.pk for lease in data.get("leases") or []],
            )
            if problem:
                raise forms.ValidationError(f"The current members already violate this policy: {problem}")
        return data


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    form = GroupForm
    list_display = ["name", "policy", "hard", "max_per_node"]
    filter_horizontal = ["leases"]

    def save_model(self, request, obj, form, change):
        fields = {f: form.cleaned_data[f] for f in groups.FIELDS if f in form.cleaned_data}
        leases = form.cleaned_data.get("leases") or []
        try:
            if change:
                groups.do_update_group(request.user, obj, now=timezone.now(), leases=leases, **fields)
                return
            group = groups.do_create_group(request.user, now=timezone.now(), leases=leases, **fields)
        except DomainError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        obj.pk, obj.created_at = group.pk, group.created_at
        obj._state.adding = False

    def save_related(self, request, form, formsets, change):
        pass  # the members were set by the action, in its transaction

    def delete_model(self, request, obj):
        groups.do_delete_group(request.user, obj, now=timezone.now())

    def delete_queryset(self, request, queryset):
        for group in queryset:
            groups.do_delete_group(request.user, group, now=timezone.now())


@admin.register(Alert)
class AlertAdmin(ReadOnly):
    list_display = ["created_at", "kind", "message", "resolved_at"]
    list_filter = ["kind"]


# The node admin, composed: fleet's, with the operations that touch what runs on a node calling the composed
# actions. The action functions keep fleet's names, so the admin's forms and links are unchanged.


@admin.action(description="Drain selected nodes (asks for a reason)", permissions=["change"])
def drain_nodes(modeladmin, request, queryset):
    return fleet_admin.with_reason(modeladmin, request, queryset, title="Drain", apply=nodes.do_drain)


@admin.action(
    description="Declare selected nodes dead (fences them; asks for a reason)", permissions=["change"]
)
def declare_nodes_dead(modeladmin, request, queryset):
    return fleet_admin.with_reason(
        modeladmin, request, queryset, title="Declare dead", apply=nodes.do_declare_dead
    )


admin.site.unregister(Node)


@admin.register(Node)
class NodeAdmin(fleet_admin.NodeAdmin):
    actions = [drain_nodes, fleet_admin.undrain_nodes, declare_nodes_dead, fleet_admin.readmit_nodes]

    def delete_node(self, request, node):
        nodes.do_delete_node(request.user, node.pk, now=timezone.now())
