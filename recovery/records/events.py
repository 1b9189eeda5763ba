"""Recording one Recovery event, normalised exactly like a line of the JSONL file.

Best-effort: a failed write is logged and swallowed (None), unless the caller
asks for it to be raised (an outbox recording inside its own transaction).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from durable.policy import MAX_ERROR_MESSAGE_BYTES, truncate_utf8

from ..models import RecoveryEvent
from ..parsing import LineEvent, clean_text, event_from_mapping
from ..policy import bounded_json

log = logging.getLogger("recovery.records")


def record_event(
    type: str,
    *,
    severity: str = "info",
    detail: str = "",
    db: str = "",
    source: str = "server",
    done: bool | None = None,
    deleted_data: bool = False,
    user_id: str | int | None = "",
    username: str = "",
    ip: str | None = None,
    ipv4: str | None = None,
    ipv6: str | None = None,
    object_ids: Sequence[Any] | None = None,
    object_titles: Sequence[Any] | None = None,
    ts: datetime | str | None = None,
    job_id: int | None = None,
    operation: str = "",
    checkpoint: Any = None,
    attempt: int | None = None,
    next_retry_at: datetime | None = None,
    reason: str = "",
    reclaimed: bool = False,
    raise_errors: bool = False,
) -> RecoveryEvent | None:
    """Record one Recovery event; normalised exactly like a line of the JSONL file.

    Returns the row, or None if ``type`` is empty or the write failed (logged).
    With ``raise_errors`` (an outbox recording inside its own transaction) a failed
    write is raised instead, so the caller's transaction cannot commit without it.
    """
    try:
        fields = {
            "type": type,
            "severity": severity,
            "detail": detail,
            "db": db,
            "source": source,
            "done": done,
            "deleted_data": deleted_data,
            "user_id": user_id,
            "username": username,
            "ipv4": ipv4,
            "ipv6": ipv6,
            "ip": ip,
            "object_ids": list(object_ids) if object_ids is not None else None,
            "object_titles": list(object_titles) if object_titles is not None else None,
            "ts": ts.isoformat() if isinstance(ts, datetime) else ts,
        }
        event = event_from_mapping(fields, default_source="server")
        if event is None:
            log.warning(
                "recovery event without a type ignored", extra={"detail": str(detail)[:200]}
            )
            return None
        row = RecoveryEvent(
            **_columns(event),
            recorded_at=timezone.now(),
            job_id=job_id,
            operation=clean_text(operation, 100),
            checkpoint=bounded_json(checkpoint),
            attempt=attempt,
            next_retry_at=next_retry_at,
            reason=truncate_utf8(
                clean_text(reason, MAX_ERROR_MESSAGE_BYTES), MAX_ERROR_MESSAGE_BYTES
            ),
            reclaimed=bool(reclaimed),
        )
        with transaction.atomic():
            row.save(force_insert=True)
        return row
    except Exception:
        if raise_errors:
            raise
        log.exception("could not record a recovery event", extra={"type": str(type)[:100]})
        return None


def _columns(event: LineEvent) -> dict[str, Any]:
    return {
        "type": event.type,
        "severity": event.severity,
        "source": event.source,
        "db": event.db,
        "detail": event.detail,
        "done": event.done,
        "deleted_data": event.deleted_data,
        "user_id": event.user_id,
        "username": event.username,
        "ipv4": event.ipv4,
        "ipv6": event.ipv6,
        "object_ids": list(event.object_ids) or None,
        "object_titles": list(event.object_titles) or None,
        "object_count": event.object_count,
        "ts": event.ts,
    }
