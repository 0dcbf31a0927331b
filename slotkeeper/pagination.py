"""The API's list pagination: DRF's limit/offset with a ceiling on `limit`, and no silent guesses.

Without a ceiling, `?limit=10**30` went to the database as a LIMIT no integer column type holds (a 500). A limit above
the ceiling is clamped, as DRF documents for `max_limit`; the response says how many there are in `count`.

DRF reads a `limit` or `offset` that is not a whole number (`?offset=null`, `?limit=-5`) as if it were absent and
answers the first page: a client with a bug in its paging loop then reads page one forever. Here such a value is a
400 naming the parameter, and the schema states the bounds.
"""

from __future__ import annotations

import math

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

from slotkeeper.fields import INT64_MAX, whole_number

MAX_LIMIT = 1000


def _whole(request, name: str, least: int, default: int | None, most: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = whole_number(raw)
    if value is None or value < least or (most is not None and value > most):
        bound = f"from {least} to {most}" if most is not None else f"of at least {least}"
        raise ValidationError({name: [f"A whole number {bound}."]})
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        limit = _whole(request, self.limit_query_param, 1, self.default_limit)
        return None if limit is None else min(limit, self.max_limit)

    def get_offset(self, request):
        return _whole(request, self.offset_query_param, 0, 0, INT64_MAX)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"]["minimum"] = 1  # no maximum: a larger limit is clamped to MAX_LIMIT
                parameter["description"] = f"Number of results to return per page (at most {MAX_LIMIT})."
            else:
                parameter["schema"].update(minimum=0, maximum=INT64_MAX)
        return parameters


def page_number(raw: str) -> tuple[int, str]:
    """A console list's `?page=`: the page, or the first and why the value cannot be read."""
    number = whole_number(raw.strip())
    if number is None or number < 1:
        return 1, f'"{raw[:40]}" is not a page number; pages count from 1.'
    return number, ""


class PageNumbers:
    """What the console's paged lists (the fleet board, the lease list) say of the page they show, from the matching
    rows counted in the database, the page's number (from 1) and the rows a page: how many pages, whether this one
    is past the end, and which rows it holds ("Leases 101–200 of 250")."""

    matching: int
    number: int
    per: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.matching / self.per))

    @property
    def past_end(self) -> bool:
        return self.number > self.pages

    @property
    def first(self) -> int:
        return (self.number - 1) * self.per + 1

    @property
    def last(self) -> int:
        return min(self.matching, self.number * self.per)
