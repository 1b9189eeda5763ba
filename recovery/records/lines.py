"""The ingest's bulk path: many JSONL lines into Recovery events per statement.

SQLite: multi-row ``INSERT … ON CONFLICT DO NOTHING`` on the line identity.
PostgreSQL: one binary ``COPY … FROM STDIN`` per batch, inside a savepoint —
the fastest way in, and its statement-level trigger keeps the day counts as an
INSERT's does. COPY has no ``ON CONFLICT``: a batch holding a line already
there (a replay after a lost cursor, a re-imported file) fails with a unique
violation, is rolled back to the savepoint and goes in again as one
``unnest()`` of column arrays ``… ON CONFLICT DO NOTHING``. Both on the
driver's own cursor (Django's cursor wrapper would cost as much as the
inserts themselves).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from ipaddress import ip_address
from typing import Any

from django.db import connection, transaction

from durable import faults

from ..models import RecoveryEvent
from ..parsing import NO_OBJECTS, LineEvent

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
            self.copy = _copy_statement(table)
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


# The COPY's columns and the types its binary rows are written as, in row order
# (``_PG_ARRAYS`` ends with ts, source_line).
_COPY_TYPES = {
    **{name: "int4" if kind == "int" else kind for name, kind in _PG_ARRAYS.items()},
    "recorded_at": "timestamptz",
    "operation": "text",
    "reason": "text",
    "reclaimed": "bool",
}
_COPY_TYPE_LIST = list(_COPY_TYPES.values())
# The last three columns of every COPY row: what other writers give a line's event.
_COPY_CONSTANTS = ("", "", False)


def _copy_statement(table: str) -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(c) for c in _COPY_TYPES)
    return f"COPY {table} ({columns}) FROM STDIN (FORMAT binary)"


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


def parse_ahead_pays() -> bool:
    """Whether parsing the next lines on a thread while these are written saves time.

    On PostgreSQL the server does the writing (the trigram indexes: most of
    an import's time) while this process waits with the GIL released: a
    thread parsing meanwhile uses that wait. On SQLite the writes run in
    this process and keep it busy; a thread there measured slower (200,000
    lines: 1.90 s inline against 2.21 s ahead, best of five) — it only adds
    GIL handovers.
    """
    return _line_insert().pg


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
        return _insert_lines_pg(sql, events, prefix=prefix, recorded_at=recorded_at)
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
            stamp = event[14]
            ts = None
            if stamp is not None:
                # Stored as Django stores it on SQLite: naive UTC text (parse_ts gives
                # UTC). str() of a UTC datetime is that text plus "+00:00"; cutting it
                # off costs a third of datetime.replace(tzinfo=None).
                if stamp.tzinfo is not UTC:
                    stamp = stamp.astimezone(UTC)
                ts = str(stamp)[:-6]
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
        faults.reach("ingest.mid_insert")  # crash tests: the batch's last statement unsent
        flush()
    finally:
        cursor.close()
    return inserted


def _insert_lines_pg(
    sql: _LineInsert,
    events: Iterable[tuple[int, int, LineEvent]],
    *,
    prefix: str,
    recorded_at: datetime,
) -> int:
    """COPY the batch in; if a line is already there, insert it again skipping those.

    Rows stream into the COPY as ``events`` yields them (``Chunk.parsed``
    parses the next ones meanwhile). Those read are kept for the fallback.
    """
    events = iter(events)
    first = next(events, None)
    if first is None:
        return 0
    import psycopg  # only ever needed on PostgreSQL

    read = [first]
    connection.ensure_connection()
    try:
        with (
            transaction.atomic(),
            psycopg.Cursor(connection.connection) as cursor,
            cursor.copy(sql.copy) as copy,
        ):
            copy.set_types(_COPY_TYPE_LIST)
            write = copy.write_row
            rows = _copy_rows(_kept(events, read), prefix, recorded_at)
            write(next(_copy_rows(read, prefix, recorded_at)))
            faults.reach("ingest.mid_insert")  # crash tests: the COPY begun, not ended
            for row in rows:
                write(row)
        return len(read)
    except psycopg.errors.UniqueViolation:
        # Rolled back to the savepoint: nothing of the COPY remains.
        read += events  # any the COPY had not taken yet
        return _unnest_lines_pg(sql.unnest, read, prefix=prefix, recorded_at=recorded_at)


def _kept(items: Iterator[Any], into: list[Any]) -> Iterator[Any]:
    """``items``, each appended to ``into`` as it passes."""
    keep = into.append
    for item in items:
        keep(item)
        yield item


def _copy_rows(
    events: Iterable[tuple[int, int, LineEvent]], prefix: str, recorded_at: datetime
) -> Iterator[tuple]:
    """The lines as COPY rows, in ``_COPY_TYPES`` order; Python values the binary format takes.

    Addresses become ``ipaddress`` objects and object lists stay lists (the
    jsonb dumper encodes them), so every row is written by the driver's C code.
    """
    for offset, crc, event in events:
        ipv4, ipv6, ids, titles = event[9], event[10], event[11], event[12]
        yield (
            *event[:9],
            ip_address(ipv4) if ipv4 else None,
            ip_address(ipv6) if ipv6 else None,
            list(ids) if ids else None,
            list(titles) if titles else None,
            event[13],
            event[14],
            f"{prefix}{offset:012x}:{crc:08x}",  # policy.line_key, inlined
            recorded_at,
            *_COPY_CONSTANTS,
        )


def _unnest_lines_pg(
    statement: str,
    events: Iterable[tuple[int, int, LineEvent]],
    *,
    prefix: str,
    recorded_at: datetime,
) -> int:
    """The batch as one ``unnest()`` insert that skips lines already there."""
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
