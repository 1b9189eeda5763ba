"""Every setting ``durable`` reads, with its default, applied once when the app loads.

A site sets only what it changes. ``DurableConfig`` copies each default below onto
``django.conf.settings`` for every name the site's settings module does not define,
before any model or view module is imported. Code then reads ``settings.DURABLE_…``
as it reads any Django setting: one attribute lookup, no accessor, no fallback at the
point of use (django-appconf works the same way). The table is the one place these
defaults are written; docs/reference/settings.md lists it and a test compares them.

A piece the apps cannot do without and cannot guess is a system check error that
says what to add (``durable.checks``), never an ``AttributeError`` at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# name -> default. A site that builds its settings from the environment (this
# repository's recovery/settings.py) uses the same values when a variable is unset.
DEFAULTS: dict[str, Any] = {
    # Workers (runworker's option defaults).
    "DURABLE_LEASE_SECONDS": 30.0,
    "DURABLE_POLL_INTERVAL": 1.0,
    "DURABLE_GRACE_SECONDS": 25.0,
    "DURABLE_SQLITE_WAKE_INTERVAL": 0.01,
    # PostgreSQL: a libpq URL for the wake-up listener's own connection, bypassing a
    # pooler in transaction mode; "": the default database's (docs: run-workers.md).
    "DURABLE_LISTEN_URL": "",
    # Seconds of work a batching operation aims each unit at (durable.pacing).
    "DURABLE_UNIT_TARGET_SECONDS": 0.4,
    # Jobs.
    "DURABLE_MAX_INPUT_BYTES": 64 * 1024,
    "DURABLE_TRACING": True,
    "DURABLE_RETENTION": "30d",
    "DURABLE_RETENTION_CRON": "30 3 * * *",
    # The HTTP API (durable.api).
    "DURABLE_API_MAX_BODY_BYTES": 256 * 1024,
    "DURABLE_API_STREAM_SECONDS": 25.0,
    "DURABLE_API_MAX_STREAMS": 4,
    "DURABLE_API_STREAM_POLL_SECONDS": 1.0,
    "DURABLE_API_STREAM_KEEPALIVE_SECONDS": 10.0,
    "DURABLE_API_OPERATIONS": None,  # every operation its access rule allows
    "TRUSTED_PROXY_COUNT": 0,  # X-Forwarded-For is not believed
    # External services: outbound HTTP, credentials, notifications, mail.
    "DURABLE_HTTP_PROVIDERS": {},
    "DURABLE_HTTP_ALLOW_HOSTS": [],
    "DURABLE_CREDENTIALS": {},
    "DURABLE_CREDENTIAL_RESOLVERS": [
        "durable.credentials.from_settings",
        "durable.credentials.from_environment",
        "durable.credentials.from_database",
    ],
    "DURABLE_CREDENTIAL_KEY": "",
    "DURABLE_NOTIFY_ENGINE_EVENTS": True,
    "DURABLE_MAIL_FROM": "",  # "": DEFAULT_FROM_EMAIL
    "DURABLE_MAIL_PASSWORD_REF": "",
    "DURABLE_MAIL_SUBJECT_PREFIX": "durable",
    # Built-in operations. The backup directory depends on the site: see DERIVED.
    "DURABLE_RESTORE_KEEP_APPS": ["recovery"],  # the Recovery history, if installed
}


def _backup_dir(settings: Any) -> Path | None:
    base = getattr(settings, "BASE_DIR", None)
    return Path(base) / "var" / "backups" if base is not None else None


# Defaults computed from the site's own settings: name -> function(settings).
DERIVED: dict[str, Callable[[Any], Any]] = {
    "DURABLE_BACKUP_DIR": _backup_dir,  # BASE_DIR/var/backups
}


def apply_defaults(
    target: Any,
    defaults: Mapping[str, Any],
    derived: Mapping[str, Callable[[Any], Any]] | None = None,
) -> list[str]:
    """Set each default ``target`` (the settings) lacks; returns the names set.

    Mutable defaults are copied, so no site shares (or changes) the table's own.
    """
    applied = []
    for name, value in defaults.items():
        if not hasattr(target, name):
            setattr(target, name, _copy(value))
            applied.append(name)
    for name, compute in (derived or {}).items():
        if not hasattr(target, name):
            setattr(target, name, compute(target))
            applied.append(name)
    return applied


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value
