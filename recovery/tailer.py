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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Self

from .parsing import Chunk, frame_chunk
from .policy import HEAD_BYTES, TAIL_BYTES, Position, Probe, fingerprint, signature

MAX_SIBLINGS_SCANNED = 5_000  # names beside the file looked at (a stat each) after a change
MAX_ROTATED_CANDIDATES = 200  # the newest of them considered
MAX_COPY_CANDIDATES = 10  # of which at most this many are read to see if they are a copy
# A batch must hold the longest valid line (plus CR LF), or a valid line could
# look over-long just because it straddles two reads.
MIN_BATCH_BYTES = 16 * 1024
_CRC_BLOCK = 1 << 20


def canonical(path: str) -> str:
    """The one spelling of ``path`` every ingest of it uses: absolute, symlinks resolved.

    A symlinked directory (a snap's ``current`` → its revision), ``..`` and a
    relative name all become the same path, so they share one name record
    and one unique key. (Hard links and bind mounts have no single spelling:
    their cursor is found by device:inode instead — see ``IngestCursor``.)
    """
    return os.path.realpath(os.path.expanduser(path))


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
        batch_lines: int | Callable[[], int],
        final: bool = False,
    ) -> Iterator[tuple[Chunk, Position]]:
        """Cut complete lines from ``start`` up to byte ``end``: (chunk, position after it).

        The lines are not read yet: ``Chunk.parsed`` does that, where they are
        written, so parsing overlaps the database's work.

        A chunk covers at most ``batch_bytes`` bytes and ``batch_lines`` lines
        (a number, or a function asked before each chunk: ``Pacer.size``).
        An unfinished last line stays unread (unless ``final``).
        """
        if batch_bytes < MIN_BATCH_BYTES:
            raise ValueError(f"batch_bytes must be at least {MIN_BATCH_BYTES}")
        position = start
        while position.offset < end:
            max_lines = batch_lines() if callable(batch_lines) else batch_lines
            data = self.read(min(batch_bytes, end - position.offset), position.offset)
            if not data:
                return  # the file shrank under us; the next run sees why
            at_end = position.offset + len(data) >= end
            chunk = frame_chunk(
                data,
                offset=position.offset,
                crc=position.crc,
                skipping=position.skipping,
                max_lines=max_lines,
                final=final and at_end,
            )
            if chunk.consumed == 0:
                # Only an unfinished line is left: batch_bytes exceeds the longest
                # valid line, and frame_chunk consumes anything longer itself.
                return
            after = Position(
                file_id=position.file_id,
                generation=position.generation,
                tag=position.tag,
                offset=chunk.end,
                head=self.head(chunk.end) or position.head,
                tail=self.tail(chunk.end) or position.tail,
                crc=chunk.crc,
                skipping=chunk.skipping,
            )
            yield chunk, after
            position = after


def siblings(path: str) -> list[tuple[str, os.stat_result]]:
    """Regular files beside ``path`` whose names start with its name, newest first.

    Ranked by modification time, not by name: with ``dateext``, or dozens of
    ``.N.gz`` beside it, the file rotated a moment ago may sort anywhere.
    Bounded: the first ``MAX_SIBLINGS_SCANNED`` matching names in directory
    order are looked at (a stat each), the newest ``MAX_ROTATED_CANDIDATES`` kept.
    """
    directory, name = os.path.split(path)
    found = []
    try:
        with os.scandir(directory or ".") as entries:
            for entry in entries:
                if entry.name == name or not entry.name.startswith(name):
                    continue
                try:
                    info = entry.stat()
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    found.append((entry.path, info))
                if len(found) >= MAX_SIBLINGS_SCANNED:
                    break
    except OSError:
        return []
    found.sort(key=lambda item: (item[1].st_mtime_ns, item[0]), reverse=True)
    return found[:MAX_ROTATED_CANDIDATES]


def find_rotated(
    path: str, saved: Position, *, known: Callable[[str], bool] = lambda file_id: False
) -> OpenFile | None:
    """The rest of the file ``saved`` was reading, now beside ``path``; None if not found.

    - Renamed (logrotate's default ``create``, ``dateext``, ``mv file file.old``):
      a sibling with the saved device:inode, its bytes unchanged up to the offset.
    - Copied (``copytruncate``: the lines written since the last look exist
      only in the copy, a new inode): a sibling whose first ``saved.offset``
      bytes are exactly the ones read (fingerprints, then the CRC of all of
      them). Files ``known`` to the ingest already (it follows or finished
      them) are not taken for a copy: an older rotation that happens to begin
      with the same bytes was imported on its own.

    A compressed copy is never found (its bytes differ): lines appended to a
    file that was then compressed before the next look are lost
    (docs/how-to/feed-recovery-events.md, Limits).
    """
    if saved.offset == 0 and not saved.skipping:
        return None  # nothing was read: nothing to finish
    candidates = siblings(path)
    for candidate, info in candidates:
        if f"{info.st_dev}:{info.st_ino}" == saved.file_id:
            opened = _open_if(candidate, saved, same_file=True)
            if opened is not None:
                return opened
    copies = 0
    for candidate, info in candidates:
        file_id = f"{info.st_dev}:{info.st_ino}"
        if file_id == saved.file_id or info.st_size < saved.offset or known(file_id):
            continue
        copies += 1
        if copies > MAX_COPY_CANDIDATES:
            break
        opened = _open_if(candidate, saved, same_file=False)
        if opened is not None:
            return opened
    return None


def _open_if(candidate: str, saved: Position, *, same_file: bool) -> OpenFile | None:
    """``candidate`` opened if its bytes up to ``saved.offset`` are the ones read, else None."""
    try:
        opened = OpenFile.open(candidate)
    except (OSError, NotAFile):
        return None
    if opened is None:
        return None
    probe = opened.probe(saved)
    matches = opened.size >= saved.offset and probe.head == saved.head and probe.tail == saved.tail
    # The same inode with unchanged fingerprints is the file we read; a copy
    # must also prove every byte before the offset (one sequential read).
    if matches and (same_file or opened.crc(saved.offset) == saved.crc):
        return opened
    opened.close()
    return None
