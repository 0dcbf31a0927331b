"""Django admin for leases: read-only (leases change through the API and the scheduler, never by hand). Instances,
reschedules, groups and alerts are in leases/instances/admin.py."""

from __future__ import annotations

from django.contrib import admin

from leases.models import Lease


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Lease)
class LeaseAdmin(ReadOnly):
    list_display = ["id", "name", "type", "state", "submitted_at", "duration_s"]
    list_filter = ["type", "state"]
    # A client's Idempotency-Key finds the lease its request made (docs/plan-applier.md).
    search_fields = ["name", "idempotency_key"]
    readonly_fields = ["idempotency_key"]
