"""Backup directories on disk: staging, part files, publishing, verification.

A backup named ``NAME`` is staged in ``<backup dir>/.NAME.partial-<job id>/``
and becomes ``<backup dir>/NAME/`` by one ``rename`` once its manifest and
checksum list are written and synced. Readers only accept a directory with
both, whose every file matches its recorded SHA-256.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

from .manifest import MANIFEST, SUMS, inventory_problems, manifest_files, parse_sums, shape_problems
from .tables import TableDigest, row_bytes

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# A backup's staging directory, and (``snapshot``) the directory of its SQLite snapshot:
# beside the staging directory, not in it, so publishing does not take the snapshot away
# while the job's saved progress still reads from it.
STAGING = re.compile(
    r"^\.(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})\.(?:partial|snapshot)-(?P<job>\d+)$"
)
MAX_REPORTED_PROBLEMS = 5
CHUNK = 1 << 20


class BackupDamaged(Exception):
    """The backup is partial, damaged or not a backup; the message says what is wrong."""


def backup_root() -> Path:
    return Path(settings.DURABLE_BACKUP_DIR)  # default: durable.conf


def check_name(name: str) -> str:
    """A backup name is one path component: letters, digits, ``.``, ``_``, ``-``."""
    if not isinstance(name, str) or not NAME.match(name) or name.endswith(".tmp"):
        raise ValueError(
            "must be 1-100 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def staging_dir(root: Path, name: str, job_id: int) -> Path:
    return root / f".{name}.partial-{job_id}"


def snapshot_dir(root: Path, name: str, job_id: int) -> Path:
    return root / f".{name}.snapshot-{job_id}"


def staging_dirs(root: Path) -> Iterator[tuple[Path, int]]:
    """Staging and snapshot directories with their job ids (a finished job's are leftovers)."""
    if not root.is_dir():
        return
    for entry in root.iterdir():
        match = STAGING.match(entry.name)
        if match and entry.is_dir():
            yield entry, int(match["job"])


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write, sync, then rename into place: a reader sees the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def encode_part(header: dict[str, Any], rows: list[list[Any]]) -> bytes:
    """Gzip-compressed JSON Lines: a header line, then one JSON array per row.

    ``mtime=0`` keeps the bytes a function of the rows alone.
    """
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(json.dumps(header, ensure_ascii=False).encode() + b"\n")
        for row in rows:
            gz.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
    return buffer.getvalue()


def decode_part(data: bytes, *, name: str) -> tuple[dict[str, Any], list[list[Any]]]:
    try:
        lines = gzip.decompress(data).decode().splitlines()
        header = json.loads(lines[0])
        rows = [json.loads(line) for line in lines[1:] if line]
    except (OSError, EOFError, UnicodeDecodeError, ValueError, IndexError, zlib.error) as exc:
        raise BackupDamaged(f"{name} cannot be read: {exc}") from None
    if not isinstance(header, dict) or not all(isinstance(row, list) for row in rows):
        raise BackupDamaged(f"{name} is not a part file (header or rows malformed)")
    return header, rows


def file_digest(path: Path) -> tuple[int, str] | None:
    """(bytes, SHA-256) of a file, streamed; None if it is not there."""
    sha = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK):
                sha.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return None
    return size, sha.hexdigest()


def _summary(problems: list[str]) -> str:
    shown = "; ".join(problems[:MAX_REPORTED_PROBLEMS])
    more = len(problems) - MAX_REPORTED_PROBLEMS
    return shown + (f"; and {more} more" if more > 0 else "")


def verify(path: Path) -> dict[str, Any]:
    """Check a published backup completely; return its manifest or raise ``BackupDamaged``.

    Nothing is trusted before its checksum matched: the manifest is parsed
    only after its SHA-256 agreed with SHA256SUMS. Then every part is read
    once, as a stream (memory stays at one line, whatever the size of the
    parts): its size and SHA-256 against both lists, and its rows decoded —
    the header's columns, the row count and every table's digest must agree
    with the manifest, so a part whose checksums were redone after an edit is
    caught too.
    """
    if not path.is_dir():
        raise BackupDamaged(f"there is no backup directory at {path}")
    sums_path, manifest_path = path / SUMS, path / MANIFEST
    if not sums_path.is_file():
        raise BackupDamaged(
            f"{SUMS} is missing from {path}: a backup is published with its checksums last, "
            "so this one is partial or damaged"
        )
    if not manifest_path.is_file():
        raise BackupDamaged(f"{MANIFEST} is missing from {path}: the backup is partial or damaged")
    try:
        sums = parse_sums(sums_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BackupDamaged(f"{SUMS} is damaged: {exc}") from None
    raw = manifest_path.read_bytes()  # small: the list of tables and parts
    if sums.pop(MANIFEST, None) != hashlib.sha256(raw).hexdigest():
        raise BackupDamaged(f"{MANIFEST} does not match its SHA-256 in {SUMS}")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise BackupDamaged(f"{MANIFEST} is not valid JSON: {exc}") from None
    if problems := shape_problems(manifest):
        raise BackupDamaged(_summary(problems))
    expected = manifest_files(manifest)
    actual: dict[str, tuple[int, str] | None] = {}
    row_problems: list[str] = []
    for table in manifest["tables"]:
        digest = TableDigest()
        for part in table["parts"]:
            name = part["file"]
            actual[name] = _stream_part(path / name, name, table, part, digest, row_problems)
        if digest.hexdigest() != table.get("digest"):
            row_problems.append(f"{table['model']}: the rows do not match the manifest's digest")
    actual.update({name: file_digest(path / name) for name in set(sums) - set(expected)})
    if problems := inventory_problems(expected, sums, actual):
        raise BackupDamaged(_summary(problems))
    if row_problems:
        raise BackupDamaged(_summary(row_problems))
    return manifest


class _HashingFile:
    """A file read through: counts and hashes every byte on the way (for ``gzip``)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self.handle.read(n if n is not None and n >= 0 else CHUNK)
        self.sha.update(data)
        self.size += len(data)
        return data


def _stream_part(
    path: Path,
    name: str,
    table: dict[str, Any],
    part: dict[str, Any],
    digest: TableDigest,
    problems: list[str],
) -> tuple[int, str] | None:
    """Read one part once: (bytes, SHA-256) of the file; its rows go into ``digest``.

    None if the file is not there. What is wrong with its rows is added to
    ``problems``.
    """
    width = len(table["columns"])
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, after the rest is hashed
    except (FileNotFoundError, IsADirectoryError):
        return None
    with handle:
        hashing = _HashingFile(handle)
        rows = 0
        try:
            # Read forward only: gzip calls read(), never the seek() its type asks for.
            with gzip.GzipFile(fileobj=hashing, mode="rb") as gz:  # type: ignore[call-overload]
                header = json.loads(gz.readline() or b"null")
                if not isinstance(header, dict):
                    raise ValueError("no header line")
                if header.get("columns") != table["columns"]:
                    problems.append(f"{name}: its header's columns differ from the manifest's")
                narrow = False
                for line in gz:
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    if not isinstance(row, list):
                        raise ValueError("a row is not a JSON array")
                    rows += 1
                    if len(row) != width and not narrow:
                        problems.append(f"{name}: a row has {len(row)} values, expected {width}")
                        narrow = True
                    digest.add(row_bytes(row))
        except (OSError, EOFError, UnicodeDecodeError, ValueError, zlib.error) as exc:
            problems.append(f"{name} cannot be read: {exc}")
        else:
            if rows != part["rows"]:
                problems.append(f"{name}: {rows} rows, the manifest recorded {part['rows']}")
        while hashing.read(CHUNK):  # whatever gzip did not need counts for the checksum too
            pass
        return hashing.size, hashing.sha.hexdigest()


def read_part(path: Path, part: dict[str, Any], columns: list[str]) -> list[list[Any]]:
    """One part's rows, checked again against the manifest's SHA-256 and row count."""
    name = part["file"]
    try:
        data = (path / name).read_bytes()
    except FileNotFoundError:
        raise BackupDamaged(f"{name} disappeared after the backup was verified") from None
    if hashlib.sha256(data).hexdigest() != part["sha256"]:
        raise BackupDamaged(f"{name} changed after the backup was verified (SHA-256 mismatch)")
    header, rows = decode_part(data, name=name)
    if header.get("columns") != columns:
        raise BackupDamaged(f"{name}: its header's columns differ from the manifest's")
    if len(rows) != part["rows"]:
        raise BackupDamaged(f"{name}: {len(rows)} rows, the manifest recorded {part['rows']}")
    return rows
