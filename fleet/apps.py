from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"

    def ready(self):
        # Imported here, as in every AppConfig.ready: at module level the app registry is not ready yet.
        from slotkeeper import metrics

        # The sweep is not registered here: it is composed with node loss one layer up (leases/instances/apps.py).
        metrics.register_gauges(node_gauges)
        from django.db.models.signals import post_delete, post_save

        from fleet import live_shapes
        from fleet.models import Node

        # A node written by this process is seen by the next lease request's size check here at once.
        post_save.connect(live_shapes.forget, sender=Node, dispatch_uid="fleet.live_shapes.saved")
        post_delete.connect(live_shapes.forget, sender=Node, dispatch_uid="fleet.live_shapes.deleted")


def node_gauges():
    # Imported here: models cannot be imported before the app registry is ready.
    from django.db.models import Count

    from fleet.models import Node, NodeStatus

    counts = dict.fromkeys(NodeStatus.values, 0)
    for row in Node.objects.values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return [("slotkeeper_nodes", {"status": k}, v) for k, v in counts.items()]
