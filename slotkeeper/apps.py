from django.apps import AppConfig


class SlotkeeperConfig(AppConfig):
    name = "slotkeeper"
    verbose_name = "Slotkeeper"

    def ready(self):
        from slotkeeper import metrics, schema  # noqa: F401 (schema registers the OpenAPI extension)

        metrics.register_gauges(metrics.pool_gauges)
