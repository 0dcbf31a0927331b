"""The API's list pagination: DRF's limit/offset with a ceiling on `limit`.

Without one, `?limit=10**30` went to the database as a LIMIT no integer column type holds (a 500). A limit above the
ceiling is clamped, as DRF documents for `max_limit`; the response says how many there are in `count`.
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 1000


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT
