"""Nodes, their health history, and the placer's stored verdicts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson
from django.conf import settings
from django.db import models, router
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils.functional import cached_property

from fleet import reports
from slotkeeper import statements


class NodeStatus(models.TextChoices):
    ONLINE = "online", "online"
    DRAINING = "draining", "draining"
    OFFLINE = "offline", "offline"
    DEAD = "dead", "dead"

    @property
    def badge(self) -> str:
        return {"online": "green", "draining": "amber", "offline": "grey", "dead": "red"}[self.value]


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True)
    cpu_cores = models.PositiveIntegerField()
    mem_total_mib = models.PositiveIntegerField()
    disk_total_gib = models.PositiveIntegerField()
    capabilities = models.JSONField(default=list, blank=True)

    status = models.CharField(
        max_length=16, choices=NodeStatus.choices, default=NodeStatus.OFFLINE, db_index=True
    )
    status_changed_at = models.DateTimeField(null=True, blank=True)
    status_reason = models.CharField(max_length=300, blank=True)
    drain_reason = models.CharField(max_length=300, blank=True)
    drained_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    drained_at = models.DateTimeField(null=True, blank=True)
    # Drain as a process: instances are moved off at most `drain_max_parallel` at a time until the deadline.
    drain_deadline = models.DateTimeField(null=True, blank=True)
    drain_max_parallel = models.PositiveIntegerField(default=2)

    # The latest heartbeat, kept on the row so the placer reads the whole fleet in one query. Not indexed: every
    # heartbeat writes it, and an indexed column makes every such write a new row version in each of the table's
    # indexes, where an update of unindexed columns stays on its page (PostgreSQL's HOT update; with the
    # table's fillfactor, migration fleet 0009). The sweep that reads it scans the fleet every few seconds.
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    obs_mem_total_mib = models.PositiveIntegerField(null=True, blank=True)
    obs_mem_used_mib = models.PositiveIntegerField(null=True, blank=True)
    obs_disk_free_gib = models.FloatField(null=True, blank=True)
    obs_cpu_pct = models.FloatField(null=True, blank=True)
    obs_load1 = models.FloatField(null=True, blank=True)
    reported_instances = models.JSONField(default=list, blank=True)
    last_sample_at = models.DateTimeField(null=True, blank=True)
    # Seed 001: the host's own use, remembered from a reading taken while it ran nothing.
    idle_baseline_mib = models.PositiveIntegerField(null=True, blank=True)

    # Fencing: a node an operator declared dead stays dead until an admin re-admits it. Its heartbeats are answered
    # 409 "fenced" (the agent stops its instances and waits), so a machine that still runs cannot come back by
    # itself and take work. A node the sweep found dead is not fenced: it returns when it heartbeats again.
    fenced_at = models.DateTimeField(null=True, blank=True)
    fence_reason = models.CharField(max_length=300, blank=True)
    last_fenced_heartbeat_at = models.DateTimeField(null=True, blank=True)

    token_digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    version = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(cpu_cores__gte=1), name="node_cpu_cores_positive"),
            models.CheckConstraint(condition=Q(mem_total_mib__gte=1), name="node_mem_positive"),
            models.CheckConstraint(
                condition=~Q(status="draining") | ~Q(drain_reason=""), name="node_draining_has_reason"
            ),
            models.CheckConstraint(
                condition=Q(fenced_at=None) | Q(status="dead"), name="node_fenced_is_dead"
            ),
            # "Tank" and "tank" would read as one machine on the board and in every log line.
            models.UniqueConstraint(Lower("name"), name="node_name_unique_ignoring_case"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def status_badge(self) -> str:
        return NodeStatus(self.status).badge

    @property
    def fenced(self) -> bool:
        return self.fenced_at is not None


class SweepState(models.Model):
    """The sweep's own memory (one row): when it last ran, and from when silence counts.

    A sweep that did not run for a while (the server was down, or beat was) cannot tell a silent node from its
    own absence, so every node gets a fresh grace from `grace_from`. When more than a share of the fleet goes
    silent at once (`disrupted_since`), the cause is most likely on our side or in the network between, so nodes
    are marked offline but none is declared dead until the disruption ends (Kubernetes' node lifecycle
    controller does the same for a zone it finds disrupted).
    """

    last_sweep_at = models.DateTimeField(null=True, blank=True)
    grace_from = models.DateTimeField(null=True, blank=True)
    disrupted_since = models.DateTimeField(null=True, blank=True)
    disruption_note = models.CharField(max_length=300, blank=True)

    def __str__(self) -> str:
        return f"sweep state (last run {self.last_sweep_at})"


class HealthSample(models.Model):
    """Bounded history of heartbeats for the charts (trimmed by the sweep)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health")
    at = models.DateTimeField()
    mem_total_mib = models.PositiveIntegerField()
    mem_used_mib = models.PositiveIntegerField()
    disk_free_gib = models.FloatField()
    cpu_pct = models.FloatField()
    load1 = models.FloatField()

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["node", "-at"], name="health_node_at_idx")]

    def __str__(self) -> str:
        return f"{self.node_id} at {self.at:%H:%M:%S}"

    @classmethod
    def of(cls, node_id: int, at: datetime, report: Any) -> HealthSample:
        """An unsaved sample of a heartbeat's report (anything with its five health fields)."""
        return cls(
            node_id=node_id,
            at=at,
            mem_total_mib=report.mem_total_mib,
            mem_used_mib=report.mem_used_mib,
            disk_free_gib=report.disk_free_gib,
            cpu_pct=report.cpu_pct,
            load1=report.load1,
        )


class CompactJSONEncoder(json.JSONEncoder):
    """JSON without the spaces after separators (a 1,000-node report's columns are a third separators otherwise),
    encoded by orjson: the standard library took a quarter of a millisecond for a 1,000-node report, a tenth of a
    decision's report budget. Integer keys become strings and numpy numbers plain numbers, as `json` would and
    could not; anything orjson refuses is left to `json`, which raises its own error."""

    def __init__(self, *args, **kwargs):
        kwargs["separators"] = (",", ":")
        super().__init__(*args, **kwargs)

    def encode(self, o: Any) -> str:
        try:
            return orjson.dumps(o, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode()
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            return super().encode(o)


class JSONTextField(models.JSONField):
    """A JSON document stored as plain text: written and read whole, never searched inside by the database.

    On PostgreSQL a JSONField is jsonb, which the server parses into its own binary form on every write. For a
    1,000-node placement report (about 18 KiB of JSON, written by every decision) that was about 1 ms of server
    time an INSERT, against 0.15 ms as text compressed the same way (docs/benchmarks/burst.md, "Placement
    reports stored as text"). Nothing asks the database about the inside of such a document; SQL reads it with
    `column::jsonb`. Key transforms and JSON lookups are therefore not offered (the database could not answer
    them on text): only `isnull`. On SQLite a JSONField is text already, checked by JSON_VALID as before."""

    def db_type(self, connection):
        return "text"

    def get_db_prep_value(self, value, connection, prepared=False):
        if not prepared:
            value = self.get_prep_value(value)
        return json.dumps(value, cls=self.encoder)

    def from_db_value(self, value, expression, connection):
        if value is None or self.decoder is not None:
            return super().from_db_value(value, expression, connection)
        return orjson.loads(value)

    def get_transform(self, name):
        return None

    def get_lookup(self, lookup_name):
        return super().get_lookup(lookup_name) if lookup_name == "isnull" else None


# Past this many nodes, a report's rows read every node's name rather than those of its nodes by id.
NAMES_BY_ID = 64


class PlacementReport(models.Model):
    """One placement decision and a verdict for every node, so "why not node X?" can be answered later."""

    created_at = models.DateTimeField(db_index=True)
    subject = models.CharField(max_length=64)  # "preview", "lease:7", "reschedule:3"; Meta.indexes
    request = models.JSONField()
    outcome = models.CharField(max_length=32)
    # For a decision that placed nothing: which of the placer's three outcomes (no_capable_node, fleet_unreadable,
    # fleet_at_capacity), as a rejected lease's 409 answers it in `code`; "" when placed (or stored before).
    code = models.CharField(max_length=32, blank=True, default="")
    message = models.TextField()
    chosen = models.JSONField(default=list)
    preferred_note = models.TextField(blank=True)
    # Every node's verdict, stored compactly as columns (fleet/reports.py); read them with `rows`. Reports written
    # before that are a list of row dicts, which `rows` returns as they are.
    verdicts = JSONTextField(default=list, encoder=CompactJSONEncoder)
    requested_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["subject"], name="report_subject_idx")]

    def __str__(self) -> str:
        return f"placement {self.pk} ({self.subject}: {self.outcome})"

    @cached_property
    def rows(self) -> list[dict]:
        """One dict per node (fleet/reports.py), in rank order, with node names and sentences in user units."""
        ids = reports.node_ids(self.verdicts) if reports.is_compact(self.verdicts) else []
        names = Node.objects.values_list("pk", "name")
        if len(ids) > NAMES_BY_ID:
            # A report covers the whole fleet as it was: every name in one plain read, rather than an IN list of
            # a thousand parameters that Django prepares one by one (a few ms a report read at 1,000 nodes),
            # from a statement compiled once (slotkeeper/statements.py).
            alias = router.db_for_read(Node)
            every = statements.template(alias, "fleet.node_names", _node_names).rows(alias)
            return reports.decode(self.verdicts, dict(every))
        return reports.decode(self.verdicts, dict(names.filter(pk__in=ids)) if ids else {})

    def use_names(self, names: Mapping[int, str]) -> None:
        """Read `rows` with node names the caller already holds (a planning pass has them all), instead of
        querying them: at 1,000 nodes the query is a good part of reading a report."""
        self.__dict__["rows"] = reports.decode(self.verdicts, names)

    @property
    def summary(self) -> str:
        return self.verdicts.get("summary", "") if reports.is_compact(self.verdicts) else ""

    @property
    def counts(self) -> dict:
        return self.verdicts.get("counts", {}) if reports.is_compact(self.verdicts) else {}

    def verdict_for(self, node_name: str) -> dict | None:
        return next((v for v in self.rows if v["node"] == node_name), None)


def _node_names():
    return Node.objects.values_list("pk", "name").order_by()
