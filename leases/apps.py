from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"

    def ready(self):
        from fleet.assignments import register_assignment_provider
        from fleet.placement import register_claim_provider
        from fleet.signals import instances_reported, node_draining, nodes_died
        from leases import actions, recovery
        from slotkeeper import metrics, ops, periodic

        register_claim_provider(actions.claims)
        register_assignment_provider(recovery.assignments)
        nodes_died.connect(_on_nodes_died, dispatch_uid="leases.nodes_died")
        instances_reported.connect(_on_reports, dispatch_uid="leases.instances_reported")
        node_draining.connect(_on_draining, dispatch_uid="leases.node_draining")
        periodic.register("leases.tick", actions.tick)
        metrics.register_gauges(lease_gauges)
        ops.register_check("scheduler", actions.scheduler_health)


def _on_nodes_died(sender, node_ids, now, reason="", **kwargs):
    from leases.recovery import on_nodes_died

    on_nodes_died(node_ids, now, reason)


def _on_draining(sender, node, now, **kwargs):
    from leases.recovery import on_node_draining

    on_node_draining(node, now)


def _on_reports(sender, node, reports, now, **kwargs):
    from leases.recovery import ingest_reports

    ingest_reports(node, reports, now)


def lease_gauges():
    from django.db.models import Count
    from django.utils import timezone

    from leases.models import Lease, Reschedule, Reservation, SchedulerState

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
    rows += [
        ("slotkeeper_reschedules", {"status": r["status"]}, r["n"])
        for r in Reschedule.objects.values("status").annotate(n=Count("id"))
    ]
    state = SchedulerState.objects.filter(pk=1).first()
    if state is not None and state.last_tick_at is not None:
        rows.append(
            ("slotkeeper_last_tick_age_seconds", {}, (timezone.now() - state.last_tick_at).total_seconds())
        )
        rows.append(("slotkeeper_last_tick_duration_seconds", {}, state.last_tick_s))
    if state is not None:
        rows.append(("slotkeeper_tick_failures_in_a_row", {}, state.tick_failures))
    return rows
