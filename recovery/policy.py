"""Decisions of the recovery app as pure functions: no ORM, no clock reads, no file I/O.

- where ``recovery-events.jsonl`` is (``events_file_path``);
- where an ingest resumes in a file that may have grown, been truncated,
  rewritten, rotated or replaced since the last run (``verdict``, ``plan_start``),
  and the identity of the lines it imports (``file_tag``, ``line_key``);
- the capped per-actor tally of a Security summary row (``tally``: the rule the
  SQL upsert in ``records`` implements, and is tested against);
- the one-paragraph report of an ingest run (``ingest_report``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from durable.policy import truncate_utf8

EVENTS_FILE_NAME = "recovery-events.jsonl"
# WeKan's launch scripts write the file into the SQLite data directory; these
# are the variables they read it from, in the order WeKan itself tries them.
WEKAN_DIR_VARIABLES = ("WEKAN_FERRETDB_SQLITE_DIR", "FERRETDB_SQLITE_DIR", "WEKAN_SQLITE_DIR")

HEAD_BYTES = 4096  # fingerprint: the file's first bytes (up to what was read)
TAIL_BYTES = 256  # and the bytes just before the resume offset
MAX_ACTORS = 50
MAX_ACTOR_CHARS = 150
UNIQUE_KEY_PREFIX = "recovery-ingest:"


# --- where the file is ----------------------------------------------------------------


def events_file_path(
    configured: str | None, environ: Mapping[str, str], base: str = "/"
) -> str | None:
    """``RECOVERY_EVENTS_FILE`` if set, else the WeKan data directory plus the file name.

    A relative path is relative to ``base`` (the project directory, as for the
    SQLite database), not to whatever directory a process was started in: the
    web server, a worker and a management command must all name the same file.
    """
    if configured and configured.strip():
        return os.path.normpath(os.path.join(base, os.path.expanduser(configured.strip())))
    for name in WEKAN_DIR_VARIABLES:
        directory = (environ.get(name) or "").strip()
        if directory:
            directory = os.path.join(base, os.path.expanduser(directory))
            return os.path.normpath(os.path.join(directory, EVENTS_FILE_NAME))
    return None


def ingest_unique_key(path: str) -> str:
    """At most one unfinished ingest per file, however many workers ask for one."""
    key = UNIQUE_KEY_PREFIX + path
    if len(key) <= 255:
        return key
    return UNIQUE_KEY_PREFIX + "sha256:" + hashlib.sha256(path.encode()).hexdigest()


def file_tag(file_id: str, generation: int) -> str:
    """A short name for one file's bytes, in every line's identity: its device:inode and
    generation, never the name it was read under.

    Two names of one file (a hard link, a bind mount) read the same bytes
    under the same tag, so a line is one row whichever name imported it; a
    file that starts again (truncated, rewritten) gets a new generation and
    with it a new tag, so its lines are new even where they repeat old ones.
    """
    return hashlib.sha256(f"{file_id}/{generation}".encode()).hexdigest()[:10]


def line_prefix(tag: str, generation: int) -> str:
    return f"{tag}:{generation:x}:"


def line_key(prefix: str, offset: int, crc: int) -> str:
    """The identity of one imported line, unique in the database.

    ``prefix`` names the file and its generation, which changes whenever the
    path starts a new file (truncated, rewritten, rotated, replaced), so the
    same offset in a new file is a new line. ``crc`` is the line's own CRC-32:
    even if the cursor were lost, a line that is not the one imported at that
    offset never looks imported, while a faithful replay still matches.
    Zero-padded, so one file's keys sort in file order (cheap index appends).
    """
    return f"{prefix}{offset:012x}:{crc:08x}"


def fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


EMPTY_FINGERPRINT = fingerprint(b"")


# --- where to resume ----------------------------------------------------------------------


@dataclass(frozen=True)
class Position:
    """How far the ingest has read the file at its path: the persisted cursor.

    ``file_id`` is ``"device:inode"`` ("" before anything was read). ``head``
    fingerprints bytes ``[0, min(offset, HEAD_BYTES))`` and ``tail`` the
    ``TAIL_BYTES`` before ``offset``; ``crc`` is the CRC-32 of ``[0, offset)``.
    ``skipping`` means ``offset`` is inside an over-long line being discarded.
    ``tag`` and ``generation`` name the bytes in every imported line's
    identity (``line_prefix``).
    """

    file_id: str = ""
    generation: int = 0
    offset: int = 0
    head: str = EMPTY_FINGERPRINT
    tail: str = EMPTY_FINGERPRINT
    crc: int = 0
    skipping: bool = False
    tag: str = ""

    @classmethod
    def fresh(cls, file_id: str) -> Position:
        """A file never read before: from its first byte, generation 0."""
        return cls(file_id=file_id, tag=file_tag(file_id, 0))

    @property
    def prefix(self) -> str:
        return line_prefix(self.tag, self.generation)

    def as_checkpoint(self) -> dict[str, Any]:
        return {
            "file": self.file_id,
            "tag": self.tag,
            "generation": self.generation,
            "offset": self.offset,
            "head": self.head,
            "tail": self.tail,
            "crc": self.crc,
            "skipping": self.skipping,
        }

    def restart(self) -> Position:
        """The same file started again (truncated, rewritten): from its first byte, as a
        new generation with a tag of its own."""
        generation = self.generation + 1
        return Position(
            file_id=self.file_id, generation=generation, tag=file_tag(self.file_id, generation)
        )


@dataclass(frozen=True)
class Probe:
    """What a file shows where ``Position`` says we stopped.

    ``head``/``tail`` are the fingerprints of the same byte ranges as the
    position's, or None when the file is too short to have them.
    """

    file_id: str
    size: int
    head: str | None
    tail: str | None


class Verdict(StrEnum):
    FIRST = "first"  # nothing read from this file yet
    CONTINUE = "continue"  # the same file, grown or not: read on from the offset
    TRUNCATED = "truncated"  # the same file, now shorter than what was read
    REWRITTEN = "rewritten"  # the same file, but the bytes already read changed
    REPLACED = "replaced"  # another file at the path: rotated or replaced


def verdict(saved: Position, probe: Probe) -> Verdict:
    if saved.offset == 0 and not saved.skipping:
        return Verdict.FIRST
    if probe.file_id != saved.file_id:
        return Verdict.REPLACED
    if probe.size < saved.offset:
        return Verdict.TRUNCATED
    if probe.head != saved.head or probe.tail != saved.tail:
        return Verdict.REWRITTEN
    return Verdict.CONTINUE


@dataclass(frozen=True)
class Plan:
    verdict: Verdict
    start: Position
    note: str = ""


def plan_start(
    saved: Position,
    probe: Probe,
    *,
    drained: str = "",
    prefix_crc: int | None = None,
) -> Plan:
    """Where to read the file ``probe`` describes, given how far ``saved`` got.

    ``saved`` is the position in the same file (``probe`` shows it truncated,
    rewritten, grown or as it was) or, when the path now holds another file,
    the position in the file it held before (REPLACED).

    ``drained`` names the file the caller already finished from ``saved``
    on: the old file renamed beside the path (rotation), or a copy of it
    (``copytruncate``), found by ``tailer.find_rotated``. Then the file at
    the path is simply new — read from its first byte.

    Otherwise a file that replaced the old one but starts with exactly the
    bytes already read (at least as long, same fingerprints, same CRC of the
    whole prefix) continues at the offset, under the old lines' identity: it
    *is* the old file, moved — copied to another disk, restored from a
    backup, rewritten through a temporary copy, or seen under a new device
    number after a reboot — and reading it from the start would import
    every line again. (The cost: a genuinely new file that happens to repeat
    every byte already imported has only its additions imported;
    docs/how-to/feed-recovery-events.md, Limits.) Anything else is new: from its
    first byte, under an identity of its own, so nothing new is mistaken for old.
    """
    found = verdict(saved, probe)
    if found is Verdict.FIRST:
        if saved.file_id == probe.file_id and saved.tag:
            return Plan(found, saved)
        return Plan(found, Position.fresh(probe.file_id))
    if found is Verdict.CONTINUE:
        return Plan(found, saved)
    if found in (Verdict.TRUNCATED, Verdict.REWRITTEN):
        if found is Verdict.TRUNCATED:
            note = f"the file was truncated (now {probe.size:,} bytes, {saved.offset:,} were read)"
        else:
            note = "the file was rewritten in place"
        if drained:
            note += f"; the rest of its copy {drained} was read first (copytruncate)"
        return Plan(found, saved.restart(), note)
    if drained:
        note = f"the file was rotated; the rest of the old file ({drained}) was read first"
        return Plan(found, Position.fresh(probe.file_id), note)
    same_prefix = (
        probe.size >= saved.offset
        and probe.head == saved.head
        and probe.tail == saved.tail
        and prefix_crc == saved.crc
    )
    if same_prefix:
        note = f"the file was replaced by one with the same first {saved.offset:,} bytes"
        return Plan(found, replace(saved, file_id=probe.file_id), note)
    return Plan(found, Position.fresh(probe.file_id), "the file was replaced by a new one")


def signature(file_id: str, size: int, mtime_ns: int) -> str:
    """What a heartbeat compares to decide whether the file changed since the last ingest."""
    return f"{file_id}:{size}:{mtime_ns}"


# --- Security summary rows ----------------------------------------------------------------------

_CWE = re.compile(r"^\s*(?:cwe)?[-_ ]?(\d{1,5})\s*$", re.IGNORECASE)


def normalise_cwe(value: Any) -> str:
    """``918``, ``"CWE-918"``, ``"cwe918"`` → ``"CWE-918"``; other text kept, bounded."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 100_000:
        return f"CWE-{value}"
    if not isinstance(value, str):
        return ""
    match = _CWE.match(value)
    if match:
        return f"CWE-{int(match.group(1))}"
    return value.strip()[:16]


def tally(counts: Mapping[str, int] | None, actor: str, cap: int = MAX_ACTORS) -> tuple[dict, int]:
    """Count one more for ``actor``: (new tally, overflow increment).

    The first ``cap`` distinct actors are counted by name; later ones only add
    to the overflow, so an attack from a million addresses costs ``cap``
    entries, not a million.
    """
    result = dict(counts or {})
    if not actor:
        return result, 0
    actor = actor[:MAX_ACTOR_CHARS]
    if actor in result:
        result[actor] += 1
        return result, 0
    if len(result) < cap:
        result[actor] = 1
        return result, 0
    return result, 1


# --- reporting ------------------------------------------------------------------------------


def bounded_json(value: Any, limit: int = 2048) -> Any:
    """``value`` if its JSON fits in ``limit`` bytes, else a marked, truncated text of it."""
    try:
        encoded = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        encoded = repr(value)
    if len(encoded.encode()) <= limit:
        return value
    return {"truncated": truncate_utf8(encoded, limit - 32)}


def ingest_report(
    path: str,
    *,
    imported: int,
    lines: int,
    skipped: Mapping[str, int],
    first_skipped: Mapping[str, int],
    ips_dropped: int,
    notes: list[str],
    labels: Mapping[str, str],
) -> tuple[str, str] | None:
    """(severity, detail) of an ingest run worth telling an operator about, else None.

    Blank lines alone are not worth an event; malformed lines, dropped
    addresses and a rotated/truncated/replaced file are.
    """
    problems = {reason: n for reason, n in skipped.items() if n and reason != "blank"}
    if not problems and not ips_dropped and not notes:
        return None
    parts = [f"Imported {imported:,} of {lines:,} lines from {path}."]
    if problems:
        total = sum(problems.values())
        reasons = ", ".join(
            f"{n:,} {labels.get(reason, reason)} (first at byte {first_skipped.get(reason, 0):,})"
            for reason, n in sorted(problems.items())
        )
        parts.append(f"Skipped {total:,}: {reasons}.")
    if ips_dropped:
        parts.append(f"Dropped {ips_dropped:,} invalid IP address(es).")
    parts.extend(note[:1].upper() + note[1:] + "." for note in notes)
    severity = "warning" if problems or ips_dropped else "info"
    return severity, " ".join(parts)
