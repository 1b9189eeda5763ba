"""The import formats: records from a file-like object, CSV rows as events, and our export.

No ORM and no clock reads. A *record* is one line of JSONL, or one CSV row,
which may span lines inside a quoted field. Each record keeps the byte
offset where it starts: with the file's SHA-256 that is its identity, so a
replayed batch inserts nothing twice.

CSV columns are the JSONL field names (``type`` required; ``severity``,
``source``, ``db``, ``detail``, ``ts``, ``done``, ``deleted_data``,
``user_id``, ``username``, ``ip``, ``ipv4``, ``ipv6``, ``object_ids``,
``object_titles``), in any order and case; WeKan's camelCase spellings
(``userId``, ``deletedData``, ``boardIds``, ``boardTitles``) work too. A list
column holds a JSON array (``["b1","b2"]``) or a single value. Other columns
are ignored. No error message ever quotes the file's bytes (a header that
is not one is described by its column count). ``export_row`` / ``export_line`` write exactly
this, so an export of ours imports into another instance unchanged.
"""

from __future__ import annotations

import csv
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from ..parsing import MAX_LINE_BYTES, LineEvent, Skip, event_from_mapping, parse_line

MAX_CSV_RECORD_BYTES = 64 * 1024
READ_CHUNK = 64 * 1024
BOM = b"\xef\xbb\xbf"

# Columns an export of ours writes, in this order.
CSV_COLUMNS = (
    "type", "severity", "source", "db", "detail", "ts", "done", "deleted_data",
    "user_id", "username", "ipv4", "ipv6", "object_ids", "object_titles",
)  # fmt: skip
LIST_COLUMNS = frozenset({"object_ids", "object_titles"})
# Header spellings (case, "_", "-" and spaces ignored) → the field name the parser knows.
_HEADER_NAMES = {
    **{name.replace("_", ""): name for name in (*CSV_COLUMNS, "ip")},
    "userid": "user_id",
    "deleteddata": "deleted_data",
    "boardids": "object_ids",
    "boardtitles": "object_titles",
    "objectids": "object_ids",
    "objecttitles": "object_titles",
}

# Why a CSV row was skipped, beyond the line reasons of ``parsing.Skip``.
WRONG_FIELD_COUNT = "wrong_field_count"
MALFORMED_CSV = "malformed_csv"
SKIP_LABELS_EXTRA = {
    WRONG_FIELD_COUNT: "more fields than the header",
    MALFORMED_CSV: "malformed CSV",
}


class TooLong:
    """A record longer than the format allows (its bytes are not kept)."""

    def __repr__(self) -> str:
        return "TOO_LONG"


TOO_LONG = TooLong()


@dataclass(frozen=True)
class Record:
    offset: int
    raw: bytes | TooLong  # without its line end


# --- reading records ---------------------------------------------------------------------------


def read_record(
    handle: IO[bytes], *, quoted: bool, limit: int
) -> tuple[bytes | TooLong | None, int]:
    """The next record from ``handle``'s position: (its bytes, bytes consumed); None at the end.

    ``quoted`` (CSV): a newline inside double quotes does not end the record.
    A record over ``limit`` bytes is consumed up to the next newline — past
    the limit quotes no longer count, so an unterminated quote cannot swallow
    the rest of the file — and returned as ``TOO_LONG``.
    """
    kept: list[bytes] = []
    consumed = size = 0
    too_long = in_quotes = False
    while True:
        line = handle.readline(READ_CHUNK)
        if not line:
            break
        consumed += len(line)
        if not too_long:
            size += len(line)
            if size > limit + 2:  # + the line end
                too_long, kept, in_quotes = True, [], False
            else:
                kept.append(line)
        if quoted and not too_long and line.count(b'"') % 2:
            in_quotes = not in_quotes
        if line.endswith(b"\n") and not in_quotes:
            break
    if not consumed:
        return None, 0
    if too_long:
        return TOO_LONG, consumed
    raw = b"".join(kept)
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) > limit:
        return TOO_LONG, consumed
    return raw, consumed


def read_records(
    handle: IO[bytes],
    start: int,
    *,
    quoted: bool,
    limit: int,
    max_records: int,
    max_bytes: int,
    end: int | None = None,
) -> tuple[list[Record], int]:
    """Up to ``max_records`` records (or about ``max_bytes``) from ``start``, or up to ``end``.

    Returns the records and the offset after the last one.
    """
    handle.seek(start)
    records: list[Record] = []
    position = start
    while True:
        if end is not None:
            if position >= end:
                break
        elif len(records) >= max_records or position - start >= max_bytes:
            break
        raw, consumed = read_record(handle, quoted=quoted, limit=limit)
        if raw is None:
            break
        records.append(Record(position, raw))
        position += consumed
    return records, position


def count_batches(
    handle: IO[bytes],
    start: int,
    *,
    quoted: bool,
    limit: int,
    max_records: int,
    max_bytes: int,
    skip_first: bool = False,
) -> int:
    """How many batches ``read_records`` will cut from ``start`` on: the progress bar's total.

    The same reads, the same limits, so the count is exact for an unchanged
    file; ``skip_first`` leaves out a CSV's header record.
    """
    handle.seek(start)
    position = start
    if skip_first:
        _, consumed = read_record(handle, quoted=quoted, limit=limit)
        position += consumed
    batches = 0
    while True:
        records, position = read_records(
            handle, position, quoted=quoted, limit=limit,
            max_records=max_records, max_bytes=max_bytes,
        )  # fmt: skip
        if not records:
            return batches
        batches += 1


# --- CSV ----------------------------------------------------------------------------------------


def _header_key(cell: str) -> str:
    return "".join(ch for ch in cell.strip().lower() if ch not in "_- ")


def parse_header(raw: bytes | TooLong) -> tuple[list[str], list[str]]:
    """(field per column, "" where ignored; the ignored headers). ValueError if unusable."""
    if isinstance(raw, TooLong):
        raise ValueError("the CSV header row is longer than 64 KiB")
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    try:
        text = raw.decode("utf-8")
        (cells,) = list(csv.reader([text], strict=True)) or [[]]
    except (UnicodeDecodeError, csv.Error, ValueError):
        # Never the bytes themselves: see describe_header.
        raise ValueError(
            "the first row is not a readable CSV header (UTF-8, comma-separated)"
        ) from None
    columns, ignored, seen = [], [], set()
    for cell in cells:
        name = _HEADER_NAMES.get(_header_key(cell), "")
        if name in seen:  # a second column for the same field: the first one wins
            name = ""
        if name:
            seen.add(name)
        elif cell.strip():
            ignored.append(cell.strip()[:64])
        columns.append(name)
    if "type" not in seen:
        raise ValueError(f"the CSV header has no 'type' column ({describe_header(columns)})")
    return columns, ignored


def describe_header(columns: list[str]) -> str:
    """What a header row held, without a byte of it: a count and the field names we know.

    The first line of a file that is not an export at all may be anything — an
    ``app.env`` full of passwords — and this text becomes a job's reason, seen
    on the dashboard and through the API. Only our own vocabulary is named.
    """
    known = [name for name in columns if name]
    count = f"{len(columns)} column{'' if len(columns) == 1 else 's'}"
    return f"{count}; recognised: {', '.join(known)}" if known else f"{count}, none recognised"


def _list_cell(cell: str) -> Any:
    text = cell.strip()
    if not text:
        return None
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            return [text]
        return value if isinstance(value, list) else [text]
    return [text]


def parse_csv_record(raw: bytes | TooLong, columns: list[str]) -> LineEvent | str:
    """One CSV row as an event, or why it is skipped (a ``Skip`` value, or a CSV reason above)."""
    if isinstance(raw, TooLong):
        return Skip.TOO_LONG
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Skip.INVALID_UTF8
    if not text.strip():
        return Skip.BLANK
    try:
        rows = list(csv.reader([text], strict=True))
    except csv.Error:
        return MALFORMED_CSV
    if len(rows) != 1:
        return MALFORMED_CSV
    (cells,) = rows
    if len(cells) > len(columns) and any(cell.strip() for cell in cells[len(columns) :]):
        return WRONG_FIELD_COUNT
    mapping: dict[str, Any] = {}
    for name, cell in zip(columns, cells, strict=False):
        if name:
            mapping[name] = _list_cell(cell) if name in LIST_COLUMNS else cell
    event = event_from_mapping(mapping)
    return Skip.NO_TYPE if event is None else event


def parse_jsonl_record(raw: bytes | TooLong) -> LineEvent | str:
    if isinstance(raw, TooLong):
        return Skip.TOO_LONG
    return parse_line(raw)


@dataclass
class Batch:
    """What a batch of records became: events with their identity, and skip counts."""

    events: list[tuple[int, int, LineEvent]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    ips_dropped: int = 0


def parse_records(records: Iterable[Record], *, columns: list[str] | None) -> Batch:
    """``columns`` None: JSONL; else CSV with that header. Identity: (offset, CRC-32 of bytes)."""
    batch = Batch()
    for record in records:
        raw = record.raw
        parsed = parse_jsonl_record(raw) if columns is None else parse_csv_record(raw, columns)
        # A LineEvent's record is bytes (a TooLong one parses to Skip.TOO_LONG).
        if isinstance(parsed, LineEvent) and not isinstance(raw, TooLong):
            batch.events.append((record.offset, zlib.crc32(raw), parsed))
            batch.ips_dropped += parsed.ips_dropped
        else:
            reason = str(parsed)
            batch.skipped[reason] = batch.skipped.get(reason, 0) + 1
    return batch


def record_limit(csv_format: bool) -> int:
    return MAX_CSV_RECORD_BYTES if csv_format else MAX_LINE_BYTES


# --- our export ---------------------------------------------------------------------------------


def _ts(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").replace(".000000Z", "Z")


def export_fields(event: Any) -> dict[str, Any]:
    """A RecoveryEvent (anything with its attributes) as the fields of one exported record."""
    return {
        "type": event.type,
        "severity": event.severity,
        "source": event.source,
        "db": event.db,
        "detail": event.detail,
        "ts": _ts(event.ts),
        "done": event.done,
        "deleted_data": event.deleted_data,
        "user_id": event.user_id,
        "username": event.username,
        "ipv4": event.ipv4 or "",
        "ipv6": event.ipv6 or "",
        "object_ids": list(event.object_ids or []),
        "object_titles": list(event.object_titles or []),
    }


def export_line(event: Any) -> bytes:
    """One JSONL line (the format of docs/how-to/feed-recovery-events.md), newline included."""
    fields = {k: v for k, v in export_fields(event).items() if v not in ("", [], None)}
    fields.setdefault("type", event.type)
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def export_row(event: Any) -> dict[str, str]:
    """One CSV row for ``csv.DictWriter(fieldnames=CSV_COLUMNS)``."""
    row: dict[str, str] = {}
    for name, value in export_fields(event).items():
        if name in LIST_COLUMNS:
            row[name] = json.dumps(value, ensure_ascii=False) if value else ""
        elif isinstance(value, bool):
            row[name] = "true" if value else "false"
        elif value is None:
            row[name] = ""
        else:
            row[name] = str(value)
    return row


def skip_labels(base: Mapping[str, str]) -> dict[str, str]:
    return {**{str(k): v for k, v in base.items()}, **SKIP_LABELS_EXTRA}
