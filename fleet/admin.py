"""Django admin for the fleet. Every change goes through fleet/actions.py, exactly as the API's do: the admin's
own save is replaced, and drain / undrain ask for a reason on an intermediate page. The node admin the site shows
is composed one layer up (leases/instances/admin.py), so that a drain, a declare-dead or a delete also acts on
the node's instances."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from fleet import actions, reports
from fleet.models import HealthSample, Node, PlacementReport
from slotkeeper.domain import DomainError


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=300, required=True, help_text="Shown on the fleet board and in the audit feed."
    )


class NodeCreateForm(forms.ModelForm):
    class Meta:
        model = Node
        fields = ["name", "cpu_cores", "mem_total_mib", "disk_total_gib", "capabilities"]


def with_reason(modeladmin, request, queryset, *, title: str, apply, optional: bool = False):
    form = ReasonForm(request.POST if "apply" in request.POST else None)
    if optional:
        form.fields["reason"].required = False
    if "apply" in request.POST and form.is_valid():
        done, failed = 0, []
        for node in queryset:
            try:
                apply(request.user, node.pk, reason=form.cleaned_data["reason"], now=timezone.now())
                done += 1
            except DomainError as exc:
                failed.append(str(exc))
        if done:
            modeladmin.message_user(request, f"{title}: {done} node(s).", messages.SUCCESS)
        for message in failed:
            modeladmin.message_user(request, message, messages.ERROR)
        return None
    return render(
        request,
        "admin/fleet/reason.html",
        {
            "title": title,
            "nodes": queryset,
            "form": form,
            "action": request.POST.get("action"),
            "opts": modeladmin.model._meta,
        },
    )


@admin.action(description="Undrain selected nodes", permissions=["change"])
def undrain_nodes(modeladmin, request, queryset):
    return with_reason(
        modeladmin, request, queryset, title="Undrain", apply=actions.do_undrain, optional=True
    )


@admin.action(description="Re-admit selected fenced nodes (asks for a reason)", permissions=["change"])
def readmit_nodes(modeladmin, request, queryset):
    return with_reason(modeladmin, request, queryset, title="Re-admit", apply=actions.do_readmit)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "status",
        "drain_reason",
        "cpu_cores",
        "mem_total_mib",
        "disk_total_gib",
        "last_heartbeat_at",
    ]
    list_filter = ["status"]
    search_fields = ["name"]
    # Drain and declare-dead are added by the composed admin (leases/instances/admin.py): they act on instances.
    actions = [undrain_nodes, readmit_nodes]
    readonly_fields = [
        "status",
        "status_reason",
        "status_changed_at",
        "drain_reason",
        "drained_by",
        "drained_at",
        "last_heartbeat_at",
        "obs_mem_total_mib",
        "obs_mem_used_mib",
        "obs_disk_free_gib",
        "obs_cpu_pct",
        "obs_load1",
        "reported_instances",
        "idle_baseline_mib",
        "fenced_at",
        "fence_reason",
        "last_fenced_heartbeat_at",
        "version",
    ]
    exclude = ["token_digest"]

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = NodeCreateForm
            kwargs["fields"] = NodeCreateForm.Meta.fields
        return super().get_form(request, obj, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        now = timezone.now()
        if change:
            fields = {f: form.cleaned_data[f] for f in form.changed_data if f in actions.EDITABLE}
            updated = actions.do_update_node(request.user, obj.pk, fields, now=now)
            obj.version = updated.version
            return
        node, token = actions.do_register_node(
            request.user,
            name=form.cleaned_data["name"],
            cpu_cores=form.cleaned_data["cpu_cores"],
            mem_total_mib=form.cleaned_data["mem_total_mib"],
            disk_total_gib=form.cleaned_data["disk_total_gib"],
            capabilities=form.cleaned_data.get("capabilities") or [],
            now=now,
        )
        obj.pk = node.pk
        self.message_user(
            request, f"Node token for {node.name} (shown once, copy it now): {token}", messages.WARNING
        )

    def delete_model(self, request, obj):
        self._delete(request, obj)

    def delete_queryset(self, request, queryset):
        for node in queryset:
            self._delete(request, node)

    def _delete(self, request, node):
        # A node that still runs instances or holds reservations is refused with the reason, not a server error.
        try:
            self.delete_node(request, node)
        except DomainError as exc:
            self.message_user(request, str(exc), messages.ERROR)

    def delete_node(self, request, node):
        # Fleet alone knows no instances; the composed admin (leases/instances/admin.py) counts them too.
        actions.do_delete_node(request.user, node.pk, now=timezone.now())


@admin.register(PlacementReport)
class PlacementReportAdmin(admin.ModelAdmin):
    list_display = ["id", "created_at", "subject", "outcome", "message"]
    list_filter = ["outcome"]
    search_fields = ["subject"]
    # The verdicts are stored compactly (columns, runs; docs/capacity.md): shown as that JSON, they were unreadable
    # where an operator came to read why each node could or could not take the lease. Shown decoded instead.
    fields = [
        "created_at", "subject", "request", "outcome", "message", "chosen", "preferred_note", "requested_by",
        "summary", "verdict_table",
    ]  # fmt: skip
    readonly_fields = ["summary", "verdict_table"]

    @admin.display(description="summary")
    def summary(self, obj: PlacementReport) -> str:
        return obj.summary or "-"

    @admin.display(description="verdicts")
    def verdict_table(self, obj: PlacementReport):
        if not (reports.is_compact(obj.verdicts) or isinstance(obj.verdicts, list)):
            # Neither the compact document nor the older list of rows: shown as stored.
            return format_html("<pre>{}</pre>", json.dumps(obj.verdicts, indent=1))
        rows = obj.rows
        link = format_html(
            '<p><a href="{}">Open in the console</a> (sortable, with each node\'s figures).</p>',
            reverse("placement-report", args=[obj.pk]),
        )
        if not rows:
            return format_html("{}<p>No node verdicts.</p>", link)
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (  # .get: rows stored before reports were compact may lack a field
                    v.get("node", ""),
                    "chosen" if v.get("chosen") else "fit" if v.get("fit") else "no",
                    v.get("holds", ""),
                    v.get("reason_code") or "",
                    v.get("reason") or "",
                    v.get("rank") or "",
                )
                for v in rows
            ),
        )
        return format_html(
            "{}<table><thead><tr><th>node</th><th>verdict</th><th>holds</th><th>code</th><th>reason</th>"
            "<th>rank</th></tr></thead><tbody>{}</tbody></table>",
            link,
            body,
        )

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False


@admin.register(HealthSample)
class HealthSampleAdmin(admin.ModelAdmin):
    list_display = ["node", "at", "mem_used_mib", "cpu_pct"]
    list_filter = ["node"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False
