from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"

    def ready(self):
        from fleet import actions
        from slotkeeper import metrics, periodic

        periodic.register("fleet.sweep", actions.sweep)
        metrics.register_gauges(node_gauges)


def node_gauges():
    from django.db.models import Count

    from fleet.models import Node, NodeStatus

    counts = dict.fromkeys(NodeStatus.values, 0)
    for row in Node.objects.values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return [("slotkeeper_nodes", {"status": k}, v) for k, v in counts.items()]
