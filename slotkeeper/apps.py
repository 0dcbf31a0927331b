from django.apps import AppConfig


class SlotkeeperConfig(AppConfig):
    name = "slotkeeper"
    verbose_name = "Slotkeeper"
