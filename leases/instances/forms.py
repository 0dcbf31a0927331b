"""The console's instance-package forms, validated by the API's serializers (slotkeeper/forms.py says how):
resolving an alert."""

from __future__ import annotations

from django.http import QueryDict

from leases.instances.api.views import RejectSerializer
from slotkeeper.forms import Checked, check


def check_resolve(post: QueryDict) -> Checked:
    # The API's resolve takes the same body as a reject: an optional reason of at most 300 characters.
    values = {"reason": post.get("reason", "")}
    return check(RejectSerializer, {"reason": values["reason"]}, values)
