from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Problems → Recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The engine announces; this app listens (durable never imports recovery).
        from . import receivers

        receivers.connect()
