from django.apps import AppConfig


class DurableConfig(AppConfig):
    name = "durable"
    verbose_name = "Durable jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        # Built-in operations register themselves on import; so do those in
        # every installed app's ``operations`` module, as the admin does.
        from .builtin import backup, dbcopy, files, integrity, noop, restore, retention  # noqa: F401
        from .mail import operations as _mail  # noqa: F401
        from .notify import connect_receivers
        from .webhooks import operations as _webhooks  # noqa: F401

        autodiscover_modules("operations")
        connect_receivers()

        from .turns import install

        # SQLite: writers take turns for the write lock (durable.turns).
        connection_created.connect(install, dispatch_uid="durable.turns")

        from .schedules import ticking
        from .tasks import operation as _tasks  # noqa: F401 - django.task: runworker runs tasks

        ticking.connect()  # every worker ticks the schedules (durable.schedules)
