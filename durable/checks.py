"""System checks: what ``durable`` needs from a site and cannot default, said at deploy time.

Every setting has a default (``durable.conf``); these are the few pieces that do not,
each reported with what to add to the settings instead of failing later with an
``AttributeError`` or a 500. Pure functions of the settings, so they are unit-tested
without a database.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

from django.core import checks

from .pacing import MAX_TARGET_SECONDS, MIN_TARGET_SECONDS

BACKEND = "durable.tasks.DurableBackend"
BACKPORT_HINT = (
    'On Django 5.2 install the django-tasks backport: pip install "restart-safe[django52]" '
    "(Django 6 has django.tasks built in)."
)


def tasks_framework_installed() -> bool:
    """Django 6's ``django.tasks``, or the ``django-tasks`` backport on Django 5.2."""
    return any(importlib.util.find_spec(name) for name in ("django.tasks", "django_tasks"))


def settings_problems(settings: Any, *, tasks_framework: bool) -> list[checks.CheckMessage]:
    """Pure: the checks' findings for these settings."""
    found: list[checks.CheckMessage] = []
    if getattr(settings, "DURABLE_BACKUP_DIR", None) is None:
        found.append(
            checks.Error(
                "DURABLE_BACKUP_DIR is not set, and without BASE_DIR it has no default "
                "(BASE_DIR/var/backups).",
                hint="Add DURABLE_BACKUP_DIR = '/path/to/backups' (a directory the workers "
                "may write) to your settings, or BASE_DIR.",
                id="durable.E001",
            )
        )
    backends: Mapping[str, Any] = getattr(settings, "TASKS", None) or {}
    uses_durable = any(
        isinstance(config, Mapping) and config.get("BACKEND") == BACKEND
        for config in backends.values()
    )
    if uses_durable and not tasks_framework:
        found.append(
            checks.Error(
                f"TASKS names {BACKEND}, but Django's Tasks framework is not installed.",
                hint=BACKPORT_HINT,
                id="durable.E002",
            )
        )
    found.extend(pooler_problems(settings))
    found += _unit_target_problems(settings)
    return found


def pooler_problems(settings: Any) -> list[checks.CheckMessage]:
    """``DURABLE_LISTEN_URL`` says the default database is behind a pooler in transaction
    mode: then Django must not use server-side cursors either (``.iterator()`` declares
    one ``WITH HOLD`` and fetches it in later statements, which the pooler may send to
    another server connection, where it does not exist)."""
    if not getattr(settings, "DURABLE_LISTEN_URL", ""):
        return []
    default = (getattr(settings, "DATABASES", None) or {}).get("default") or {}
    if not str(default.get("ENGINE", "")).endswith("postgresql"):
        return []
    if default.get("DISABLE_SERVER_SIDE_CURSORS"):
        return []
    return [
        checks.Warning(
            "DURABLE_LISTEN_URL is set, so the default database goes through a pooler in "
            "transaction mode, but DATABASES['default'] still lets Django use server-side "
            "cursors, which such a pooler cannot keep between statements.",
            hint="Add 'DISABLE_SERVER_SIDE_CURSORS': True to DATABASES['default'].",
            id="durable.W001",
        )
    ]


def _unit_target_problems(settings: Any) -> list[checks.CheckMessage]:
    value = getattr(settings, "DURABLE_UNIT_TARGET_SECONDS", None)
    if value is None:
        return []  # not a site's settings (a partial namespace in a test): nothing to say
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if number and MIN_TARGET_SECONDS <= value <= MAX_TARGET_SECONDS:
        return []
    return [
        checks.Error(
            f"DURABLE_UNIT_TARGET_SECONDS is {value!r}; it must be a number of seconds from "
            f"{MIN_TARGET_SECONDS} to {MAX_TARGET_SECONDS:g}.",
            hint="Each unit of a batching operation aims at this much work: shorter units "
            "commit more often (a worker that lives one second still makes progress), longer "
            "ones spend less on commits. The default is 0.4.",
            id="durable.E003",
        )
    ]


@checks.register()
def check_settings(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    from django.conf import settings

    return settings_problems(settings, tasks_framework=tasks_framework_installed())
