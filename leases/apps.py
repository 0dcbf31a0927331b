from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"

    def ready(self):
        from fleet.placement import register_claim_provider
        from leases import actions
        from slotkeeper import metrics, periodic

        register_claim_provider(actions.claims)
        periodic.register("leases.tick", actions.tick)
        metrics.register_gauges(lease_gauges)


def lease_gauges():
    from django.db.models import Count

    from leases.models import Lease, Reservation

    rows = [
        ("slotkeeper_leases", {"state": r["state"]}, r["n"])
        for r in Lease.objects.values("state").annotate(n=Count("id"))
    ]
    rows += [
        ("slotkeeper_reservations", {"status": r["status"]}, r["n"])
        for r in Reservation.objects.values("status").annotate(n=Count("id"))
    ]
    return rows
