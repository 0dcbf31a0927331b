"""What a node's agent should be running: its desired instances, each with its desired state and generation.

The leases app contributes the instances (it owns them); until a provider is registered the answer is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from fleet.models import Node

AssignmentProvider = Callable[[Node, datetime], list[dict]]
_providers: list[AssignmentProvider] = []


def register_assignment_provider(provider: AssignmentProvider) -> None:
    if provider not in _providers:
        _providers.append(provider)


def assignments_for(node: Node, *, now: datetime) -> dict:
    instances: list[dict] = []
    for provider in _providers:
        instances.extend(provider(node, now))
    return {"node": node.pk, "status": node.status, "instances": instances}
