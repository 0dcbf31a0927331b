from django.apps import AppConfig


class SlotkeeperConfig(AppConfig):
    name = "slotkeeper"
    verbose_name = "Slotkeeper"

    def ready(self):
        from slotkeeper import preferences

        preferences.connect()  # the session takes the account's console preferences at sign-in
        from slotkeeper import collector, metrics, schema  # noqa: F401 (schema registers the OpenAPI extension)

        # This process's own running figures, written to its metrics files at each scrape of it and every few
        # seconds as it serves (slotkeeper/metrics.py, `sample`).
        metrics.register_process_source(metrics.pool_gauges)
        collector.watch()
        metrics.register_process_source(collector.gauges)
