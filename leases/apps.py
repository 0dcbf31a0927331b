from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"

    def ready(self):
        # Imported here, as in every AppConfig.ready: at module level the app registry is not ready yet.
        from leases import reads
        from slotkeeper import metrics, ops

        metrics.register_gauges(lease_gauges)
        ops.register_check("scheduler", reads.scheduler_health)


def lease_gauges():
    # Imported here: gauges are read long after start-up, and models cannot be imported before the app registry.
    from django.db.models import Count
    from django.utils import timezone

    from leases.models import Lease, Reservation, SchedulerState

    rows = [
        ("slotkeeper_leases", {"state": r["state"]}, r["n"])
        for r in Lease.objects.values("state").annotate(n=Count("id"))
    ]
    rows += [
        ("slotkeeper_reservations", {"status": r["status"]}, r["n"])
        for r in Reservation.objects.values("status").annotate(n=Count("id"))
    ]
    queued = sum(n for name, labels, n in rows if name == "slotkeeper_leases" and "queued" in labels["state"])
    rows.append(("slotkeeper_queue_length", {}, queued))
    state = SchedulerState.objects.filter(pk=1).first()
    if state is not None and state.last_tick_at is not None:
        rows.append(
            ("slotkeeper_last_tick_age_seconds", {}, (timezone.now() - state.last_tick_at).total_seconds())
        )
        rows.append(("slotkeeper_last_tick_duration_seconds", {}, state.last_tick_s))
    if state is not None:
        rows.append(("slotkeeper_tick_failures_in_a_row", {}, state.tick_failures))
    # The plan queue (group commit): requests stored and waiting for a pass, fleet-wide; this process's last
    # pass (how many requests it planned, how long it took) and its largest batch. Totals are counters:
    # slotkeeper_plan_passes_total, slotkeeper_plan_pass_seconds_total, slotkeeper_plan_batched_requests_total.
    from leases.lifecycle import LeaseState
    from leases.planning import passes

    waiting = next((n for name, labels, n in rows if labels.get("state") == LeaseState.NEW), 0)
    rows.append(("slotkeeper_plan_queue_depth", {}, waiting))
    rows.append(("slotkeeper_plan_batch_size_last", {}, passes.pass_stats.last_batch))
    rows.append(("slotkeeper_plan_batch_size_max", {}, passes.pass_stats.max_batch))
    rows.append(("slotkeeper_plan_pass_seconds_last", {}, passes.pass_stats.last_seconds))
    return rows
