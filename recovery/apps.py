from types import ModuleType

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate

from durable.conf import apply_defaults

from . import conf


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Problems → Recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: ModuleType | None) -> None:
        super().__init__(app_name, app_module)
        apply_defaults(settings, conf.DEFAULTS)  # recovery.conf: before any module loads

    def ready(self) -> None:
        # The engine announces; this app listens (durable never imports recovery).
        from . import (
            checks,  # noqa: F401 - registers the checks of what a site must add
            receivers,
            schedules,
        )
        from .dashboard import indexing

        receivers.connect()
        schedules.connect()
        indexing.connect()
        # Backup, restore and db.copy rebuild the counts and the search index instead
        # of moving them, and take the events the engine appends meanwhile in stride.
        from durable.builtin.derived import register_derived, register_journal

        from .dashboard import sql

        register_derived(
            "recovery.dashboard",
            tables=sql.DERIVED_MODELS,
            sources=sql.SOURCE_MODELS,
            rebuild=sql.rebuild,
        )
        # The hourly throughput rollup is job history counted from the engine's tables,
        # which these operations never move: not moved either, counted again lazily.
        from .dashboard import rollup

        register_derived(
            "recovery.throughput",
            tables=rollup.DERIVED_MODELS,
            sources=rollup.SOURCE_MODELS,
            rebuild=rollup.forget,
        )
        register_journal("recovery.recoveryevent")
        from durable.metrics import register_collector

        from .metrics import RecoveryCollector

        register_collector("recovery", RecoveryCollector)
        # The standing schedules (ingest, retention) exist as soon as the tables do.
        post_migrate.connect(
            schedules.on_post_migrate, sender=self, dispatch_uid="recovery.schedules.post_migrate"
        )
