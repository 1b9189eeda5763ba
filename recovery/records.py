"""Writing Recovery and Security rows: the one place that does.

``record_event`` and ``record_security`` are best-effort by design: an audit
write must never throw into (or undo) the action it reports, so both log and
swallow every error — database errors included — and return None.
``insert_lines`` is the ingest's bulk path: one multi-row statement per batch,
``ON CONFLICT DO NOTHING`` on the line identity.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from durable.policy import MAX_ERROR_MESSAGE_BYTES, truncate_utf8

from .models import IngestCursor, RecoveryEvent, SecurityEvent
from .parsing import (
    LineEvent,
    clean_detail,
    clean_text,
    event_from_mapping,
    normalise_severity,
    split_addresses,
)
from .policy import Position, bounded_json, normalise_cwe, path_tag, tally

log = logging.getLogger("recovery.records")

MAX_SECURITY_DETAIL_BYTES = 1024


# --- Recovery events ------------------------------------------------------------------------


def record_event(
    type: str,
    *,
    severity: str = "info",
    detail: str = "",
    db: str = "",
    source: str = "server",
    done: bool | None = None,
    deleted_data: bool = False,
    user_id: str | int = "",
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
) -> RecoveryEvent | None:
    """Record one Recovery event; normalised exactly like a line of the JSONL file.

    Returns the row, or None if ``type`` is empty or the write failed (logged).
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
        "object_ids": event.object_ids,
        "object_titles": event.object_titles,
        "object_count": event.object_count,
        "ts": event.ts,
    }


# --- Security summary rows -------------------------------------------------------------------


def security_identity(
    *, category: str, key: str, source: str, severity: str, cwe: Any, stream: str
) -> dict[str, str]:
    return {
        "stream": clean_text(stream, 40) or "security",
        "category": clean_text(category, 64) or "unknown",
        "key": clean_text(key, 128) or "unknown",
        "source": clean_text(source, 64),
        "severity": normalise_severity(severity),
        "cwe": clean_text(normalise_cwe(cwe), 16),
    }


def record_security(
    *,
    category: str,
    key: str,
    detail: str = "",
    severity: str = "warning",
    cwe: str | int = "",
    source: str = "",
    user_id: str | int = "",
    username: str = "",
    ip: str | None = None,
    stream: str = "security",
) -> SecurityEvent | None:
    """Count one more of this kind of refusal: one atomic upsert-and-increment.

    ``INSERT … ON CONFLICT DO NOTHING`` makes sure the row exists, then the row
    is locked (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN
    IMMEDIATE`` already serialises writers) and updated in the same
    transaction, so concurrent recorders never lose a count. Never raises.
    """
    try:
        identity = security_identity(
            category=category, key=key, source=source, severity=severity, cwe=cwe, stream=stream
        )
        ipv4, ipv6, _ = split_addresses(ip)
        if isinstance(user_id, int) and not isinstance(user_id, bool):
            user_id = str(user_id)
        user = clean_text(username, 150) or (
            f"#{clean_text(user_id, 64)}" if clean_text(user_id, 64) else ""
        )
        address = ipv4 or ipv6 or ""
        now = timezone.now()
        with transaction.atomic():
            SecurityEvent.objects.bulk_create(
                [SecurityEvent(**identity, first_seen=now, last_seen=now)], ignore_conflicts=True
            )
            row = SecurityEvent.objects.select_for_update().get(**identity)
            row.users, users_over = tally(row.users, user)
            row.addresses, addresses_over = tally(row.addresses, address)
            row.users_overflow += users_over
            row.addresses_overflow += addresses_over
            row.count += 1
            row.last_seen = max(now, row.last_seen)
            row.detail = truncate_utf8(clean_detail(detail), MAX_SECURITY_DETAIL_BYTES)
            row.last_ipv4 = ipv4 or row.last_ipv4
            row.last_ipv6 = ipv6 or row.last_ipv6
            row.save(
                update_fields=[
                    "users",
                    "addresses",
                    "users_overflow",
                    "addresses_overflow",
                    "count",
                    "last_seen",
                    "detail",
                    "last_ipv4",
                    "last_ipv6",
                ]
            )
        return row
    except Exception:
        log.exception("could not record a security event", extra={"category": str(category)[:64]})
        return None


# --- the ingest's bulk path -------------------------------------------------------------------

_LINE_COLUMNS = (
    "type",
    "severity",
    "source",
    "db",
    "detail",
    "done",
    "deleted_data",
    "user_id",
    "username",
    "ipv4",
    "ipv6",
    "object_ids",
    "object_titles",
    "object_count",
    "ts",
    "recorded_at",
    "source_line",
)
# Columns a line never sets, with the value every other writer would give them.
_LINE_CONSTANTS = {"operation": "''", "reason": "''", "reclaimed": "FALSE"}
# Rows per statement: PostgreSQL takes at most 65,535 parameters per statement.
_ROWS_PER_STATEMENT = 1000
_EMPTY_LIST = "[]"


class _LineInsert:
    """The vendor-specific SQL of ``insert_lines``, built once per vendor."""

    def __init__(self, vendor: str) -> None:
        quote = connection.ops.quote_name
        self.pg = vendor == "postgresql"
        table = quote(RecoveryEvent._meta.db_table)
        names = ", ".join(quote(c) for c in (*_LINE_COLUMNS, *_LINE_CONSTANTS))
        p = "%s" if self.pg else "?"
        jsonb = f"{p}::jsonb" if self.pg else p
        inet = f"{p}::inet" if self.pg else p
        cells = [p] * len(_LINE_COLUMNS)
        for column in ("ipv4", "ipv6"):
            cells[_LINE_COLUMNS.index(column)] = inet
        for column in ("object_ids", "object_titles"):
            cells[_LINE_COLUMNS.index(column)] = jsonb
        self.row_sql = "(" + ", ".join([*cells, *_LINE_CONSTANTS.values()]) + ")"
        self.head = f"INSERT INTO {table} ({names}) VALUES "
        self.tail = f" ON CONFLICT ({quote('source_line')}) DO NOTHING"
        self.single = self.head + self.row_sql + self.tail
        self.full_statement = (
            self.head + ", ".join([self.row_sql] * _ROWS_PER_STATEMENT) + self.tail
        )


_inserts: dict[str, _LineInsert] = {}


def _line_insert() -> _LineInsert:
    vendor = connection.vendor
    if vendor not in _inserts:
        _inserts[vendor] = _LineInsert(vendor)
    return _inserts[vendor]


def line_rows(
    events: Iterable[tuple[str, LineEvent]], recorded_at: datetime, *, pg: bool
) -> list[tuple]:
    """Parameter tuples in ``_LINE_COLUMNS`` order for (line identity, event) pairs."""
    dumps = json.dumps
    if pg:
        recorded = recorded_at
        adapt = None
    else:
        adapt = connection.ops.adapt_datetimefield_value
        recorded = adapt(recorded_at)
    rows = []
    append = rows.append
    for key, ev in events:
        ids = dumps(ev.object_ids) if ev.object_ids else _EMPTY_LIST
        titles = dumps(ev.object_titles) if ev.object_titles else _EMPTY_LIST
        ts = ev.ts
        if ts is not None and adapt is not None:
            ts = adapt(ts)
        append(
            (
                ev.type,
                ev.severity,
                ev.source,
                ev.db,
                ev.detail,
                ev.done,
                ev.deleted_data,
                ev.user_id,
                ev.username,
                ev.ipv4,
                ev.ipv6,
                ids,
                titles,
                ev.object_count,
                ts,
                recorded,
                key,
            )
        )
    return rows


def insert_lines(events: Sequence[tuple[str, LineEvent]], *, recorded_at: datetime) -> int:
    """Insert ingested lines; a line whose identity exists already is skipped.

    Returns how many rows were new. Runs on the driver's own cursor inside the
    caller's transaction: Django's cursor wrapper would cost as much as the
    inserts themselves at a million lines.
    """
    if not events:
        return 0
    sql = _line_insert()
    rows = line_rows(events, recorded_at, pg=sql.pg)
    inserted = 0
    connection.ensure_connection()
    cursor = connection.connection.cursor()
    try:
        if not sql.pg:
            cursor.executemany(sql.single, rows)
            return max(cursor.rowcount, 0)
        for start in range(0, len(rows), _ROWS_PER_STATEMENT):
            part = rows[start : start + _ROWS_PER_STATEMENT]
            if len(part) == _ROWS_PER_STATEMENT:
                statement = sql.full_statement
            else:
                statement = sql.head + ", ".join([sql.row_sql] * len(part)) + sql.tail
            cursor.execute(statement, [value for row in part for value in row])
            inserted += max(cursor.rowcount, 0)
    finally:
        cursor.close()
    return inserted


# --- the ingest's cursor ------------------------------------------------------------------------


def cursor_for(path: str) -> IngestCursor:
    cursor, _ = IngestCursor.objects.get_or_create(
        path=path,
        defaults={"tag": path_tag(path), "head": Position().head, "tail": Position().tail},
    )
    return cursor


def position_of(cursor: IngestCursor) -> Position:
    return Position(
        file_id=cursor.file_id,
        generation=cursor.generation,
        offset=cursor.offset,
        head=cursor.head,
        tail=cursor.tail,
        crc=cursor.crc,
        skipping=cursor.skipping,
    )


def advance_cursor(
    cursor_id: int,
    expected: Position,
    new: Position,
    *,
    imported: int = 0,
    skipped: int = 0,
    seen: str | None = None,
) -> bool:
    """Move the cursor from ``expected`` to ``new``; False if another ingest moved it first."""
    fields: dict[str, Any] = {
        "file_id": new.file_id,
        "generation": new.generation,
        "offset": new.offset,
        "head": new.head,
        "tail": new.tail,
        "crc": new.crc,
        "skipping": new.skipping,
        "updated_at": timezone.now(),
    }
    if imported:
        fields["lines_imported"] = F("lines_imported") + imported
    if skipped:
        fields["lines_skipped"] = F("lines_skipped") + skipped
    if seen is not None:
        fields["seen"] = seen
    updated = IngestCursor.objects.filter(
        pk=cursor_id,
        file_id=expected.file_id,
        generation=expected.generation,
        offset=expected.offset,
        skipping=expected.skipping,
    ).update(**fields)
    return updated == 1
