from django.contrib import admin

from slotkeeper.models import ApiToken, AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["at", "actor_label", "action", "target_label", "reason"]
    list_filter = ["action", "target_type"]
    search_fields = ["actor_label", "target_label", "reason"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "created_at", "last_used_at", "revoked_at"]
    exclude = ["digest"]

    def has_add_permission(self, request):
        # Tokens are made by `manage.py issue_token`, which shows the raw token once.
        return False
