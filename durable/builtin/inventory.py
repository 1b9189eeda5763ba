"""Pure decisions of ``integrity.scan``: walk order, batching, and what a change means.

No storage, no database, no clock: the scan passes in a ``listdir``
function and the states it read, so every rule here is table-tested.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

NEW, OK, MODIFIED, CORRUPTED, MISSING = "new", "ok", "modified", "corrupted", "missing"
FINDINGS = (MODIFIED, CORRUPTED, MISSING)
SEVERITY = {CORRUPTED: "error", MODIFIED: "warning", MISSING: "warning"}
_RANK = {"info": 0, "warning": 1, "error": 2}
MAX_DEPTH = 64

Listdir = Callable[[str], tuple[Iterable[str], Iterable[str]]]


@dataclass(frozen=True)
class FileState:
    size: int
    sha256: str
    mtime: float | None  # seconds since the epoch; None when the storage cannot tell


def classify(previous: FileState | None, current: FileState) -> str:
    """What happened to a file since the last scan.

    A content change with the same size *and* the same modification time is
    corruption: nothing wrote the file, yet its bytes differ (bit rot, a
    damaged disk, tampering that reset the time). A change that moved the
    modification time is a write — reported, but as a modification.
    """
    if previous is None:
        return NEW
    if previous.sha256 == current.sha256 and previous.size == current.size:
        return OK
    if (
        previous.size == current.size
        and previous.mtime is not None
        and previous.mtime == current.mtime
    ):
        return CORRUPTED
    return MODIFIED


def severity(statuses: Iterable[str]) -> str:
    """The most severe level among these findings ("info" if none)."""
    return max((SEVERITY.get(s, "info") for s in statuses), key=_RANK.__getitem__, default="info")


def _parts(key: str) -> tuple[str, ...]:
    return tuple(key.split("/")) if key else ()


def keys_after(
    listdir: Listdir, top: str, after: str | None, *, max_depth: int = MAX_DEPTH
) -> Iterator[str]:
    """File keys under ``top`` in a stable order, strictly after the key ``after``.

    The order compares keys as tuples of path components (a directory's
    files come right where the directory sorts), which is exactly the order
    of a depth-first walk with sorted entries — so a scan can resume from its
    last key by skipping whole subtrees that sort before it. Directories
    deeper than ``max_depth`` are not entered: a symbolic link to a parent
    directory would otherwise make the walk endless.
    """
    stop = _parts(after) if after else None

    def walk(parts: tuple[str, ...]) -> Iterator[str]:
        if len(parts) > max_depth:
            return
        dirs, files = listdir("/".join(parts))
        entries = sorted([(name, True) for name in dirs] + [(name, False) for name in files])
        for name, is_dir in entries:
            path = (*parts, name)
            if stop is not None:
                if is_dir and path < stop[: len(path)]:
                    continue  # the whole subtree sorts before the resume point
                if not is_dir and path <= stop:
                    continue
            if is_dir:
                yield from walk(path)
            else:
                yield "/".join(path)

    yield from walk(_parts(top))


def storable(key: str) -> bool:
    """A key the inventory can store: valid UTF-8 (a file name may be any bytes)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def take_batch(keys: Iterator[str], *, max_files: int, max_bytes: int) -> list[str]:
    """The next keys of a batch: at most ``max_files``, and at most ``max_bytes`` as JSON.

    The byte bound keeps a unit's payload small however long the names are;
    a batch always holds at least one key.
    """
    batch: list[str] = []
    size = 2
    for key in keys:
        batch.append(key)
        size += len(json.dumps(key)) + 1
        if len(batch) >= max_files or size >= max_bytes:
            break
    return batch


def clean_prefix(prefix: str) -> str:
    """A relative path inside a storage, without '.', '..' or empty components."""
    parts = [part for part in prefix.strip().strip("/").split("/") if part]
    if any(part in (".", "..") for part in parts) or "\\" in prefix or "\x00" in prefix:
        raise ValueError("must be a relative path inside the storage, without '.' or '..'")
    return "/".join(parts)
