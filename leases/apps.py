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

    from leases.lifecycle import LeaseState
    from leases.models import Lease, Reservation, ReservationStatus, SchedulerState

    # Every state and status, 0 when none: a dashboard's line drops to zero instead of vanishing.
    leases = dict.fromkeys(LeaseState, 0) | dict(
        Lease.objects.values("state").annotate(n=Count("id")).values_list("state", "n")
    )
    reservations = dict.fromkeys(ReservationStatus.values, 0) | dict(
        Reservation.objects.values("status").annotate(n=Count("id")).values_list("status", "n")
    )
    rows = [("slotkeeper_leases", {"state": str(state)}, n) for state, n in leases.items()]
    rows += [("slotkeeper_reservations", {"status": str(status)}, n) for status, n in reservations.items()]
    queued = sum(n for state, n in leases.items() if "queued" in state)
    rows.append(("slotkeeper_queue_length", {}, queued))
    state = SchedulerState.objects.filter(pk=1).first()
    if state is not None and state.last_tick_at is not None:
        rows.append(
            ("slotkeeper_last_tick_age_seconds", {}, (timezone.now() - state.last_tick_at).total_seconds())
        )
        rows.append(("slotkeeper_last_tick_duration_seconds", {}, state.last_tick_s))
    if state is not None:
        rows.append(("slotkeeper_tick_failures_in_a_row", {}, state.tick_failures))
    # The plan queue (group commit): requests stored and waiting for a pass, fleet-wide. What the passes did is
    # counted and timed where they run (leases/pass_metrics.py): slotkeeper_plan_passes_total,
    # slotkeeper_plan_pass_duration_seconds, slotkeeper_plan_batch_size_last and the rest.
    rows.append(("slotkeeper_plan_queue_depth", {}, leases[LeaseState.NEW]))
    return rows
