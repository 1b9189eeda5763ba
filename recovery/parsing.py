"""Reading ``recovery-events.jsonl``: pure functions, no ORM, no clock reads.

Launch scripts we do not control append one JSON object per line (its fields:
docs/how-to/feed-recovery-events.md). The parser is forgiving — a bad line is
skipped and counted, never fatal — and everything it returns is already fit
for the database: a non-empty ``type``, a severity of info/warning/error,
strings without NUL characters or lone surrogates (PostgreSQL refuses both)
and within their column sizes, IP addresses split by family with IPv4-mapped
IPv6 stored as IPv4, and affected object lists bounded to 200 entries.

``frame_chunk`` cuts a block of bytes read from the file into lines with
the bookkeeping the ingest needs: the byte offset of every line (its stable
identity), a running CRC-32 of everything read so far; ``Chunk.parsed``
then turns the lines into events and per-reason skip counts, a step of
lines ahead on a thread while the caller writes the last step
(``parse_chunk`` does both at once). One pass over the bytes, because the
ingest has to keep up with files of millions of lines.
"""

from __future__ import annotations

import gc
import json
import re
import zlib
from collections import Counter
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

from durable.clientip import parse_address  # one reading of an address, for every source
from durable.policy import truncate_utf8

# --- limits and vocabulary ---------------------------------------------------------

MAX_LINE_BYTES = 8 * 1024
MAX_OBJECTS = 200
UNKNOWN_TITLE = "(unknown title)"
MAX_TYPE_CHARS = 100
MAX_DB_CHARS = 100
MAX_SOURCE_CHARS = 40
MAX_DETAIL_BYTES = 4 * 1024
MAX_USER_ID_CHARS = 64
MAX_USERNAME_CHARS = 150
MAX_OBJECT_ID_CHARS = 100
MAX_TITLE_CHARS = 200

SEVERITIES = ("info", "warning", "error")
# Anything not listed is "info": an unknown word must not make an event look
# worse (or better) than its writer meant, and info is what WeKan defaults to.
_SEVERITY = {
    "info": "info",
    "information": "info",
    "notice": "info",
    "debug": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "err": "error",
    "critical": "error",
    "crit": "error",
    "fatal": "error",
    "alert": "error",
    "emerg": "error",
    "emergency": "error",
}
_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


class Skip(StrEnum):
    """Why a line was not imported; the ingest counts each reason."""

    BLANK = "blank"
    TOO_LONG = "too_long"
    INVALID_UTF8 = "invalid_utf8"
    MALFORMED = "malformed_json"
    NOT_OBJECT = "not_object"
    NO_TYPE = "missing_type"


SKIP_LABELS: dict[str, str] = {  # by Skip (a str)
    Skip.BLANK: "blank",
    Skip.TOO_LONG: f"longer than {MAX_LINE_BYTES // 1024} KiB",
    Skip.INVALID_UTF8: "not UTF-8",
    Skip.MALFORMED: "malformed JSON",
    Skip.NOT_OBJECT: "not a JSON object",
    Skip.NO_TYPE: "without a type",
}


class LineEvent(NamedTuple):
    """One recovery event as read from a line (or passed to ``record_event``)."""

    type: str
    severity: str
    source: str
    db: str
    detail: str
    done: bool | None
    deleted_data: bool
    user_id: str
    username: str
    ipv4: str | None
    ipv6: str | None
    object_ids: Sequence[str]
    object_titles: Sequence[str]
    object_count: int
    ts: datetime | None
    # Addresses given but unusable (not an IP): dropped, counted by the ingest.
    ips_dropped: int = 0


# --- small normalisers --------------------------------------------------------------


def clean_text(value: Any, limit: int) -> str:
    """A string fit for any database: no NUL, no lone surrogate, at most ``limit`` characters."""
    if not isinstance(value, str):
        return ""
    if "\x00" in value:
        value = value.replace("\x00", "")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a JSON "\ud800" escape decodes to a lone surrogate
            value = value.encode("utf-8", "replace").decode("utf-8")
    value = value.strip()
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return value


def clean_detail(value: Any) -> str:
    text = clean_text(value, MAX_DETAIL_BYTES)
    if len(text) * 4 <= MAX_DETAIL_BYTES or text.isascii():  # cannot be over in bytes
        return text
    return truncate_utf8(text, MAX_DETAIL_BYTES)


def normalise_severity(value: Any) -> str:
    if isinstance(value, str):
        return _SEVERITY.get(value.strip().lower(), "info")
    return "info"


def parse_bool(value: Any) -> bool | None:
    """true/false, "yes"/"no", 1/0; anything else is "not said" (None)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    return None


def split_addresses(*values: Any) -> tuple[str | None, str | None, int]:
    """(ipv4, ipv6, dropped) from candidate fields; the first address of each family wins."""
    ipv4 = ipv6 = None
    dropped = 0
    for value in values:
        if value is None or value == "":
            continue
        address = parse_address(value)
        if address is None:
            dropped += 1
        elif address.version == 4:
            ipv4 = ipv4 or str(address)
        else:
            ipv6 = ipv6 or str(address)
    return ipv4, ipv6, dropped


EPOCH_TEXT = re.compile(r"-?[0-9]{1,16}(\.[0-9]{1,9})?")


def parse_ts(value: Any) -> datetime | None:
    """ISO 8601 text (``Z`` allowed, naive means UTC) or epoch seconds/milliseconds.

    Epoch may come quoted (``"1764500000"``): WeKan's launch scripts quote every value.
    A plain number in text is therefore epoch, never ISO 8601's digits-only "basic"
    form (``"20261130"``), which no writer of this file uses.
    """
    try:
        if isinstance(value, str):
            text = value.strip()
            if not text or len(text) > 64:
                return None
            if EPOCH_TEXT.fullmatch(text):
                return parse_ts(float(text) if "." in text else int(text))
            moment = datetime.fromisoformat(text)
            if moment.tzinfo is UTC:  # "…Z", the common case
                return moment
            if moment.tzinfo is None:
                return moment.replace(tzinfo=UTC)
            return moment.astimezone(UTC)
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = value / 1000 if abs(value) > 1e11 else value
            return datetime.fromtimestamp(seconds, tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def _object_id(value: Any) -> str:
    """An id as text of at most ``MAX_OBJECT_ID_CHARS``; a number too (JSON allows any size)."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            value = str(value)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            return "…"
    return clean_text(value, MAX_OBJECT_ID_CHARS)


def _object_title(value: Any) -> str:
    return clean_text(value, MAX_TITLE_CHARS) or UNKNOWN_TITLE


def bound_objects(ids: Any, titles: Any) -> tuple[list[str], list[str], int]:
    """Affected objects as parallel id/title lists of at most 200; the true count beside.

    A title that is missing or not text becomes the "unknown title" marker, so
    the two lists always line up; an attacker-sized list costs 200 entries.
    """
    raw_ids = ids if isinstance(ids, list) else []
    raw_titles = titles if isinstance(titles, list) else []
    count = max(len(raw_ids), len(raw_titles))
    keep = min(count, MAX_OBJECTS)
    out_ids = [_object_id(raw_ids[n]) if n < len(raw_ids) else "" for n in range(keep)]
    out_titles = [
        _object_title(raw_titles[n]) if n < len(raw_titles) else UNKNOWN_TITLE for n in range(keep)
    ]
    return out_ids, out_titles, count


def _objects_from(obj: dict) -> tuple[list[str], list[str], int]:
    ids = obj.get("object_ids")
    if ids is None:
        ids = obj.get("objectIds", obj.get("boardIds", obj.get("board_ids")))
    titles = obj.get("object_titles")
    if titles is None:
        titles = obj.get("objectTitles", obj.get("boardTitles", obj.get("board_titles")))
    objects = obj.get("objects")
    if ids is None and titles is None and isinstance(objects, list):
        items = [item for item in objects[: MAX_OBJECTS + 1] if isinstance(item, dict)]
        ids = [item.get("id", item.get("_id")) for item in items]
        titles = [item.get("title") for item in items]
        ids_out, titles_out, _ = bound_objects(ids, titles)
        return ids_out, titles_out, len(objects)
    return bound_objects(ids, titles)


# The fields of a plain launch-script line (the example at the top of
# docs/how-to/feed-recovery-events.md): such a line
# takes the short path below, which is most of the cost of a big import.
_PLAIN_FIELDS = frozenset({"type", "db", "severity", "source", "detail", "ts"})


class _NoObjects(tuple):
    """An empty tuple that is not the ``()`` singleton, so identity can mark it."""


# The object lists of every line that took the short path (and only those):
# ``records.lines.insert_lines`` knows such a line by it, without looking further.
NO_OBJECTS: tuple[str, ...] = _NoObjects()
_new_event = tuple.__new__


def event_from_mapping(obj: dict, *, default_source: str = "startup") -> LineEvent | None:
    """Normalise one event object; None if it has no usable ``type``.

    Field names follow the JSONL format (snake_case) and also accept WeKan's
    camelCase spellings (``userId``, ``deletedData``, ``boardIds``...).
    """
    kind = obj.get("type")
    if not isinstance(kind, str):
        return None
    kind = clean_text(kind, MAX_TYPE_CHARS)
    if not kind:
        return None
    get = obj.get
    if obj.keys() <= _PLAIN_FIELDS:  # no temporary set, unlike issuperset()
        # tuple.__new__ skips LineEvent's Python-level __new__: same object, less work.
        return _new_event(
            LineEvent,
            (
                kind,
                _SEVERITY.get(severity.strip().lower(), "info")
                if isinstance(severity := get("severity"), str)
                else "info",
                clean_text(get("source"), MAX_SOURCE_CHARS) or default_source,
                clean_text(get("db"), MAX_DB_CHARS),
                clean_detail(get("detail")),
                None,
                False,
                "",
                "",
                None,
                None,
                NO_OBJECTS,
                NO_OBJECTS,
                0,
                parse_ts(get("ts")),
                0,
            ),
        )
    user_id = get("user_id", get("userId"))
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)
    ipv4, ipv6, dropped = split_addresses(get("ipv4"), get("ipv6"), get("ip"))
    ids, titles, count = _objects_from(obj)
    return LineEvent(
        type=kind,
        severity=normalise_severity(get("severity")),
        source=clean_text(get("source"), MAX_SOURCE_CHARS) or default_source,
        db=clean_text(get("db"), MAX_DB_CHARS),
        detail=clean_detail(get("detail")),
        done=parse_bool(get("done")),
        deleted_data=parse_bool(get("deleted_data", get("deletedData"))) is True,
        user_id=clean_text(user_id, MAX_USER_ID_CHARS),
        username=clean_text(get("username"), MAX_USERNAME_CHARS),
        ipv4=ipv4,
        ipv6=ipv6,
        object_ids=ids,
        object_titles=titles,
        object_count=count,
        ts=parse_ts(get("ts")),
        ips_dropped=dropped,
    )


# --- one line -----------------------------------------------------------------------------


_BOM = b"\xef\xbb\xbf"


def parse_line(raw: bytes) -> LineEvent | Skip:
    """One line without its ``\\n`` (a trailing ``\\r`` and a UTF-8 BOM are accepted)."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) > MAX_LINE_BYTES:
        return Skip.TOO_LONG
    raw = raw.strip()
    if raw.startswith(_BOM):  # the file's first line, or a tool that adds one per line
        raw = raw[3:].strip()
    if not raw:
        return Skip.BLANK
    try:
        obj = orjson.loads(raw)  # strict JSON, valid UTF-8, ~4x the standard library's speed
    except orjson.JSONDecodeError:
        obj = _parse_leniently(raw)
        if isinstance(obj, Skip):
            return obj
    if type(obj) is not dict:
        return Skip.NOT_OBJECT
    event = event_from_mapping(obj)
    return Skip.NO_TYPE if event is None else event


def _parse_leniently(raw: bytes) -> Any:
    """What orjson refused, the way the standard library reads it (or why not).

    Tells invalid UTF-8 from malformed JSON, and still accepts what Python's
    json does beyond strict JSON (NaN, lone surrogate escapes, deep nesting
    up to its recursion limit), so the faster parser changes no verdict.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Skip.INVALID_UTF8
    # U+FEFF is not whitespace to str.strip(); other Unicode spaces are.
    text = text.strip().lstrip("\ufeff").strip()
    if not text:
        return Skip.BLANK
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: "[[[[…" nested thousands deep
        return Skip.MALFORMED


# --- a chunk of the file -------------------------------------------------------------------


# Lines parsed per step of ``Chunk.parsed``: the next step is parsed on a thread
# while the caller writes this one.
PARSE_AHEAD_LINES = 2_000
PARSE_AHEAD_THREAD = "recovery-parse-ahead"  # its name, for ps and for tests

# (events, skips as (reason, line offset), addresses dropped) of some lines.
_Parsed = tuple[list[tuple[int, int, LineEvent]], list[tuple[Skip, int]], int]


@dataclass
class Chunk:
    """A block of bytes starting at ``offset``, cut into lines; ``parsed`` reads them.

    ``frame_chunk`` only cuts: ``consumed``, ``crc``, ``skipping`` and
    ``lines`` — all the position after the chunk needs — are known at once.
    ``events`` (``(line offset, CRC-32 of the line, event)``), ``skipped``,
    ``first_skipped`` and ``ips_dropped`` are filled by ``parsed()`` (or
    ``parse_chunk``). ``consumed`` bytes are accounted for — imported,
    skipped or (in ``skipping`` mode) part of an over-long line; the rest, if
    any, is an unfinished last line left for the next read.
    """

    offset: int
    consumed: int = 0
    crc: int = 0
    skipping: bool = False
    lines: int = 0
    events: list[tuple[int, int, LineEvent]] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    first_skipped: dict[str, int] = field(default_factory=dict)
    ips_dropped: int = 0
    # The complete lines, unread, without their newlines, and the offset of the first.
    pieces: list[bytes] = field(default_factory=list, repr=False)
    first_at: int = 0
    # Where an over-long line that began in an earlier chunk ended in this one.
    long_line_at: int | None = None

    @property
    def end(self) -> int:
        return self.offset + self.consumed

    def skip(self, reason: Skip, at: int) -> None:
        self.skipped[reason.value] += 1
        self.first_skipped.setdefault(reason.value, at)

    def _steps(self, step_lines: int) -> list[tuple[list[bytes], int]]:
        """The lines in steps of ``step_lines``: (lines, offset of the first)."""
        steps, at, pieces = [], self.first_at, self.pieces
        for start in range(0, len(pieces), step_lines):
            part = pieces[start : start + step_lines]
            steps.append((part, at))
            at += sum(map(len, part)) + len(part)  # each line and its newline
        return steps

    def _restart(self) -> None:
        """Forget what a previous reading found: reading again gives the same result."""
        self.events, self.skipped, self.first_skipped, self.ips_dropped = [], Counter(), {}, 0
        if self.long_line_at is not None:
            self.skip(Skip.TOO_LONG, self.long_line_at)

    def _take(self, parsed: _Parsed) -> list[tuple[int, int, LineEvent]]:
        events, skips, dropped = parsed
        self.events += events
        for reason, at in skips:
            self.skip(reason, at)
        self.ips_dropped += dropped
        return events

    def parse_all(self) -> None:
        """Read every line here, in this thread."""
        self._restart()
        for part, at in self._steps(len(self.pieces) or 1):
            self._take(_parse_lines(part, at))

    def parsed(
        self, step_lines: int = PARSE_AHEAD_LINES, *, ahead: bool = True
    ) -> Generator[list[tuple[int, int, LineEvent]], None, None]:
        """The events, ``step_lines`` lines' worth at a time; the next step is parsed ahead.

        While the caller writes one step (the database works, the GIL is
        free) a thread parses the next, so parsing costs the ingest little
        wall time. ``ahead=False`` parses each step when it is asked for:
        where the writes keep this process busy themselves, a thread only
        adds the cost of handing the GIL back and forth. Skips and events
        accumulate on the chunk exactly as ``parse_all`` would leave them.
        The thread ends with the generator: close it (``contextlib.closing``)
        when the caller may stop early, e.g. on an error, and it is joined
        before ``close()`` returns.
        """
        self._restart()
        steps = self._steps(step_lines)
        if len(steps) <= 1 or not ahead:  # nothing to overlap, or not asked to: no thread
            for part, at in steps:
                yield self._take(_parse_lines(part, at))
            return
        with ThreadPoolExecutor(1, thread_name_prefix=PARSE_AHEAD_THREAD) as pool:
            next_step = pool.submit(_parse_lines, *steps[0])
            for n in range(len(steps)):
                parsed = next_step.result()
                if n + 1 < len(steps):
                    next_step = pool.submit(_parse_lines, *steps[n + 1])
                yield self._take(parsed)


def _parse_lines(pieces: list[bytes], at: int) -> _Parsed:
    """Parse consecutive lines, the first at offset ``at``: (events, skips, addresses dropped)."""
    events: list[tuple[int, int, LineEvent]] = []
    skips: list[tuple[Skip, int]] = []
    dropped = 0
    crc32, parse, append = zlib.crc32, parse_line, events.append
    # The loop runs once per line of a million-line file: locals only.
    with _cyclic_gc_postponed():
        for raw in pieces:
            parsed = parse(raw)
            if isinstance(parsed, LineEvent):
                append((at, crc32(raw), parsed))
                dropped += parsed.ips_dropped
            else:
                skips.append((parsed, at))
            at += len(raw) + 1
    return events, skips, dropped


@contextmanager
def _cyclic_gc_postponed() -> Iterator[None]:
    """Postpone Python's cycle collector while a chunk is parsed, then restore it.

    The loop allocates a few tracked objects per line and keeps them (the
    events), so the collector keeps re-scanning the growing batch: a third of
    the parse time, measured on the bench. Nothing it builds forms a cycle,
    so there is nothing for the collector to find; reference counting still
    frees everything at once. Left as it was if someone else had switched it off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_chunk(
    data: bytes,
    *,
    offset: int,
    crc: int,
    skipping: bool = False,
    max_lines: int = 10_000,
    final: bool = False,
) -> Chunk:
    """``frame_chunk``, then every line read (``Chunk.parse_all``), in this thread."""
    chunk = frame_chunk(
        data, offset=offset, crc=crc, skipping=skipping, max_lines=max_lines, final=final
    )
    chunk.parse_all()
    return chunk


def frame_chunk(
    data: bytes,
    *,
    offset: int,
    crc: int,
    skipping: bool = False,
    max_lines: int = 10_000,
    final: bool = False,
) -> Chunk:
    """Cut the complete lines of ``data`` (the file's bytes from ``offset``); read none yet.

    ``crc`` is the CRC-32 of the file before ``offset``; the chunk's ``crc``
    continues it over the bytes consumed. ``skipping`` says that ``offset``
    lies inside a line already known to be too long, so everything up to the
    next newline is discarded (and counted once, when it ends). A last line
    without its newline is left alone — the writer may still be writing it —
    unless ``final`` (a rotated file nobody writes any more). A partial line
    that is already longer than any valid line is consumed in skipping mode,
    so a runaway writer cannot make every run re-read it.

    Each event (``Chunk.parsed``) comes with its line's offset and the CRC-32
    of the line's own bytes: together with the file they identify the line.
    """
    chunk = Chunk(offset=offset, skipping=skipping)
    size = len(data)
    pos = lines = 0
    if skipping:
        newline = data.find(b"\n")
        if newline < 0:
            pos = size
            if final:  # the rotated file ends inside the long line: it is over
                chunk.long_line_at = offset
                lines, chunk.skipping = 1, False
        else:
            pos = newline + 1
            chunk.long_line_at = offset
            lines, chunk.skipping = 1, False
    end = data.rfind(b"\n", pos) + 1  # complete lines end here
    pieces = data[pos:end].split(b"\n") if end > pos else [b""]
    pieces[-1:] = []  # after the last newline: b""
    if len(pieces) > max_lines - lines:
        del pieces[max_lines - lines :]
    chunk.first_at = offset + pos
    pos += sum(map(len, pieces)) + len(pieces)  # each line and its newline
    lines += len(pieces)
    if lines < max_lines and pos < size:
        rest = size - pos  # no newline in it
        if final:  # the rotated file's last line, newline or not
            pieces.append(data[pos:])
            pos, lines = size, lines + 1
        elif rest > MAX_LINE_BYTES + 1:
            chunk.skipping = True  # too long already; discard up to its newline
            pos = size
        # else: unfinished, wait for the writer
    chunk.pieces = pieces
    chunk.consumed = min(pos, size)
    chunk.lines = lines
    chunk.crc = zlib.crc32(memoryview(data)[: chunk.consumed], crc)
    if chunk.long_line_at is not None:
        chunk.skip(Skip.TOO_LONG, chunk.long_line_at)
    return chunk
