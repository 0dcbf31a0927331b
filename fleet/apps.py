from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"

    def ready(self):
        # Imported here, as in every AppConfig.ready: at module level the app registry is not ready yet.
        from slotkeeper import metrics

        # The sweep is not registered here: it is composed with node loss one layer up (leases/instances/apps.py).
        metrics.register_gauges(node_gauges)


def node_gauges():
    # Imported here: models cannot be imported before the app registry is ready.
    from django.db.models import Count

    from fleet.models import Node, NodeStatus

    counts = dict.fromkeys(NodeStatus.values, 0)
    for row in Node.objects.values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return [("slotkeeper_nodes", {"status": k}, v) for k, v in counts.items()]
