"""The instances package's own rows: every restart decision, and reschedule proposals.

The tables keep their names from when these models lived in the lease app (`db_table`): moving them was a change
of Django state only (migrations with SeparateDatabaseAndState), and no row moved.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class RestartDecisionKind(models.TextChoices):
    RESTART = "restart", "restart now"
    WAIT = "wait", "wait"
    EXHAUSTED = "exhausted", "exhausted"


class RestartRecord(models.Model):
    """Every restart decision: when, which attempt, why, what was decided, and when it may go next."""

    instance = models.ForeignKey("leases.Instance", on_delete=models.CASCADE, related_name="restarts")
    at = models.DateTimeField()
    attempt = models.PositiveIntegerField()
    reason = models.TextField()
    decision = models.CharField(max_length=16, choices=RestartDecisionKind.choices)
    next_eligible_at = models.DateTimeField(null=True, blank=True)
    explanation = models.TextField(blank=True)

    class Meta:
        db_table = "leases_restartrecord"
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.instance_id} attempt {self.attempt}: {self.decision}"


class RescheduleStatus(models.TextChoices):
    PENDING = "pending", "pending"
    APPLIED = "applied", "applied"
    REJECTED = "rejected", "rejected"


class Reschedule(models.Model):
    """A proposal to move a lost (or drained) instance to another node, waiting for an operator (or auto-approved).

    `version` rises whenever the proposal is re-planned, so an approval made against an older view gets 412.
    """

    instance = models.ForeignKey("leases.Instance", on_delete=models.CASCADE, related_name="reschedules")
    lease = models.ForeignKey("leases.Lease", on_delete=models.CASCADE, related_name="reschedules")
    status = models.CharField(
        max_length=16, choices=RescheduleStatus.choices, default=RescheduleStatus.PENDING, db_index=True
    )
    cause = models.CharField(max_length=32, default="node_dead")
    proposed_node = models.ForeignKey(
        "fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    report = models.ForeignKey("fleet.PlacementReport", null=True, blank=True, on_delete=models.SET_NULL)
    blocked_by = models.CharField(
        max_length=32, blank=True, help_text="why it is not applied yet: a reason code"
    )
    message = models.TextField(blank=True)
    version = models.PositiveIntegerField(default=1)
    # The room kept on the proposed node (a `hold` reservation of the lease, its rid) and until when: past that
    # the tick releases it and proposes again against the fleet as it is (RESCHEDULE_HOLD_S).
    hold_rid = models.PositiveBigIntegerField(null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    new_instance = models.OneToOneField(
        "leases.Instance",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="created_by_reschedule",
    )

    class Meta:
        db_table = "leases_reschedule"
        ordering = ["-created_at", "-id"]
        constraints = [
            # One open proposal per lost instance, however many sweeps or declare-deads see it.
            models.UniqueConstraint(
                fields=["instance"], condition=Q(status="pending"), name="one_pending_reschedule_per_instance"
            )
        ]

    def __str__(self) -> str:
        return f"reschedule {self.pk} of {self.instance_id} ({self.status})"
