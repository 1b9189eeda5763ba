from django.apps import AppConfig
from django.db.models.signals import post_migrate


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Problems → Recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The engine announces; this app listens (durable never imports recovery).
        from . import receivers, schedules
        from .dashboard import indexing

        receivers.connect()
        schedules.connect()
        indexing.connect()
        # The standing schedules (ingest, retention) exist as soon as the tables do.
        post_migrate.connect(
            schedules.on_post_migrate, sender=self, dispatch_uid="recovery.schedules.post_migrate"
        )
