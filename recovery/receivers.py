"""What ``recovery`` does when the engine announces something (``durable.signals``).

The engine never imports this app; ``RecoveryConfig.ready()`` connects these.
Every receiver is best-effort: the signals are sent with ``send_robust`` after
the engine's own transaction committed, and the record functions swallow
their own errors, so nothing here can undo or block the engine. One
exception: ``recovery_event`` from an outbox (``durable.builtin.announce``,
``must_record=True``) arrives *inside* the transaction that marks the event
sent, and ``on_recovery_event`` then raises a failed write, so the marker
never commits without its Recovery event.

A worker that starts looks at ``recovery-events.jsonl`` at once and enqueues
an ingest if the file changed since the last one. After that the
``recovery-ingest`` schedule (``recovery.schedules``) looks every
``RECOVERY_INGEST_INTERVAL`` seconds, once for all workers. Both go through
``enqueue_ingest``; the operation's ``unique_key`` keeps it to one unfinished
ingest per file however many ask.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.dispatch import Signal

from durable import signals
from durable.errors import DurableError
from durable.jobs import enqueue
from durable.models import Job

from .models import EventType, IngestPath
from .parsing import MAX_DETAIL_BYTES
from .policy import events_file_path, signature
from .records import record_event, record_security
from .tailer import canonical

log = logging.getLogger("recovery.receivers")

INGEST_OPERATION = "recovery.ingest"


# --- the ingest ---------------------------------------------------------------------------


def configured_events_file() -> str | None:
    """``RECOVERY_EVENTS_FILE``, else the WeKan data directory variables (see
    docs/how-to/feed-recovery-events.md).

    Relative to the project directory (``BASE_DIR``), symlinks resolved: every
    process names the file the same way, wherever it was started.
    """
    path = events_file_path(
        getattr(settings, "RECOVERY_EVENTS_FILE", ""), os.environ, base=str(settings.BASE_DIR)
    )
    return canonical(path) if path is not None else None


def enqueue_ingest(path: str, *, owner: str = "worker") -> Job:
    """Ask for an ingest of ``path``; returns the unfinished one if there is one already.

    The single place the site enqueues it: the worker-start look, the schedule
    and the command all call this. (The operation's ``unique_key`` — the path
    with its symlinks resolved — keeps it to one unfinished ingest per name.)
    """
    return enqueue(INGEST_OPERATION, {"path": path}, owner=owner)


def file_changed(path: str) -> bool:
    """True if ``path`` exists and differs from what the last ingest saw (a stat and a query)."""
    path = canonical(path)
    try:
        info = os.stat(path)
    except OSError:
        return False
    now = signature(f"{info.st_dev}:{info.st_ino}", info.st_size, info.st_mtime_ns)
    seen = IngestPath.objects.filter(path=path).values_list("seen", flat=True).first()
    return seen != now


def ingest_if_changed(owner: str) -> Job | None:
    """The automatic ingest: quietly nothing when no file is configured or it is unchanged."""
    path = configured_events_file()
    if path is None or not file_changed(path):
        return None
    try:
        job = enqueue_ingest(path, owner=owner)
    except DurableError:
        log.exception("could not enqueue the recovery-events ingest", extra={"path": path})
        return None
    if getattr(job, "created", True):  # set by enqueue(), not a column
        log.info("recovery-events ingest enqueued", extra={"job": job.pk, "path": path})
    return job


def on_worker_started(sender: Any, *, worker_id: str = "", **kwargs: Any) -> None:
    ingest_if_changed(owner=f"worker {worker_id}"[:150])


# --- what the engine reports ----------------------------------------------------------------


def _iso(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if isinstance(moment, datetime) else "—"


def on_job_reclaimed(
    sender: Any,
    *,
    job_id: int,
    operation: str = "",
    previous_owner: str = "",
    policy: str = "",
    outcome: str = "",
    old_state: str = "",
    new_state: str = "",
    checkpoint: Any = None,
    attempt: int | None = None,
    next_attempt_at: datetime | None = None,
    reason: str = "",
    attempt_spent: bool | None = None,
    units_committed: int | None = None,
    **kwargs: Any,
) -> None:
    detail = (
        f"Job {job_id} ({operation}) was taken back from worker {previous_owner or '?'}, "
        f"which stopped while running it. on_restart={policy}: {old_state} → {new_state}; "
        f"attempt {attempt}; checkpoint {checkpoint!r}."
    )
    if attempt_spent is False:
        detail += f" It had committed {units_committed} unit(s) since its claim: no attempt spent."
    record_event(
        EventType.JOB_RECLAIMED,
        severity="warning",
        source="worker",
        detail=detail[:MAX_DETAIL_BYTES],
        done=True,
        job_id=job_id,
        operation=operation,
        checkpoint=checkpoint,
        attempt=attempt,
        next_retry_at=next_attempt_at,
        reason=reason,
        reclaimed=True,
    )


def on_job_needs_attention(
    sender: Any,
    *,
    job_id: int,
    operation: str = "",
    state: str = "",
    cause: str = "",
    reason: str = "",
    checkpoint: Any = None,
    attempt: int | None = None,
    next_attempt_at: datetime | None = None,
    next_retry_at: datetime | None = None,
    **kwargs: Any,
) -> None:
    """A job that stopped for a person; when it will be retried by itself, if it will.

    The engine names that moment ``next_attempt_at`` (``job_reclaimed`` too);
    ``next_retry_at`` is accepted as well, so a sender using the column's name
    is not silently dropped into ``**kwargs``.
    """
    next_attempt_at = next_attempt_at or next_retry_at
    failed = state == "failed"
    detail = (
        f"Job {job_id} ({operation}) is {state} ({cause}) after attempt {attempt}, "
        f"at checkpoint {checkpoint!r}; next retry {_iso(next_attempt_at)}. {reason}"
    )
    record_event(
        EventType.JOB_FAILED if failed else EventType.JOB_PAUSED,
        severity="error" if failed else "warning",
        source="worker",
        detail=detail[:MAX_DETAIL_BYTES],
        done=False,
        job_id=job_id,
        operation=operation,
        checkpoint=checkpoint,
        attempt=attempt,
        next_retry_at=next_attempt_at,
        reason=reason,
        reclaimed=cause == "server_restarted",
    )


def on_security_refusal(
    sender: Any,
    *,
    category: str = "",
    key: str = "",
    detail: str = "",
    severity: str = "warning",
    cwe: str | int = "",
    source: str = "",
    user_id: str | int = "",
    username: str = "",
    ip: str | None = None,
    **kwargs: Any,
) -> None:
    record_security(
        category=category,
        key=key,
        detail=detail,
        severity=severity,
        cwe=cwe,
        source=source,
        user_id=user_id,
        username=username,
        ip=ip,
        stream=kwargs.get("stream") or "security",
    )


_EVENT_ARGUMENTS = frozenset(
    {
        "severity",
        "detail",
        "db",
        "source",
        "done",
        "deleted_data",
        "user_id",
        "username",
        "ip",
        "ipv4",
        "ipv6",
        "object_ids",
        "object_titles",
        "ts",
        "job_id",
        "operation",
        "checkpoint",
        "attempt",
        "next_retry_at",
        "reason",
    }
)


def on_recovery_event(
    sender: Any, *, type: str = "", must_record: bool = False, **kwargs: Any
) -> None:
    """An operation's report (e.g. ``backup-created``); unknown arguments are ignored.

    ``must_record``: the sender is an outbox whose marker commits with this row, so
    a failed write must fail its transaction rather than be logged and lost.
    """
    arguments = {name: value for name, value in kwargs.items() if name in _EVENT_ARGUMENTS}
    arguments.setdefault("source", "worker")
    record_event(type, raise_errors=must_record, **arguments)


def connect() -> None:
    """Called once from ``RecoveryConfig.ready()``; ``dispatch_uid`` makes repeats harmless."""
    pairs: list[tuple[Signal, Callable[..., None]]] = [
        (signals.job_reclaimed, on_job_reclaimed),
        (signals.job_needs_attention, on_job_needs_attention),
        (signals.security_refusal, on_security_refusal),
        (signals.recovery_event, on_recovery_event),
        (signals.worker_started, on_worker_started),
    ]
    for signal, receiver in pairs:
        signal.connect(receiver, dispatch_uid=f"recovery.{receiver.__name__}")
