"""Leases, the slot table's rows (reservations) and their per-node allocations, each lease's state history, the
instance rows of its vnodes with their history, the groups it belongs to, and alerts. Restart records and
reschedules belong to the instances package (leases/instances/models.py).

Text indexes: a text column is indexed in `Meta.indexes` (and made unique in `Meta.constraints`), not with
`db_index=True` or `unique=True`. On PostgreSQL those also build a second index on the column (`varchar_pattern_ops`,
for `LIKE 'x%'`), which no query here asks and every insert and state change pays: a planning pass wrote about 70
index entries a lease request, ten of them into such indexes (docs/benchmarks/pass-cost.md). A foreign key that a
composite index leads with has no index of its own, for the same reason."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from fleet.wording import words
from leases.lifecycle import INSTANCE_BADGES, LEASE_BADGES, InstanceState, LeaseState

LEASE_STATE_CHOICES = [(s.value, s.value.replace("_", " ")) for s in LeaseState]


class LeaseType(models.TextChoices):
    BEST_EFFORT = "best_effort", "best-effort"
    ADVANCE_RESERVATION = "advance_reservation", "advance reservation"
    IMMEDIATE = "immediate", "immediate"


class ReservationKind(models.TextChoices):
    VM = "vm", "vm"
    SUSPEND = "suspend", "suspend"
    RESUME = "resume", "resume"
    MIGRATE = "migrate", "migrate"
    SHUTDOWN = "shutdown", "shutdown"
    # Room held for a lost vnode on a reschedule proposal's target (leases/scheduling/records.py HOLD).
    HOLD = "hold", "hold"


class ReservationStatus(models.TextChoices):
    SCHEDULED = "scheduled", "scheduled"
    ACTIVE = "active", "active"
    DONE = "done", "done"
    CANCELLED = "cancelled", "cancelled"


LIVE_RESERVATION_STATUSES = (ReservationStatus.SCHEDULED, ReservationStatus.ACTIVE)


class Lease(models.Model):
    name = models.CharField(max_length=200)
    type = models.CharField(max_length=24, choices=LeaseType.choices)
    # Indexed in Meta.indexes (see the module's note on text indexes).
    state = models.CharField(max_length=24, choices=LEASE_STATE_CHOICES, default=LeaseState.NEW)
    submitted_at = models.DateTimeField(db_index=True)
    requested_start = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField()
    # One entry per VM: {"cpu_cores", "mem_mib", "disk_gib"}.
    vnodes = models.JSONField()
    capabilities = models.JSONField(default=list, blank=True)
    preemptible = models.BooleanField(default=True)
    # Simulation only (demo and tests): the lease really ends after this much run time.
    real_duration_s = models.FloatField(null=True, blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    first_start = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    run_time_s = models.FloatField(default=0)
    lost_run_time_s = models.FloatField(default=0)
    in_future = models.BooleanField(default=False)
    # vnode -> node id where the vnode's suspended memory image lies.
    images = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True)
    version = models.PositiveIntegerField(default=1)
    # The queue forecast (leases/forecasting.py): for a queued lease, when it would run were every queued lease
    # reserved in order as conservative backfilling would; None with the reason in estimate_note when it cannot
    # be given. Empty for a lease that is not queued.
    estimated_start = models.DateTimeField(null=True, blank=True)
    estimated_end = models.DateTimeField(null=True, blank=True)
    estimate_note = models.CharField(max_length=300, blank=True, default="")
    # The forecast's first estimated start of a lease queued at submission, kept after it starts: the calibration
    # of later estimates compares it with first_start (leases/scheduling/calibration.py).
    first_estimate = models.DateTimeField(null=True, blank=True, editable=False)

    # Instance policy (seed 003): restarts, reschedules, and what the agent runs.
    migratable = models.BooleanField(default=True)
    restart_policy = models.JSONField(default=dict, blank=True)
    max_reschedules = models.PositiveIntegerField(default=5)
    auto_approve_reschedules = models.BooleanField(default=False)
    # A `lease.ending` event this long before the lease's end (issue 48; 0: none), and the end it was sent for: sent
    # once per end, so a restart never sends it twice and an extension gets its own.
    notify_before_s = models.PositiveIntegerField(default=600)
    ending_notified_for = models.DateTimeField(null=True, blank=True, editable=False)
    driver = models.CharField(max_length=16, default="sim")
    spec = models.JSONField(
        default=dict, blank=True, help_text="driver spec: command, env, cwd, stop_grace_s"
    )
    # The request's Idempotency-Key header, once per submitter, and a digest of its body: a retry of a request
    # whose answer was lost (a client timeout, a server killed mid-request) is answered with this lease's
    # decision instead of making a second lease (docs/plan-applier.md).
    idempotency_key = models.CharField(max_length=255, blank=True, default="", editable=False)
    request_digest = models.CharField(max_length=64, blank=True, default="", editable=False)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state"], name="lease_state_idx"),
            # The calibration's read: the latest leases that started after a queue forecast's estimate.
            models.Index(
                fields=["-first_start"],
                condition=Q(first_estimate__isnull=False),
                name="lease_estimated_started_idx",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["submitted_by", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="lease_idempotency_key_once",
            ),
            models.CheckConstraint(condition=Q(duration_s__gt=0), name="lease_duration_positive"),
            models.CheckConstraint(
                condition=~Q(type="advance_reservation") | Q(requested_start__isnull=False),
                name="lease_ar_has_start",
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.pk} {self.name}"

    @property
    def badge(self) -> str:
        return LEASE_BADGES[LeaseState(self.state)]


class Reservation(models.Model):
    """One row of the slot table: a lease's use of some nodes over [start, end)."""

    rid = models.PositiveBigIntegerField(unique=True)
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="reservations")
    kind = models.CharField(max_length=16, choices=ReservationKind.choices)
    start = models.DateTimeField(db_index=True)
    end = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=16, choices=ReservationStatus.choices)  # Meta.indexes
    # vnode -> node id; for a migration, `sources` holds where the memory images leave from.
    nodes = models.JSONField()
    sources = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["start", "rid"]
        indexes = [models.Index(fields=["status"], name="reservation_status_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(end__gte=F("start")), name="reservation_end_after_start")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.start:%H:%M:%S}–{self.end:%H:%M:%S} of lease {self.lease_id}"


class Allocation(models.Model):
    """What one reservation uses on one node. Denormalised times and liveness let one SQL query check that no node
    is overcommitted at any instant (the invariant the concurrency tests assert)."""

    # Neither key has an index of its own: alloc_one_row_per_node leads with the reservation and
    # alloc_node_window_idx with the node, and each serves those lookups (and the cascades) as well.
    reservation = models.ForeignKey(
        Reservation, on_delete=models.CASCADE, related_name="allocations", db_index=False
    )
    node = models.ForeignKey(
        "fleet.Node", on_delete=models.CASCADE, related_name="allocations", db_index=False
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    live = models.BooleanField(default=True)
    cpu = models.PositiveIntegerField(help_text="percent of one core (100 = 1 core)")
    mem_mib = models.PositiveIntegerField()
    disk_gib = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["node", "live", "start", "end"], name="alloc_node_window_idx")]
        constraints = [models.UniqueConstraint(fields=["reservation", "node"], name="alloc_one_row_per_node")]

    def __str__(self) -> str:
        return f"{self.node_id}: {self.mem_mib} MiB for reservation {self.reservation_id}"


class LeaseEvent(models.Model):
    """The lease's state history: every transition, with when and why."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    from_state = models.CharField(max_length=24)
    to_state = models.CharField(max_length=24)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"lease {self.lease_id}: {self.from_state} → {self.to_state}"


class SchedulerState(models.Model):
    """One row: the version of the planned world. Every commit of the plan applier bumps it, so a process can tell
    whether the scheduler it holds in memory is still the database's (and reload it when another process wrote)."""

    version = models.PositiveBigIntegerField(default=0)
    next_rid = models.PositiveBigIntegerField(default=1)
    # The last periodic tick, whichever process ran it: /metrics reports its age and duration, so a stopped beat
    # or a tick that has grown slow shows on every web process, not only in the worker that ran it.
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_tick_s = models.FloatField(default=0)
    # Ticks that failed in a row (0 once one passes), when the last one failed and why: /readyz and /metrics show
    # them, and the first failure raises an alert, so a scheduler that stopped scheduling is seen at once.
    tick_failures = models.PositiveIntegerField(default=0)
    tick_failed_at = models.DateTimeField(null=True, blank=True)
    tick_error = models.TextField(blank=True)
    # The queue forecast: when the estimates on the leases were last written (the plan's time they describe),
    # what the last forecast taken was computed from (the queue, the unusable nodes and the fleet's shape, hashed),
    # whether a planning pass changed what it reads since, and the plan version it was taken at: a forecast
    # computed outside the plan lock is written only while that version and "not stale" still hold
    # (leases/forecasting.py).
    forecast_at = models.DateTimeField(null=True, blank=True)
    forecast_signature = models.CharField(max_length=64, blank=True, default="")
    forecast_stale = models.BooleanField(default=True)
    forecast_version = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"scheduler state v{self.version}"


class PlanVersion(models.Model):
    """What one version of the planned world touched: the ids of the leases whose rows its pass wrote. A process
    whose cached scheduler is a few versions behind re-reads only these leases (leases/planning/restore.py,
    `catch_up`) instead of every live lease; rows older than the newest PLAN_VERSIONS_KEPT are pruned, and a
    process further behind reloads."""

    version = models.PositiveBigIntegerField(primary_key=True)
    leases = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"plan version {self.version}"


INSTANCE_STATE_CHOICES = [(s.value, s.value) for s in InstanceState]


class Instance(models.Model):
    """One vnode of a lease placed on one node. `generation` rises with every restart and every reschedule, so the
    agent can tell a fresh start from the instance it already ran (it never runs the same generation twice)."""

    iid = models.CharField(max_length=64)  # unique: Meta.constraints
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="instances")
    vnode = models.PositiveIntegerField()
    generation = models.PositiveIntegerField(default=0)
    # Its lookups use instance_node_state_idx, which leads with it.
    node = models.ForeignKey(
        "fleet.Node", null=True, on_delete=models.SET_NULL, related_name="instances", db_index=False
    )
    state = models.CharField(max_length=16, choices=INSTANCE_STATE_CHOICES)  # Meta.indexes
    desired_state = models.CharField(max_length=16, default="running")
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    restart_not_before = models.DateTimeField(null=True, blank=True)
    last_exit_code = models.IntegerField(null=True, blank=True)
    log_tail = models.JSONField(default=list, blank=True)
    detail = models.TextField(blank=True)
    # Set when this instance was created by a reschedule: the one it replaced.
    replaces = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replaced_by"
    )

    class Meta:
        ordering = ["lease_id", "vnode", "-generation"]
        indexes = [
            models.Index(fields=["node", "state"], name="instance_node_state_idx"),
            models.Index(fields=["state"], name="instance_state_idx"),
        ]
        constraints = [models.UniqueConstraint(fields=["iid"], name="instance_iid_unique")]

    def __str__(self) -> str:
        return self.iid

    @property
    def badge(self) -> str:
        return INSTANCE_BADGES[InstanceState(self.state)]


class InstanceEvent(models.Model):
    """An instance's state history."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.instance_id}: {self.from_state} → {self.to_state}"


class GroupPolicy(models.TextChoices):
    AFFINITY = "affinity", "affinity"
    ANTI_AFFINITY = "anti_affinity", "anti-affinity"


class Group(models.Model):
    """An affinity or anti-affinity set of leases: the rule applies to the instances of every member lease."""

    name = models.SlugField(max_length=100, unique=True)
    policy = models.CharField(max_length=16, choices=GroupPolicy.choices)
    hard = models.BooleanField(default=True)
    max_per_node = models.PositiveIntegerField(
        default=1, help_text="anti-affinity: members allowed on one node"
    )
    leases = models.ManyToManyField(Lease, related_name="groups", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(max_per_node__gte=1), name="group_max_per_node_positive")
        ]

    def __str__(self) -> str:
        return self.name


class Alert(models.Model):
    """Something an operator should look at: a held instance, a failed placement, a stale node."""

    kind = models.CharField(max_length=32, db_index=True)
    message = models.TextField()
    created_at = models.DateTimeField(db_index=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # Raised again for the same kind and subject while open: counted here, not a row each (leases/alerts.py).
    count = models.PositiveIntegerField(default=1)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # Why it was resolved: by whom, or the system's "node n1 was re-admitted".
    resolution = models.TextField(blank=True)
    lease = models.ForeignKey(Lease, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    instance = models.ForeignKey(
        Instance, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts"
    )
    node = models.ForeignKey(
        "fleet.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="alerts"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        # What the audit feed names as an action's target: the kind in words, not its code and a message cut at
        # 60 characters mid-word ("node_dead: node batch-01 is dead (demo: power supply failed (the demo r").
        return f"alert {self.pk}: {words(self.kind)}"
