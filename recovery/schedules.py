"""The site's two standing schedules, kept in line with its settings.

- ``recovery-ingest`` (``recovery.ingest``): every ``RECOVERY_INGEST_INTERVAL``
  seconds, an ingest of ``recovery-events.jsonl`` — enqueued through
  ``receivers.enqueue_ingest`` and only when the file changed since the
  last ingest. No file configured, or none there yet: nothing, quietly.
- ``retention`` (``durable.purge``): daily at ``DURABLE_RETENTION_CRON``
  (03:30 in ``TIME_ZONE``), purging finished jobs older than ``DURABLE_RETENTION``.

Both are created by ``migrate`` (a ``post_migrate`` receiver) and brought in
line with the settings at every worker start; setting the interval to 0 or
the retention to ``off`` removes the schedule. ``enabled`` is left as an
operator set it (``disable_schedule``).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS

from durable import signals
from durable.errors import DurableError, InputRejected
from durable.models import Job
from durable.models.schedules import Schedule
from durable.policy import parse_duration
from durable.schedules.service import Due, ensure_schedule, register_trigger
from durable.schedules.timing import normalise_cron

from .receivers import INGEST_OPERATION, configured_events_file, enqueue_ingest, file_changed
from .tailer import canonical

log = logging.getLogger("recovery.schedules")

INGEST_SCHEDULE = "recovery-ingest"
RETENTION_SCHEDULE = "retention"
RETENTION_OPERATION = "durable.purge"
OFF = frozenset({"", "0", "off", "no", "false", "none"})


def ingest_interval() -> float:
    return float(getattr(settings, "RECOVERY_INGEST_INTERVAL", 60.0))


def retention_age() -> str | None:
    value = str(getattr(settings, "DURABLE_RETENTION", "30d")).strip()
    return None if value.lower() in OFF else value


def retention_cron() -> str:
    return str(getattr(settings, "DURABLE_RETENTION_CRON", "30 3 * * *"))


# --- the ingest's trigger ---------------------------------------------------------------------


def ingest_trigger(due: Due) -> Job | None:
    """An occurrence of the ingest schedule: an ingest only if the file changed."""
    path = due.input.get("path") or configured_events_file()
    if not path or not file_changed(path):
        return None
    job = enqueue_ingest(path, owner=due.owner)
    if getattr(job, "created", True):  # set by enqueue(), not a column
        log.info("recovery-events ingest enqueued", extra={"job": job.pk, "path": path})
    return job


def check_ingest_input(data: dict[str, Any]) -> dict[str, Any]:
    """An ingest schedule may name its file; without one it follows the settings."""
    path = data.get("path")
    if path is None:
        return {}
    if not isinstance(path, str) or not path.strip() or "\x00" in path or len(path) > 1024:
        raise InputRejected("path", "a file path of at most 1024 characters, or none")
    return {"path": canonical(path.strip())}


# --- the standing schedules ---------------------------------------------------------------------


def ensure_default_schedules() -> list[Schedule]:
    """Create, update or remove the two standing schedules from the settings; idempotent."""
    kept = []
    interval = ingest_interval()
    try:
        if interval > 0:
            every = timedelta(seconds=max(interval, 0.1))
            kept.append(ensure_schedule(INGEST_SCHEDULE, INGEST_OPERATION, every=every))
        else:
            Schedule.objects.filter(name=INGEST_SCHEDULE, managed=True).delete()
        age = retention_age()
        if age is not None:
            kept.append(
                ensure_schedule(
                    RETENTION_SCHEDULE,
                    RETENTION_OPERATION,
                    cron=retention_cron(),
                    input={"older_than": age},
                )
            )
        else:
            Schedule.objects.filter(name=RETENTION_SCHEDULE, managed=True).delete()
    except DurableError:
        # Refused settings are reported by `manage.py check` (below); never break a start.
        log.exception("could not set up the standing schedules; check the settings")
    return kept


def on_post_migrate(
    sender: Any, *, using: str = DEFAULT_DB_ALIAS, apps: Any = None, **kw: Any
) -> None:
    if using != DEFAULT_DB_ALIAS:
        return
    if apps is not None:
        try:
            apps.get_model("durable", "Schedule")
        except LookupError:  # migrated to a state before the schedules existed
            return
    ensure_default_schedules()


def on_worker_started(sender: Any, **kwargs: Any) -> None:
    ensure_default_schedules()


def connect() -> None:
    """Called once from ``RecoveryConfig.ready()``; repeats are harmless."""
    register_trigger(INGEST_OPERATION, ingest_trigger, check_input=check_ingest_input)
    signals.worker_started.connect(on_worker_started, dispatch_uid="recovery.schedules.started")


# --- `manage.py check` ----------------------------------------------------------------------------


@checks.register()
def check_schedule_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A typo in DURABLE_RETENTION(_CRON) is an error at deploy time, not a silent no-op."""
    problems: list[checks.CheckMessage] = []
    age = retention_age()
    if age is not None:
        try:
            if parse_duration(age) < timedelta(minutes=1):
                raise ValueError("it must be at least 1m")
        except ValueError as exc:
            problems.append(
                checks.Error(
                    f"DURABLE_RETENTION={age!r}: {exc}",
                    hint="Use an age such as 30d, or 'off' for no retention schedule.",
                    id="recovery.E101",
                )
            )
        try:
            normalise_cron(retention_cron())
        except ValueError as exc:
            problems.append(
                checks.Error(
                    f"DURABLE_RETENTION_CRON: {exc}",
                    hint="A 5-field cron expression in TIME_ZONE, e.g. '30 3 * * *'.",
                    id="recovery.E102",
                )
            )
    return problems
