"""One filter definition per list, shared by the console and the API (django-filter's FilterSet, as NetBox does),
so the two cannot drift apart again (the reschedule filters had: the console knew `cause`, the API did not).

The surfaces keep their own parameter conventions on top: the console reads one value per filter from its
form (and defaults the reschedule list to the pending work queue), the API accepts comma-separated lists. Both
end here.
"""

from __future__ import annotations

import django_filters

from leases.instances.models import Reschedule
from leases.models import Alert, Instance
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


def filtered(filterset_class, params, queryset):
    """The queryset narrowed by the parameters the filter set knows; others are left to the caller."""
    return filterset_class(params, queryset=queryset).qs
