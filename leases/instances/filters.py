"""One filter definition per list, shared by the console and the API (django-filter's FilterSet, as NetBox does),
so the two cannot drift apart again (the reschedule filters had: the console knew `cause`, the API did not).

The surfaces keep their own parameter conventions on top: the console reads one value per filter from its
form (and defaults the reschedule list to the pending work queue), the API accepts comma-separated lists. Both
end here.
"""

from __future__ import annotations

from datetime import datetime

import django_filters
from django.db.models import OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from fleet import filters as fleet_filters
from leases.instances.models import Reschedule
from leases.models import Alert, Allocation, Instance
from slotkeeper.fields import is_id


def _in(field: str):
    def method(queryset, name, value):
        values = [v for v in value.split(",") if v]
        return queryset.filter(**{f"{field}__in": values}) if values else queryset

    return method


class InstanceFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(method="by_node", help_text="node id or name")
    lease = django_filters.CharFilter(method="by_lease", help_text="lease id")
    state = django_filters.CharFilter(method="by_state", help_text="one state or several, comma-separated")

    class Meta:
        model = Instance
        fields: list[str] = []

    def by_node(self, queryset, name, value):
        # A node link carries the id; a person types the name.
        return queryset.filter(node_id=int(value)) if is_id(value) else queryset.filter(node__name=value)

    def by_lease(self, queryset, name, value):
        return queryset.filter(lease_id=int(value)) if is_id(value) else queryset

    def by_state(self, queryset, name, value):
        return _in("state")(queryset, name, value)


class RescheduleFilterSet(django_filters.FilterSet):
    status = django_filters.CharFilter(method="by_status", help_text="one status or several, comma-separated")
    group = django_filters.CharFilter(field_name="lease__groups__name")
    cause = django_filters.CharFilter(field_name="cause")

    class Meta:
        model = Reschedule
        fields: list[str] = []

    def by_status(self, queryset, name, value):
        return _in("status")(queryset, name, value)


class AlertFilterSet(django_filters.FilterSet):
    open = django_filters.CharFilter(method="only_open", help_text="1 or true: only alerts not yet resolved")
    kind = django_filters.CharFilter(field_name="kind")

    class Meta:
        model = Alert
        fields: list[str] = []

    def only_open(self, queryset, name, value):
        return queryset.filter(resolved_at=None) if value in {"1", "true"} else queryset


def committed_mem(now: datetime):
    """What the slot table holds on the outer node at `now`, in MiB (leases.reads.committed_now's memory figure,
    as a subquery: the node's rows of the allocation window index)."""
    rows = (
        Allocation.objects.filter(node=OuterRef("pk"), live=True, start__lte=now, end__gt=now)
        .order_by()
        .values("node")
        .annotate(total=Sum("mem_mib"))
        .values("total")
    )
    return Coalesce(Subquery(rows), Value(0))


class NodeFilterSet(fleet_filters.NodeFilterSet):
    """Fleet's node filters with the sort by what the slot table holds on a node now ("committed": committed memory
    as a share of allocatable, the board's bar). The API's node list and the fleet board both filter with this."""

    def __init__(self, data=None, queryset=None, *, now: datetime, **kwargs):
        committed = fleet_filters.Term(
            fleet_filters.share(committed_mem(now), fleet_filters.allocatable_mem())
        )
        # In the board's column order: after allocatable.
        self.sorts = {}
        for key, sort in fleet_filters.SORTS.items():
            self.sorts[key] = sort
            if key == "allocatable":
                self.sorts["committed"] = ("committed now", (committed,))
        super().__init__(data, queryset, **kwargs)


def filtered(filterset_class, params, queryset):
    """The queryset narrowed by the parameters the filter set knows; others are left to the caller."""
    return filterset_class(params, queryset=queryset).qs
