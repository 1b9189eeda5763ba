"""Recovery events that need a person go out to the configured webhooks and mail.

``durable.notify`` already publishes what the engine reports (failed and paused
jobs, operations' error reports). Published here: error-severity lines of
``recovery-events.jsonl`` (a launch script found corruption, a restore
failed…) and error events an administrator records. Not published: imported
history from another instance — that is the past, not news.

Each event's id is its stable identity (the line's file/offset/CRC key), so a
replayed batch publishes nothing twice; inside the ingest's atomic unit the
publication commits with the rows or not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from durable import notify
from durable.policy import truncate_utf8

from .models import RecoveryEvent
from .parsing import LineEvent
from .policy import line_key

log = logging.getLogger("recovery.notify")

MAX_DETAIL_BYTES = 4000


def payload(event: LineEvent) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": event.type,
        "severity": event.severity,
        "source": event.source,
        "db": event.db,
        "detail": truncate_utf8(event.detail, MAX_DETAIL_BYTES),
        "done": event.done,
        "deleted_data": event.deleted_data,
        "ts": event.ts.isoformat() if event.ts else None,
    }
    if event.username:
        data["username"] = event.username
    return data


def publish_errors(events: Iterable[tuple[int, int, LineEvent]], *, prefix: str) -> int:
    """Publish the error-severity lines among ``events``; returns how many were published."""
    errors = [(offset, crc, event) for offset, crc, event in events if event.severity == "error"]
    if not errors or not notify.anyone_listening():
        return 0
    for offset, crc, event in errors:
        notify.publish(
            truncate_utf8(f"recovery.{event.type}", 100),
            f"recovery-line:{line_key(prefix, offset, crc)}",
            payload(event),
            summary=f"{event.type}: {event.detail}",
        )
    return len(errors)


def publish_recorded(event: RecoveryEvent | None) -> None:
    """An error event recorded by hand (command or dashboard). Never raises."""
    if event is None or event.severity != "error":
        return
    data = {
        "type": event.type,
        "severity": event.severity,
        "source": event.source,
        "db": event.db,
        "detail": truncate_utf8(event.detail, MAX_DETAIL_BYTES),
        "done": event.done,
        "deleted_data": event.deleted_data,
        "ts": event.when.isoformat(),
    }
    if event.username:
        data["username"] = event.username
    try:
        if notify.anyone_listening():
            notify.publish(
                truncate_utf8(f"recovery.{event.type}", 100),
                f"recovery-event:{event.pk}",
                data,
                summary=f"{event.type}: {event.detail}",
            )
    except Exception:
        log.exception("could not publish a recorded recovery event", extra={"event": event.pk})
