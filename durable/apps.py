from types import ModuleType

from django.apps import AppConfig
from django.conf import settings

from . import conf


class DurableConfig(AppConfig):
    name = "durable"
    verbose_name = "Durable jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: ModuleType | None) -> None:
        super().__init__(app_name, app_module)
        # Every setting the engine reads gets its default (durable.conf) before any of
        # its modules is imported, so they read settings.DURABLE_... plainly.
        conf.apply_defaults(settings, conf.DEFAULTS, conf.DERIVED)

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        # Built-in operations register themselves on import; so do those in
        # every installed app's ``operations`` module, as the admin does.
        from . import checks  # noqa: F401 - registers the settings checks
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
