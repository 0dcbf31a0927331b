from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "leases.instances"
    label = "instances"
    verbose_name = "Instances"

    def ready(self):
        # Imported here, as in every AppConfig.ready: at module level the app registry is not ready yet.
        from leases.instances.actions import periodic
        from slotkeeper import metrics

        metrics.register_gauges(periodic.reschedule_gauges)
