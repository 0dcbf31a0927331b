from django.apps import AppConfig


class SlotkeeperConfig(AppConfig):
    name = "slotkeeper"
    verbose_name = "Slotkeeper"

    def ready(self):
        from slotkeeper import schema  # noqa: F401 (registers the OpenAPI extension)
