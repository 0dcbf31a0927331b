from django.apps import AppConfig


class SlotkeeperConfig(AppConfig):
    name = "slotkeeper"
    verbose_name = "Slotkeeper"

    def ready(self):
        from slotkeeper import preferences

        preferences.connect()  # the session takes the account's console preferences at sign-in
        from slotkeeper import collector, metrics, schema  # noqa: F401 (schema registers the OpenAPI extension)

        metrics.register_gauges(metrics.pool_gauges)
        collector.watch()
        metrics.register_gauges(collector.gauges)
