from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "leases.instances"
    label = "instances"
    verbose_name = "Instances"

    def ready(self):
        # Imported here, as in every AppConfig.ready: at module level the app registry is not ready yet.
        from leases.instances.actions import periodic
        from slotkeeper import metrics
        from slotkeeper import periodic as steps

        # The whole periodic work is composed here, the highest layer that knows every part of it: the sweep
        # (fleet's, then the loss of what ran on the nodes it found dead) and the tick (the lease core's, then
        # restarts and drains).
        steps.register("fleet.sweep", periodic.sweep)
        steps.register("leases.tick", periodic.tick)
        metrics.register_gauges(periodic.reschedule_gauges)
