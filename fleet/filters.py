"""The node list's one filter definition, shared by the API's node list and the console's fleet board (django-filter's
FilterSet, as NetBox does): status, a search over names and capabilities, and the sort.

Every value is checked and a bad one is named with what would be right ("status: "busy" is not a status; one of
online, draining, offline, dead"), never a 500 and never silently dropped. The sorts here are over the node's own
columns; what the slot table holds on a node (committed now) is added one layer up, where leases are known
(leases/instances/filters.py), so the board and the API sort by it alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import django_filters
from django import forms
from django.db.models import Case, F, FloatField, IntegerField, Q, QuerySet, TextField, Value, When
from django.db.models.expressions import Combinable, OrderBy
from django.db.models.functions import Cast, Coalesce, Greatest, NullIf

from fleet import nodestate
from fleet.models import Node, NodeStatus

# A search is part of a name (up to 100 characters) or of a capability (the same).
MAX_SEARCH = 100
# The characters a capability is written with (slotkeeper.fields.CAPABILITY_RE): only such a search looks inside
# the capabilities, whose stored JSON text would otherwise match `"` or `,` of every node with two of them.
CAPABILITY_TEXT = re.compile(r"^[a-z0-9_.:/-]+$")


def allocatable_mem(prefix: str = "") -> Combinable:
    """Allocatable memory in the database, as fleet.nodestate.allocatable works it out (a test holds them equal):
    declared less the host reserve and the remembered baseline (never below the floor), never negative. `prefix`
    reaches the node from another model ("node__" from an allocation)."""
    return Greatest(
        F(f"{prefix}mem_total_mib")
        - Value(nodestate.HOST_RESERVE_MIB)
        - Greatest(Coalesce(F(f"{prefix}idle_baseline_mib"), Value(0)), Value(nodestate.BASELINE_FLOOR_MIB)),
        Value(0),
    )


def allocatable_disk(prefix: str = "") -> Combinable:
    """Allocatable disk in the database: declared less the disk reserve, never negative."""
    return Greatest(F(f"{prefix}disk_total_gib") - Value(nodestate.DISK_RESERVE_GIB), Value(0))


NO_CAPABILITIES = Case(When(capabilities=[], then=Value(1)), default=Value(0), output_field=IntegerField())
STATUS_RANK = Case(
    *(When(status=s, then=Value(i)) for i, s in enumerate(NodeStatus.values)), output_field=IntegerField()
)


@dataclass(frozen=True)
class Term:
    """One ORDER BY term: ascending unless `desc`; `nulls_follow` puts unknowns (no heartbeat yet) where the
    direction puts the extreme (the oldest heartbeat is "never"), otherwise unknowns come last either way."""

    expression: Combinable
    desc: bool = False
    nulls_follow: bool = False

    def order(self, reverse: bool) -> OrderBy:
        last = not reverse if self.nulls_follow else True
        return OrderBy(
            self.expression,
            descending=self.desc != reverse,
            nulls_last=True if last else None,
            nulls_first=None if last else True,
        )


def share(part: Combinable, whole: Combinable) -> Combinable:
    """part / whole as a fraction (NULL when the whole is 0), in floating point on every database."""
    return Cast(part, FloatField()) / NullIf(Cast(whole, FloatField()), Value(0.0))


# key -> (what a person calls it, its ORDER BY terms). A name breaks every tie, so pages never overlap.
SORTS: dict[str, tuple[str, tuple[Term, ...]]] = {
    "name": ("name", (Term(F("name")),)),
    "status": ("status", (Term(STATUS_RANK),)),
    "age": ("health age", (Term(F("last_heartbeat_at"), desc=True, nulls_follow=True),)),
    "declared": ("declared capacity", (Term(F("cpu_cores")), Term(F("mem_total_mib")))),
    "allocatable": ("allocatable memory", (Term(allocatable_mem()), Term(F("cpu_cores")))),
    "observed": ("observed memory use", (Term(share(F("obs_mem_used_mib"), F("mem_total_mib"))),)),
    # Grouped by their text (so every "gpu" node is together), nodes with none after the others: the JSON's own
    # order differs between databases (PostgreSQL orders arrays by length first, SQLite by their text).
    "capabilities": ("capabilities", (Term(NO_CAPABILITIES), Term(Cast(F("capabilities"), TextField())))),
    "drain": ("drain", (Term(F("drained_at")),)),
}
DEFAULT_SORT = "name"
# What the schema says of the values (docs/openapi.yaml), the same rules clean_status and clean_sort apply.
_STATUS = "|".join(NodeStatus.values)
STATUS_PATTERN = f"^(({_STATUS})(,({_STATUS}))*)?$"
SORT_PATTERN = "^(-?(" + "|".join([*SORTS, "committed"]) + "))?$"


def order_by(sorts: dict[str, tuple[str, tuple[Term, ...]]], sort: str) -> list[OrderBy]:
    """The ORDER BY of a checked sort ("-key" reverses), ending with the name so that the order is total."""
    key, reverse = sort.removeprefix("-"), sort.startswith("-")
    terms = [t.order(reverse) for t in sorts[key][1]]
    if key != "name":
        terms.append(Term(F("name")).order(False))
    return terms


class NodeFilterForm(forms.Form):
    """Checks each value and says what is wrong with it in words (the keys of a sort are the column names)."""

    sorts: dict[str, tuple[str, tuple[Term, ...]]] = SORTS

    def clean_status(self) -> list[str]:
        raw = self.data.get("status") or ""
        values = raw.split(",") if raw else []
        unknown = [v for v in values if v not in NodeStatus.values]
        if unknown:
            raise forms.ValidationError(
                f'"{unknown[0][:40]}" is not a status; one of {", ".join(NodeStatus.values)} '
                "(several separated by commas)."
            )
        return values

    def clean_q(self) -> str:
        q = self.data.get("q") or ""
        if len(q) > MAX_SEARCH:
            raise forms.ValidationError(
                f"A search is at most {MAX_SEARCH} characters (this one has {len(q):,})."
            )
        return q.strip()

    def clean_sort(self) -> str:
        sort = self.data.get("sort") or ""
        if sort and sort.removeprefix("-") not in self.sorts:
            keys = ", ".join(self.sorts)
            raise forms.ValidationError(
                f'Cannot sort by "{sort[:40]}": one of {keys}, with "-" first for the reverse order.'
            )
        return sort


class NodeFilterSet(django_filters.FilterSet):
    status = django_filters.CharFilter(
        method="by_status",
        help_text="one status or several, comma-separated: online, draining, offline, dead",
    )
    q = django_filters.CharFilter(
        method="by_text", help_text="part of a node's name or of one of its capabilities"
    )
    sort = django_filters.CharFilter(
        method="by_sort", help_text="a column (name, status, age, ...); a leading '-' reverses it"
    )

    sorts = SORTS

    class Meta:
        model = Node
        fields: list[str] = []
        form = NodeFilterForm

    def get_form_class(self):
        form = super().get_form_class()
        return type(form.__name__, (form,), {"sorts": self.sorts})

    def by_status(self, queryset, name, value):
        return queryset.filter(status__in=value) if value else queryset

    def by_text(self, queryset, name, value):
        match = Q(name__icontains=value)
        if CAPABILITY_TEXT.match(value.lower()):
            match |= Q(capabilities__icontains=value.lower())
        return queryset.filter(match)

    def by_sort(self, queryset, name, value):
        return self.sorted(queryset, value)

    def sorted(self, queryset: QuerySet, sort: str) -> QuerySet:
        return queryset.order_by(*order_by(self.sorts, sort or DEFAULT_SORT))

    def messages(self) -> dict[str, str]:
        """Each bad parameter's message (empty when every value was good)."""
        return {name: " ".join(errors) for name, errors in self.errors.items()}
