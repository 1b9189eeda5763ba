"""File I/O of the ingest: open the file once, look at it, read only new bytes.

The decisions live in ``recovery.policy`` (where to resume) and
``recovery.parsing`` (what the bytes say); this module only reads. Every read
is a ``pread`` on one descriptor opened at the start of a run, so a file
renamed or replaced while the run reads it is still read consistently to the
size it had when the run began.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Self

from .parsing import Chunk, parse_chunk
from .policy import HEAD_BYTES, TAIL_BYTES, Position, Probe, fingerprint, signature

MAX_ROTATED_CANDIDATES = 200
# A batch must hold the longest valid line (plus CR LF), or a valid line could
# look over-long just because it straddles two reads.
MIN_BATCH_BYTES = 16 * 1024
_CRC_BLOCK = 1 << 20


class NotAFile(Exception):
    """The path exists but is a directory, a FIFO or a device: reading it makes no sense."""


@dataclass
class OpenFile:
    path: str
    fd: int
    file_id: str
    size: int
    mtime_ns: int

    @classmethod
    def open(cls, path: str) -> Self | None:
        """Open ``path`` for reading; None if it does not exist (nothing to import yet)."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise NotAFile(f"{path} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, f"{info.st_dev}:{info.st_ino}", info.st_size, info.st_mtime_ns)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def signature(self) -> str:
        return signature(self.file_id, self.size, self.mtime_ns)

    def read(self, length: int, offset: int) -> bytes:
        return os.pread(self.fd, max(length, 0), offset)

    # --- fingerprints ---------------------------------------------------------------

    def head(self, offset: int) -> str | None:
        length = min(offset, HEAD_BYTES)
        data = self.read(length, 0)
        return fingerprint(data) if len(data) == length else None

    def tail(self, offset: int) -> str | None:
        start = max(offset - TAIL_BYTES, 0)
        data = self.read(offset - start, start)
        return fingerprint(data) if len(data) == offset - start else None

    def probe(self, at: Position) -> Probe:
        """Fingerprint the ranges ``at`` fingerprinted, to compare them."""
        return Probe(self.file_id, self.size, self.head(at.offset), self.tail(at.offset))

    def crc(self, length: int) -> int | None:
        """CRC-32 of the first ``length`` bytes, or None if the file is shorter."""
        crc, done = 0, 0
        while done < length:
            block = self.read(min(_CRC_BLOCK, length - done), done)
            if not block:
                return None
            crc = zlib.crc32(block, crc)
            done += len(block)
        return crc

    # --- reading -------------------------------------------------------------------------

    def chunks(
        self,
        start: Position,
        *,
        end: int,
        batch_bytes: int,
        batch_lines: int,
        final: bool = False,
    ) -> Iterator[tuple[Chunk, Position]]:
        """Parse complete lines from ``start`` up to byte ``end``: (chunk, position after it).

        A chunk covers at most ``batch_bytes`` bytes and ``batch_lines`` lines.
        An unfinished last line stays unread (unless ``final``).
        """
        if batch_bytes < MIN_BATCH_BYTES:
            raise ValueError(f"batch_bytes must be at least {MIN_BATCH_BYTES}")
        position = start
        while position.offset < end:
            data = self.read(min(batch_bytes, end - position.offset), position.offset)
            if not data:
                return  # the file shrank under us; the next run sees why
            at_end = position.offset + len(data) >= end
            chunk = parse_chunk(
                data,
                offset=position.offset,
                crc=position.crc,
                skipping=position.skipping,
                max_lines=batch_lines,
                final=final and at_end,
            )
            if chunk.consumed == 0:
                # Only an unfinished line is left: batch_bytes exceeds the longest
                # valid line, and parse_chunk consumes anything longer itself.
                return
            after = Position(
                file_id=position.file_id,
                generation=position.generation,
                offset=chunk.end,
                head=self.head(chunk.end) or position.head,
                tail=self.tail(chunk.end) or position.tail,
                crc=chunk.crc,
                skipping=chunk.skipping,
            )
            yield chunk, after
            position = after


def find_rotated(path: str, file_id: str) -> OpenFile | None:
    """The old file after a rotation: a sibling named ``<name>…`` with the old device:inode.

    logrotate's default (``recovery-events.jsonl.1``), date suffixes and
    ``mv file file.old`` all leave it beside the path; a compressed copy is
    a new inode and is not found (its bytes were read before it was made,
    or are lost to compression either way).
    """
    directory, name = os.path.split(path)
    try:
        entries = [entry for entry in os.listdir(directory or ".") if entry.startswith(name)]
    except OSError:
        return None
    for entry in sorted(entries)[:MAX_ROTATED_CANDIDATES]:
        if entry == name:
            continue
        candidate = os.path.join(directory, entry)
        try:
            info = os.stat(candidate)
        except OSError:
            continue
        if f"{info.st_dev}:{info.st_ino}" == file_id and stat.S_ISREG(info.st_mode):
            try:
                return OpenFile.open(candidate)
            except (OSError, NotAFile):
                return None
    return None
