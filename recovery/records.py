"""Writing Recovery and Security rows: the one place that does.

``record_event`` and ``record_security`` are best-effort by design: an audit
write must never throw into (or undo) the action it reports, so both log and
swallow every error — database errors included — and return None.
``insert_lines`` is the ingest's bulk path — ``INSERT … ON CONFLICT DO
NOTHING`` on the line identity, multi-row on SQLite and one ``unnest()`` of
column arrays on PostgreSQL, on the driver's own cursor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from durable.models import in_callers_transaction
from durable.policy import MAX_ERROR_MESSAGE_BYTES, truncate_utf8

from .models import IngestCursor, IngestPath, RecoveryEvent, SecurityEvent
from .parsing import (
    NO_OBJECTS,
    LineEvent,
    clean_detail,
    clean_text,
    event_from_mapping,
    normalise_severity,
    split_addresses,
)
from .policy import (
    MAX_ACTOR_CHARS,
    MAX_ACTORS,
    Position,
    bounded_json,
    normalise_cwe,
)

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


# --- Security summary rows -------------------------------------------------------------------

# How long a caller inside a transaction waits for its refusal to be counted on
# a connection of its own (PostgreSQL) before it goes on without the answer.
SEPARATE_RECORD_TIMEOUT = 10.0
# ...and how long that connection waits for a row lock someone else holds.
SEPARATE_LOCK_TIMEOUT = "5s"


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
    """Count one more of this kind of refusal, in one atomic upsert. Never raises.

    A refusal is usually followed by the caller giving up — often by rolling
    back. So inside the caller's transaction it is not written on the caller's
    connection (where a rollback would undo it, and the row lock would be held
    until the caller's transaction ends, stalling every other recorder):

    - on PostgreSQL it is recorded at once on a connection of its own (a
      short-lived thread), committed whatever the caller does next;
    - on SQLite that second connection would wait for the caller's own write
      lock, so it is recorded right after the caller commits
      (``on_commit``); if the caller rolls back, it is lost (docs:
      explanation/recovery-and-security-events.md, "What the engine reports").
      Returns None then: the row is not written yet.
    """
    try:
        values = _security_values(
            identity=security_identity(
                category=category,
                key=key,
                source=source,
                severity=severity,
                cwe=cwe,
                stream=stream,
            ),
            detail=detail,
            user_id=user_id,
            username=username,
            ip=ip,
        )
        if not in_callers_transaction():
            return _count_security(values)
        if connection.vendor == "sqlite":
            transaction.on_commit(lambda: _count_security_logged(values), robust=True)
            return None
        return _count_security_separately(values)
    except Exception:
        log.exception("could not record a security event", extra={"category": str(category)[:64]})
        return None


def _security_values(
    *, identity: dict[str, str], detail: str, user_id: Any, username: str, ip: str | None
) -> dict[str, Any]:
    ipv4, ipv6, _ = split_addresses(ip)
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)
    user = clean_text(username, 150) or (
        f"#{clean_text(user_id, 64)}" if clean_text(user_id, 64) else ""
    )
    return {
        "identity": identity,
        "detail": truncate_utf8(clean_detail(detail), MAX_SECURITY_DETAIL_BYTES),
        "user": user[:MAX_ACTOR_CHARS],
        "address": (ipv4 or ipv6 or "")[:MAX_ACTOR_CHARS],
        "ipv4": ipv4,
        "ipv6": ipv6,
        "now": timezone.now(),
    }


def _count_security_logged(values: dict[str, Any]) -> SecurityEvent | None:
    try:
        return _count_security(values)
    except Exception:
        category = values["identity"]["category"]
        log.exception("could not record a security event", extra={"category": category})
        return None


def _count_security_separately(values: dict[str, Any]) -> SecurityEvent | None:
    """``_count_security`` on a connection of its own, committed on its own (PostgreSQL)."""
    outcome: list[SecurityEvent | None] = []

    def run() -> None:
        try:
            with connection.cursor() as cursor:  # this thread's connection, not the caller's
                cursor.execute(f"SET lock_timeout = '{SEPARATE_LOCK_TIMEOUT}'")
            outcome.append(_count_security_logged(values))
        except Exception:
            log.exception("could not record a security event on its own connection")
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="record-security", daemon=True)
    thread.start()
    thread.join(SEPARATE_RECORD_TIMEOUT)
    if thread.is_alive():
        log.warning("a security event is still being recorded; not waiting for it")
    return outcome[0] if outcome else None


class _SecurityUpsert:
    """The two statements of the upsert, built once per vendor.

    ``UPDATE … RETURNING id`` counts on an existing row; only a kind seen for
    the first time runs ``INSERT … ON CONFLICT DO UPDATE`` (the same SET, for
    two first sightings at once), so a flood of one kind draws no sequence
    value per refusal. Each is one statement: the database evaluates the SET
    on the row as it is when the statement gets it — the latest committed
    version, under its row lock on PostgreSQL; SQLite has one writer at a time
    — so concurrent recorders never lose a count, with no read-modify-write.
    The capped tallies are computed in SQL too (``policy.tally`` is the same
    rule in Python).
    """

    _IDENTITY = ("stream", "category", "key", "source", "severity", "cwe")

    def __init__(self, vendor: str) -> None:
        quote = connection.ops.quote_name
        table = quote(SecurityEvent._meta.db_table)
        self.pg = vendor == "postgresql"

        def col(name: str) -> str:
            return f"{table}.{quote(name)}"

        inet = "::inet" if self.pg else ""
        assignments = [
            f"{quote('count')} = {col('count')} + 1",
            f"{quote('last_seen')} = CASE WHEN {col('last_seen')} > %s "
            f"THEN {col('last_seen')} ELSE %s END",
            f"{quote('detail')} = %s",
            f"{quote('last_ipv4')} = COALESCE(%s{inet}, {col('last_ipv4')})",
            f"{quote('last_ipv6')} = COALESCE(%s{inet}, {col('last_ipv6')})",
        ]
        for tally_column, overflow in (
            ("users", "users_overflow"),
            ("addresses", "addresses_overflow"),
        ):
            counts = col(tally_column)
            if self.pg:
                has = f"({counts} ? %s)"
                size = f"(SELECT count(*) FROM jsonb_object_keys({counts}))"
                bumped = (
                    f"jsonb_set({counts}, ARRAY[%s]::text[], "
                    f"to_jsonb(({counts} ->> %s)::bigint + 1))"
                )
                added = f"{counts} || jsonb_build_object(%s::text, 1)"
            else:
                has = f"EXISTS (SELECT 1 FROM json_each({counts}) AS j WHERE j.key = %s)"
                size = f"(SELECT count(*) FROM json_each({counts}))"
                bumped = (
                    f"json_patch({counts}, json_object(%s, "
                    f"(SELECT j.value FROM json_each({counts}) AS j WHERE j.key = %s) + 1))"
                )
                added = f"json_patch({counts}, json_object(%s, 1))"
            assignments.append(
                f"{quote(tally_column)} = CASE WHEN %s = '' THEN {counts} "
                f"WHEN {has} THEN {bumped} WHEN {size} < %s THEN {added} ELSE {counts} END"
            )
            assignments.append(
                f"{quote(overflow)} = {col(overflow)} + CASE WHEN %s <> '' AND NOT {has} "
                f"AND {size} >= %s THEN 1 ELSE 0 END"
            )
        self.set = ", ".join(assignments)
        identity = " AND ".join(f"{quote(name)} = %s" for name in self._IDENTITY)
        self.update = f"UPDATE {table} SET {self.set} WHERE {identity} RETURNING {quote('id')}"
        json = "::jsonb" if self.pg else ""
        columns = [*self._IDENTITY, "detail", "count", "first_seen", "last_seen", "users",
                   "users_overflow", "addresses", "addresses_overflow", "last_ipv4",
                   "last_ipv6"]  # fmt: skip
        cells = ["%s"] * 7 + ["1", "%s", "%s", f"%s{json}", "0", f"%s{json}", "0"]
        cells += [f"%s{inet}", f"%s{inet}"]
        self.insert = (
            f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) "
            f"VALUES ({', '.join(cells)}) "
            f"ON CONFLICT ({', '.join(quote(c) for c in self._IDENTITY)}) DO UPDATE SET {self.set} "
            f"RETURNING {quote('id')}"
        )

    def set_params(self, values: dict[str, Any], now: Any) -> list[Any]:
        params: list[Any] = [now, now, values["detail"], values["ipv4"], values["ipv6"]]
        for actor in (values["user"], values["address"]):
            # The tally's CASE: '' / has / bumped (2) / size / added; then the overflow's:
            # '' / has / size.
            params += [actor, actor, actor, actor, MAX_ACTORS, actor, actor, actor, MAX_ACTORS]
        return params


_security_upserts: dict[str, _SecurityUpsert] = {}


def _count_security(values: dict[str, Any]) -> SecurityEvent:
    vendor = connection.vendor
    if vendor not in _security_upserts:
        _security_upserts[vendor] = _SecurityUpsert(vendor)
    sql = _security_upserts[vendor]
    now = values["now"]
    if not sql.pg:
        now = connection.ops.adapt_datetimefield_value(now)
    identity = [values["identity"][name] for name in sql._IDENTITY]
    set_params = sql.set_params(values, now)
    # In a savepoint when inside a transaction (a test's): a failed statement
    # must not abort the surrounding one on PostgreSQL.
    guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    with guard, connection.cursor() as cursor:
        cursor.execute(sql.update, [*set_params, *identity])
        found = cursor.fetchone()
        if found is None:  # the first of its kind (or two at once: ON CONFLICT counts it)
            first = {values["user"]: 1} if values["user"] else {}
            first_address = {values["address"]: 1} if values["address"] else {}
            cursor.execute(
                sql.insert,
                [
                    *identity,
                    values["detail"],
                    now,
                    now,
                    json.dumps(first),
                    json.dumps(first_address),
                    values["ipv4"],
                    values["ipv6"],
                    *set_params,
                ],
            )
            found = cursor.fetchone()
    return SecurityEvent.objects.get(pk=found[0])


# --- the ingest's bulk path -------------------------------------------------------------------

# A line's columns, in LineEvent's field order, then the two the ingest adds.
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
# Most lines only say type, severity, source, db, detail and ts. Binding just
# those (and writing the rest as constants) halves the cost of inserting them.
_PLAIN_COLUMNS = ("type", "severity", "source", "db", "detail", "ts", "recorded_at", "source_line")
_PLAIN_CONSTANTS = {
    "done": "NULL",
    "deleted_data": "FALSE",
    "user_id": "''",
    "username": "''",
    "ipv4": "NULL",
    "ipv6": "NULL",
    "object_ids": "NULL",
    "object_titles": "NULL",
    "object_count": "0",
}
# Columns a line never sets, with the value every other writer gives them.
_LINE_CONSTANTS = {"operation": "''", "reason": "''", "reclaimed": "FALSE"}
# done, deleted_data, user_id, username, ipv4, ipv6 of a line that said none of them.
_PLAIN_MIDDLE = (None, False, "", "", None, None)
# Rows per INSERT: many rows per statement halve the per-row cost on both
# databases, within each one's limit on parameters per statement.
_ROWS_PER_STATEMENT = 500


class _Shape:
    """One INSERT … VALUES (…), (…) … ON CONFLICT DO NOTHING form, by number of rows."""

    def __init__(self, table: str, columns: list[str], cells: list[str], max_params: int) -> None:
        quote = connection.ops.quote_name
        self.head = f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) VALUES "
        self.row = "(" + ", ".join(cells) + ")"
        self.tail = f" ON CONFLICT ({quote('source_line')}) DO NOTHING"
        bound = cells.count("?")
        self.per_statement = max(1, min(_ROWS_PER_STATEMENT, max_params // bound))
        self.full = self._build(self.per_statement)

    def _build(self, rows: int) -> str:
        return self.head + ", ".join([self.row] * rows) + self.tail

    def statement(self, rows: int) -> str:
        return self.full if rows == self.per_statement else self._build(rows)


class _LineInsert:
    """The vendor-specific SQL of ``insert_lines``, built once per vendor."""

    def __init__(self, vendor: str, max_params: int) -> None:
        self.pg = vendor == "postgresql"
        table = connection.ops.quote_name(RecoveryEvent._meta.db_table)
        if self.pg:
            self.unnest = _unnest_statement(table)
            return
        # SQLite: multi-row VALUES, in two shapes (every column, or a plain line's).
        self.full = _Shape(
            table,
            [*_LINE_COLUMNS, *_LINE_CONSTANTS],
            ["?"] * len(_LINE_COLUMNS) + list(_LINE_CONSTANTS.values()),
            max_params,
        )
        constants = {**_PLAIN_CONSTANTS, **_LINE_CONSTANTS}
        self.plain = _Shape(
            table,
            [*_PLAIN_COLUMNS, *constants],
            ["?"] * len(_PLAIN_COLUMNS) + list(constants.values()),
            max_params,
        )


# PostgreSQL: one statement per batch, each column passed as one array. Short
# SQL (parsed and planned once), a handful of parameters, one round trip.
_PG_ARRAYS = {
    "type": "text",
    "severity": "text",
    "source": "text",
    "db": "text",
    "detail": "text",
    "done": "bool",
    "deleted_data": "bool",
    "user_id": "text",
    "username": "text",
    "ipv4": "inet",
    "ipv6": "inet",
    "object_ids": "jsonb",
    "object_titles": "jsonb",
    "object_count": "int",
    "ts": "timestamptz",
    "source_line": "text",
}


def _unnest_statement(table: str) -> str:
    quote = connection.ops.quote_name
    arrays = ", ".join(f"%b::{kind}[]" for kind in _PG_ARRAYS.values())  # %b: binary format
    names = ", ".join(_PG_ARRAYS)
    columns = ", ".join(quote(c) for c in (*_PG_ARRAYS, "recorded_at", *_LINE_CONSTANTS))
    values = ", ".join([*(f"u.{name}" for name in _PG_ARRAYS), "%s", *_LINE_CONSTANTS.values()])
    # WITH ORDINALITY … ORDER BY: ids are drawn in file order.
    return (
        f"INSERT INTO {table} ({columns}) SELECT {values} "
        f"FROM unnest({arrays}) WITH ORDINALITY AS u({names}, n) ORDER BY u.n "
        f"ON CONFLICT ({quote('source_line')}) DO NOTHING"
    )


_inserts: dict[str, _LineInsert] = {}


def _line_insert() -> _LineInsert:
    vendor = connection.vendor
    if vendor not in _inserts:
        limit = connection.features.max_query_params or 65_535
        if vendor == "sqlite":  # Django assumes 999; this SQLite may allow more
            connection.ensure_connection()
            limit = connection.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        _inserts[vendor] = _LineInsert(vendor, limit)
    return _inserts[vendor]


def insert_lines(
    events: Iterable[tuple[int, int, LineEvent]], *, prefix: str, recorded_at: datetime
) -> int:
    """Insert ingested lines ``(offset, line CRC, event)``; one already there is skipped.

    ``prefix`` (``policy.line_prefix``) names the file and its generation; with
    the offset and CRC it makes each line's unique identity. Rows go in file
    order, so ids (and "newest first") follow the file. Returns how many rows
    were new. Runs on the driver's own cursor inside the caller's transaction:
    Django's cursor wrapper would cost as much as the inserts themselves.
    """
    sql = _line_insert()
    if sql.pg:
        return _insert_lines_pg(sql.unnest, events, prefix=prefix, recorded_at=recorded_at)
    recorded = connection.ops.adapt_datetimefield_value(recorded_at)
    dumps = json.dumps
    connection.ensure_connection()
    cursor = connection.connection.cursor()
    inserted = 0
    pending: list[Any] = []
    pending_rows = 0
    pending_shape = sql.plain

    def flush() -> None:
        nonlocal inserted, pending, pending_rows
        if pending_rows:
            cursor.execute(pending_shape.statement(pending_rows), pending)
            inserted += max(cursor.rowcount, 0)
            pending, pending_rows = [], 0

    try:
        for offset, crc, event in events:
            key = f"{prefix}{offset:012x}:{crc:08x}"  # policy.line_key, inlined
            ts = event[14]
            if ts is not None:
                # Stored as Django stores it on SQLite: naive UTC text (parse_ts gives
                # UTC). str() of a UTC datetime is that text plus "+00:00"; cutting it
                # off costs a third of datetime.replace(tzinfo=None).
                if ts.tzinfo is not UTC:
                    ts = ts.astimezone(UTC)
                ts = str(ts)[:-6]
            # The parser's short path marks a plain line by its shared empty object
            # list; anything else is checked field by field.
            plain = event[11] is NO_OBJECTS or (
                event[5:11] == _PLAIN_MIDDLE and not (event[11] or event[12] or event[13])
            )
            shape = sql.plain if plain else sql.full
            if shape is not pending_shape or pending_rows == shape.per_statement:
                flush()
                pending_shape = shape
            if plain:
                pending += (*event[:5], ts, recorded, key)
            else:
                ids = dumps(list(event[11])) if event[11] else None
                titles = dumps(list(event[12])) if event[12] else None
                pending += (*event[:11], ids, titles, event[13], ts, recorded, key)
            pending_rows += 1
        flush()
    finally:
        cursor.close()
    return inserted


def _insert_lines_pg(
    statement: str,
    events: Iterable[tuple[int, int, LineEvent]],
    *,
    prefix: str,
    recorded_at: datetime,
) -> int:
    columns: list[list[Any]] = [[] for _ in _PG_ARRAYS]
    (types, severities, sources, dbs, details, dones, deleteds, user_ids, usernames, ipv4s,
     ipv6s, ids, titles, counts, stamps, keys) = columns  # fmt: skip
    dumps = json.dumps
    for offset, crc, event in events:
        types.append(event[0])
        severities.append(event[1])
        sources.append(event[2])
        dbs.append(event[3])
        details.append(event[4])
        dones.append(event[5])
        deleteds.append(event[6])
        user_ids.append(event[7])
        usernames.append(event[8])
        ipv4s.append(event[9])
        ipv6s.append(event[10])
        ids.append(dumps(list(event[11])) if event[11] else None)
        titles.append(dumps(list(event[12])) if event[12] else None)
        counts.append(event[13])
        stamps.append(event[14])
        keys.append(f"{prefix}{offset:012x}:{crc:08x}")  # policy.line_key, inlined
    if not keys:
        return 0
    import psycopg  # only ever needed on PostgreSQL

    connection.ensure_connection()
    # A server-side-binding cursor: Django's own (client-side binding) would
    # render every array as a literal in Python.
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(statement, [recorded_at, *columns])  # in the SQL's order
        return max(cursor.rowcount, 0)


# --- the ingest's cursors -----------------------------------------------------------------------


def name_for(path: str) -> IngestPath:
    """The record of one name of the file (``path`` already canonical: ``tailer.canonical``)."""
    name, _ = IngestPath.objects.get_or_create(path=path)
    return name


def cursor_of_file(file_id: str) -> IngestCursor | None:
    """The cursor following the file with this device:inode, under whatever name."""
    return IngestCursor.objects.filter(file_id=file_id).first() if file_id else None


def follow(path: str, start: Position) -> IngestCursor:
    """The cursor of ``start.file_id``, created at ``start`` if the file is new to the ingest.

    Two ingests meeting a new file at once agree on one row (the unique
    device:inode); the loser gets the winner's, position and all.
    """
    cursor, _ = IngestCursor.objects.get_or_create(
        file_id=start.file_id, defaults={"path": path, **_position_fields(start)}
    )
    return cursor


def is_followed(file_id: str) -> bool:
    return IngestCursor.objects.filter(file_id=file_id).exists()


def position_of(cursor: IngestCursor) -> Position:
    return Position(
        file_id=cursor.file_id,
        generation=cursor.generation,
        offset=cursor.offset,
        head=cursor.head,
        tail=cursor.tail,
        crc=cursor.crc,
        skipping=cursor.skipping,
        tag=cursor.tag,
    )


def _position_fields(position: Position) -> dict[str, Any]:
    return {
        "file_id": position.file_id,
        "tag": position.tag,
        "generation": position.generation,
        "offset": position.offset,
        "head": position.head,
        "tail": position.tail,
        "crc": position.crc,
        "skipping": position.skipping,
    }


def advance_cursor(
    cursor_id: int,
    expected: Position,
    new: Position,
    *,
    imported: int = 0,
    skipped: int = 0,
    path: str | None = None,
) -> bool:
    """Move the cursor from ``expected`` to ``new``; False if another ingest moved it first."""
    fields: dict[str, Any] = {**_position_fields(new), "updated_at": timezone.now()}
    if imported:
        fields["lines_imported"] = F("lines_imported") + imported
    if skipped:
        fields["lines_skipped"] = F("lines_skipped") + skipped
    if path is not None:
        fields["path"] = path
    updated = IngestCursor.objects.filter(
        pk=cursor_id,
        file_id=expected.file_id,
        tag=expected.tag,
        generation=expected.generation,
        offset=expected.offset,
        skipping=expected.skipping,
    ).update(**fields)
    return updated == 1


def point_name(name_id: int, cursor_id: int | None, *, seen: str) -> None:
    """The name now holds the file ``cursor_id`` follows, looked at as ``seen``."""
    IngestPath.objects.filter(pk=name_id).update(
        cursor_id=cursor_id, seen=seen, updated_at=timezone.now()
    )
