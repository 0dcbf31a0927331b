"""Who may call the API (tokens) and what was done (the audit feed)."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


def hash_token(raw: str) -> str:
    # Tokens are 32 random bytes, so a plain SHA-256 is enough: there is nothing to brute-force, and a lookup by
    # digest stays one indexed query on every API call.
    return hashlib.sha256(raw.encode()).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class ApiToken(models.Model):
    """A Bearer token for a person or an integration. Only the digest is stored; the token is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"token {self.pk} of {self.user}"


class AuditEntry(models.Model):
    """One row per operator-visible change: who, what, when, why."""

    at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=64)
    target_label = models.CharField(max_length=200, blank=True)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target_idx")]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.target_label}"


class Event(models.Model):
    """One row of the outbox (slotkeeper/outbox.py): what changed, written in the transaction that changed it, and
    numbered (`seq`) once committed, in commit order, for the event feed (`/api/events/`) to follow. Plain ids, no
    foreign keys: an event outlives the rows it names (a deleted node's events are still its history)."""

    seq = models.PositiveBigIntegerField(null=True, blank=True, unique=True)
    type = models.CharField(max_length=40)
    at = models.DateTimeField()
    lease_id = models.BigIntegerField(null=True, blank=True)
    instance = models.CharField(max_length=64, blank=True)
    node_id = models.BigIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["lease_id", "seq"], name="event_lease_seq_idx"),
            models.Index(fields=["node_id", "seq"], name="event_node_seq_idx"),
            models.Index(fields=["at"], name="event_at_idx"),
            # The rows not numbered yet: the sequencer's next batch, found without a scan.
            models.Index(fields=["id"], condition=models.Q(seq__isnull=True), name="event_unnumbered_idx"),
        ]

    def __str__(self) -> str:
        return f"event {self.seq} {self.type}"


class EventFeed(models.Model):
    """The feed's one state row: every event up to `pruned_through` has been deleted by retention, so a client
    asking for anything after an earlier `seq` is told to resync (410)."""

    pruned_through = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"event feed, pruned through {self.pruned_through}"


class ConsolePreferences(models.Model):
    """What one person chose for the console, kept with their account so that it follows them to every browser and
    every sign-in: today whether the single-key shortcuts are on. Pages read the copy their session took at sign-in
    (slotkeeper/preferences.py), so no page asks a query for it."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="console_preferences",
    )
    shortcuts = models.BooleanField(
        default=True,
        help_text="single-key shortcuts (g then a letter, /, p, t, [ ] n - +, ?): off for a screen reader or "
        "voice control whose own keys they would take",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "console preferences"

    def __str__(self) -> str:
        return f"console preferences of {self.user}"
