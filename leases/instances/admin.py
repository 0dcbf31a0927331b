"""Django admin for leases, instances and reschedules. Changes go through the action layer: reschedules are
approved with an admin action that calls leases.recovery.do_approve, exactly as the API and the console do."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from leases import recovery
from leases.models import Alert, Group, Instance, Lease, Reschedule, RestartRecord


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class RestartInline(admin.TabularInline):
    model = RestartRecord
    extra = 0
    can_delete = False
    readonly_fields = ["at", "attempt", "reason", "decision", "next_eligible_at", "explanation"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Lease)
class LeaseAdmin(ReadOnly):
    list_display = ["id", "name", "type", "state", "submitted_at", "duration_s"]
    list_filter = ["type", "state"]
    search_fields = ["name"]


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
    for result in recovery.do_approve(request.user, ids, now=timezone.now()):
        level = messages.SUCCESS if result.ok else messages.WARNING
        modeladmin.message_user(request, f"reschedule {result.id}: {result.message}", level)


@admin.action(description="Reject selected reschedules")
def reject_reschedules(modeladmin, request, queryset):
    for proposal in queryset.filter(status="pending"):
        recovery.do_reject(request.user, proposal.pk, now=timezone.now(), reason="rejected in the admin")
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
            problem = recovery.group_violation(
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


@admin.register(Alert)
class AlertAdmin(ReadOnly):
    list_display = ["created_at", "kind", "message", "resolved_at"]
    list_filter = ["kind"]
