"""``files.move``: move files from one Django storage to another, one file per unit.

A unit copies one file, hashing the bytes as it reads them, checks that the
source did not change meanwhile (a local source: same size and nanosecond
mtime after as before; another storage: hashed once more before the copy),
verifies the copy — size and SHA-256 of the bytes now at the destination,
and, between two local storages, the modification time — and only then
deletes the source. Every step is safe to repeat:

- destination absent: copy, verify, delete the source;
- destination present with the source's exact bytes (a replay after a
  crash between copy and delete): no copy again, just the delete;
- destination shorter than the source and equal to its first bytes (a copy
  cut short by a crash): ours, removed and copied again;
- destination present with other bytes: somebody else's file. The source is
  left in place and the unit fails as non-retryable (or, with
  ``on_conflict: "skip"``, both are kept and the file is counted as skipped);
- source absent, destination present (a crash after the delete): done;
  neither present: the file vanished meanwhile, counted, not an error.

A copy whose bytes do not verify is removed again, the source is left
untouched, and the unit fails with the reason and both checksums. That
failure is retried with backoff (the usual cause is a source being written
while it was copied, or a flaky network storage); once the attempts are
spent the job fails with that reason, naming the file.

The checkpoint is the last name done; names are listed in lexicographic
order, so a resumed job never lists what it already moved, and files that
arrive during the move are picked up by a second listing if their names sort
after the checkpoint (others wait for the next move).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import SuspiciousFileOperation
from django.core.files import File
from django.core.files.storage import FileSystemStorage, InvalidStorageError, Storage, storages
from django.core.files.utils import validate_file_name

from .. import faults
from ..errors import InputRejected, NonRetryable, Unavailable, VerificationFailed
from ..models import UnitResult
from ..operations import Access, JobContext, Operation, Unit, register

log = logging.getLogger("durable.op.files.move")

CHUNK_BYTES = 1024 * 1024
MAX_NAME_CHARS = 1024
MAX_KEY_NAME_CHARS = 240
ON_CONFLICT = ("fail", "skip")
LISTING_PASSES = 2
STATICFILES = "staticfiles"  # collectstatic's storage: never moved out from under the site

# --- pure helpers -------------------------------------------------------------------------------


def unit_key(name: str) -> str:
    """The unit's idempotency key: the name itself, or its digest when too long for a key."""
    if len(name) <= MAX_KEY_NAME_CHARS:
        return f"file:{name}"
    return "file-sha256:" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()


def clean_name(value: Any, field: str) -> str:
    """A storage name: relative, ``/``-separated, no ``..``, no NUL; else InputRejected."""
    if not isinstance(value, str) or not value.strip():
        raise InputRejected(field, "a file name is text")
    name = value.strip().replace("\\", "/")
    if len(name) > MAX_NAME_CHARS or "\x00" in name:
        raise InputRejected(field, f"at most {MAX_NAME_CHARS} characters, no NUL")
    try:
        validate_file_name(name, allow_relative_path=True)
    except SuspiciousFileOperation:
        raise InputRejected(field, f"{name!r} must be relative, without '..'") from None
    return name


def clean_prefix(value: Any) -> str:
    """A name prefix (``""`` = everything); ``reports/`` is a directory, ``reports`` is not."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        raise InputRejected("prefix", "a name prefix is text")
    prefix = value.strip().replace("\\", "/")
    if len(prefix) > MAX_NAME_CHARS or "\x00" in prefix:
        raise InputRejected("prefix", f"at most {MAX_NAME_CHARS} characters, no NUL")
    if prefix.startswith("/") or ".." in prefix.split("/"):
        raise InputRejected("prefix", "must be relative to the storage, without '..'")
    return prefix


def roots_overlap(first: str, second: str) -> bool:
    """True if two directories are the same or one contains the other (a move would loop)."""
    a = os.path.realpath(first).rstrip("/") + "/"
    b = os.path.realpath(second).rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def iter_names(storage: Storage, prefix: str = "", after: str = "") -> Iterator[str]:
    """Names under ``prefix`` in lexicographic order, strictly after ``after``; lazily.

    A directory sorts as its name plus ``/`` — where its contents sort — so
    walking each directory's sorted entries yields the global order, and a
    whole subtree before ``after`` is skipped without being listed.
    Symbolic links to directories are not followed on local storages.
    """
    base = prefix.rpartition("/")[0]
    yield from _walk(storage, base, prefix, after)


def _walk(storage: Storage, directory: str, prefix: str, after: str) -> Iterator[str]:
    try:
        dirs, files = storage.listdir(directory)
    except FileNotFoundError:  # not there (yet), or removed meanwhile
        return
    join = (lambda entry: f"{directory}/{entry}") if directory else (lambda entry: entry)
    entries = sorted([(join(d) + "/", True) for d in dirs] + [(join(f), False) for f in files])
    local = isinstance(storage, FileSystemStorage)
    for path, is_dir in entries:
        if is_dir:
            inside = path.startswith(prefix) or prefix.startswith(path)
            done = after >= path and not after.startswith(path)  # all of it sorts ≤ after
            if not inside or (after and done):
                continue
            if local and os.path.islink(storage.path(path[:-1])):
                continue
            yield from _walk(storage, path[:-1], prefix, after)
        elif path.startswith(prefix) and path > after:
            yield path


# --- storages -----------------------------------------------------------------------------------


def storage_named(alias: str) -> Storage:
    try:
        return storages[alias]
    except InvalidStorageError:
        raise Unavailable(
            f"no storage named {alias!r} is configured on this worker; add it to FILE_STORAGES "
            "(name=/path) or STORAGES, then resume the job"
        ) from None


def local_root(storage: Storage) -> str | None:
    return str(storage.location) if isinstance(storage, FileSystemStorage) else None


def check_reachable(alias: str, storage: Storage) -> None:
    """A local root that is missing is an unmounted disk, not an empty one: pause."""
    root = local_root(storage)
    if root is not None and not os.path.isdir(root):
        raise Unavailable(
            f"storage {alias!r}: {root} does not exist or is not a directory (not mounted?); "
            "mount or create it, then resume the job"
        )


def _access_error(exc: OSError, what: str) -> Exception:
    """Permission and full disks are for an operator (pause); anything else is retried."""
    if isinstance(exc, PermissionError):
        return Unavailable(f"{what}: permission denied; give the worker's user access, then resume")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Unavailable(f"{what}: no space left; free some, then resume the job")
    return exc


def digest(storage: Storage, name: str, limit: int | None = None) -> tuple[int, str]:
    """(size, SHA-256 hex) of the stored bytes, or of the first ``limit`` bytes."""
    sha = hashlib.sha256()
    size = 0
    with storage.open(name, "rb") as handle:
        while limit is None or size < limit:
            want = CHUNK_BYTES if limit is None else min(CHUNK_BYTES, limit - size)
            chunk = handle.read(want)
            if not chunk:
                break
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


class _HashingReader:
    """A source file as the destination storage reads it, hashed on the way through."""

    def __init__(self, handle: Any, size: int) -> None:
        self.handle = handle
        self.size = size
        self.sha = hashlib.sha256()
        self.read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        chunk = self.handle.read(n)
        self.sha.update(chunk)
        self.read_bytes += len(chunk)
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise OSError("the copy can only be rewound to the start")
        self.sha = hashlib.sha256()
        self.read_bytes = 0
        return self.handle.seek(0)

    def tell(self) -> int:
        return self.read_bytes

    def seekable(self) -> bool:
        return True


# --- the operation -------------------------------------------------------------------------------


def _storage_choices() -> list[tuple[str, str]]:
    return [(alias, alias) for alias in settings.STORAGES if alias != STATICFILES]


class MoveFilesForm(forms.Form):
    source = forms.ChoiceField(label="From storage")
    destination = forms.ChoiceField(label="To storage")
    prefix = forms.CharField(
        required=False,
        max_length=MAX_NAME_CHARS,
        help_text="Only names starting with this; end it with / for a directory. Empty: all.",
    )
    names = forms.CharField(
        required=False, widget=forms.Textarea, help_text="Or exactly these names, one per line."
    )
    on_conflict = forms.ChoiceField(
        choices=[
            ("fail", "Stop (fail the job) when the destination has a different file"),
            ("skip", "Skip such a file and keep both"),
        ],
        initial="fail",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = _storage_choices()
        self.fields["source"].choices = choices
        self.fields["destination"].choices = choices

    def clean_names(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["names"].splitlines() if line.strip()]


@register
class MoveFiles(Operation):
    name = "files.move"
    label = "Move files between storages"
    description = (
        "Copies each file, verifies size and SHA-256 at the destination, then deletes the source."
    )
    max_attempts = 5
    backoff_base, backoff_max = 5.0, 600.0
    unit_timeout = 3600.0
    input_form = MoveFilesForm
    # It deletes the sources and writes into any configured storage.
    access = Access.PRIVILEGED

    def unique_key(self, data: dict[str, Any]) -> str:
        """One unfinished move between two storages, whichever way and whatever the names.

        Two moves over the same pair could race for one file (one's copy seen as
        the other's finished destination), and a move back the other way while
        the first runs could delete the only copy. Either order of the pair gives
        the same key.
        """
        first, second = sorted((data["source"], data["destination"]))
        return f"files.move:{first}<->{second}"

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        aliases = {}
        for field in ("source", "destination"):
            alias = data.get(field)
            if not isinstance(alias, str) or alias not in settings.STORAGES:
                known = ", ".join(sorted(set(settings.STORAGES) - {STATICFILES}))
                raise InputRejected(field, f"no storage named {alias!r}; configured: {known}")
            if alias == STATICFILES:
                raise InputRejected(field, "static files belong to collectstatic, not to moves")
            aliases[field] = alias
        if aliases["source"] == aliases["destination"]:
            raise InputRejected("destination", "must be another storage than the source")
        roots = [local_root(storages[alias]) for alias in aliases.values()]
        if None not in roots and roots_overlap(*roots):
            raise InputRejected(
                "destination", f"{roots[1]} and {roots[0]} overlap: a move would loop or destroy"
            )
        names = data.get("names") or []
        if not isinstance(names, list):
            raise InputRejected("names", "a list of file names")
        cleaned = sorted({clean_name(name, "names") for name in names})
        prefix = clean_prefix(data.get("prefix"))
        if cleaned and prefix:
            raise InputRejected("prefix", "give a prefix or a list of names, not both")
        on_conflict = data.get("on_conflict", "fail")
        if on_conflict not in ON_CONFLICT:
            raise InputRejected("on_conflict", "fail or skip")
        return {**aliases, "prefix": prefix, "names": cleaned, "on_conflict": on_conflict}

    # --- planning ----------------------------------------------------------------------------

    def _storages(self, ctx: JobContext) -> tuple[Storage, Storage]:
        source, destination = ctx.input["source"], ctx.input["destination"]
        src, dst = storage_named(source), storage_named(destination)
        check_reachable(source, src)
        check_reachable(destination, dst)
        roots = [local_root(src), local_root(dst)]
        if None not in roots and roots_overlap(*roots):
            raise NonRetryable(f"{roots[1]} and {roots[0]} overlap: refusing to move")
        return src, dst

    def prepare(self, ctx: JobContext) -> None:
        self._storages(ctx)

    def _names(self, ctx: JobContext, src: Storage, after: str | None = None) -> Iterator[str]:
        if after is None:
            after = (ctx.checkpoint or {}).get("after", "")
        if ctx.input["names"]:
            return (name for name in ctx.input["names"] if name > after)
        return iter_names(src, ctx.input["prefix"], after)

    def total_units(self, ctx: JobContext) -> int:
        src, _ = self._storages(ctx)
        return ctx.units_done + sum(1 for _ in self._names(ctx, src)) + 1

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        src, _ = self._storages(ctx)
        checkpoint = ctx.checkpoint or {}
        last = checkpoint.get("after", "")
        if not checkpoint.get("done"):
            # A second listing after the first picks up files that arrived during
            # the move (names after the last one moved); later ones wait for the next move.
            for _ in range(LISTING_PASSES):
                found = False
                for name in self._names(ctx, src, after=last):
                    found, last = True, name
                    yield Unit(
                        key=unit_key(name), payload={"name": name}, checkpoint={"after": name}
                    )
                if not found or ctx.input["names"]:
                    break
        yield Unit(key="summary", payload={}, checkpoint={"after": last, "done": True})

    # --- one file --------------------------------------------------------------------------------

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        src, dst = self._storages(ctx)
        if unit.key == "summary":
            return self._summarise(ctx)
        name = unit.payload["name"]
        where = f"{ctx.input['source']}:{name}"
        try:
            return self._move(ctx, src, dst, name)
        except OSError as exc:
            mapped = _access_error(exc, where)
            if mapped is exc:
                raise
            raise mapped from exc

    def _move(self, ctx: JobContext, src: Storage, dst: Storage, name: str) -> dict[str, Any]:
        destination = ctx.input["destination"]
        result: dict[str, Any] = {"name": name}
        if not src.exists(name):
            if dst.exists(name):  # moved before a crash, which lost the checkpoint
                size, sha = digest(dst, name)
                return {**result, "outcome": "already_moved", "size": size, "sha256": sha}
            return {**result, "outcome": "vanished"}
        expected: tuple[int, str] | None = None
        if dst.exists(name):
            size, sha = expected = digest(src, name)
            dst_size, dst_sha = digest(dst, name)
            if (dst_size, dst_sha) == (size, sha):
                # Copied and verified before a crash that came before the delete:
                # finish the delete, do not copy again.
                src.delete(name)
                return {**result, "outcome": "moved", "copied": False, "size": size, "sha256": sha}
            if dst_size < size and digest(src, name, limit=dst_size)[1] == dst_sha:
                ctx.logger.info("removing a copy cut short", extra={"file": name})
                dst.delete(name)  # our own copy, cut short by a crash
            elif ctx.input["on_conflict"] == "skip":
                return {**result, "outcome": "conflict_skipped", "size": size, "sha256": sha,
                        "destination_sha256": dst_sha}  # fmt: skip
            else:
                raise NonRetryable(
                    f"{destination}:{name} already exists with other content ({dst_size:,} "
                    f"bytes, sha256 {dst_sha[:16]}…; the source has {size:,} bytes, sha256 "
                    f"{sha[:16]}…). The source is left in place: remove or rename one of "
                    "them and retry, or move with on_conflict=skip."
                )
        size, sha = self._copy(src, dst, name, expected)
        self._verify(ctx, src, dst, name, size, sha)
        faults.reach("files.after_copy")
        src.delete(name)
        return {**result, "outcome": "moved", "copied": True, "size": size, "sha256": sha}

    def _copy(
        self, src: Storage, dst: Storage, name: str, expected: tuple[int, str] | None
    ) -> tuple[int, str]:
        """Copy, hashing what is read; returns (size, SHA-256) of the source's bytes.

        Those are the bytes written only if the source did not change during
        the copy: checked against ``expected`` (hashed before), or — for a
        local source, to save a read — against its size and nanosecond mtime
        before and after. A remote source without ``expected`` is hashed first.
        """
        src_path = _local_path(src, name)
        before = _stamp(src_path) if src_path else None
        if before is None and expected is None:
            expected = digest(src, name)
        with src.open(name, "rb") as handle:
            reader = _HashingReader(handle, expected[0] if expected else before[0])
            try:
                saved = dst.save(name, File(reader, name=name))
            except BaseException:
                if dst.exists(name):
                    dst.delete(name)  # a partial copy of ours: never leave it behind
                raise
        if saved != name:  # the name was taken between our look and the save
            dst.delete(saved)
            raise VerificationFailed(
                f"{name}: the destination stored it as {saved!r} (the name was taken meanwhile); "
                "removed that copy, will look again"
            )
        read = (reader.read_bytes, reader.sha.hexdigest())
        if expected is not None:
            unchanged = read == expected
        else:
            unchanged = _stamp(src_path) == before and read[0] == before[0]
        if not unchanged:
            dst.delete(name)
            raise VerificationFailed(
                f"{name}: the source changed while it was copied ({read[0]:,} bytes read); "
                "removed the copy, the source is untouched"
            )
        dst_path = _local_path(dst, name)
        if src_path and dst_path:  # keep the modification time between local storages
            info = os.stat(src_path)
            os.utime(dst_path, ns=(info.st_atime_ns, info.st_mtime_ns))
        return read

    def _verify(
        self,
        ctx: JobContext,
        src: Storage,
        dst: Storage,
        name: str,
        size: int,
        sha: str,
    ) -> None:
        """The copy's bytes (and kept metadata) agree, or it is removed and the unit fails."""
        got_size, got_sha = digest(dst, name)
        problems = []
        if (got_size, got_sha) != (size, sha):
            problems.append(
                f"{got_size:,} bytes with sha256 {got_sha} at the destination, "
                f"{size:,} bytes with sha256 {sha} at the source"
            )
        src_path, dst_path = _local_path(src, name), _local_path(dst, name)
        if src_path and dst_path:
            src_mtime, dst_mtime = os.stat(src_path).st_mtime, os.stat(dst_path).st_mtime
            if int(src_mtime) != int(dst_mtime):
                problems.append(
                    f"modification time {dst_mtime:.0f} is not the source's {src_mtime:.0f}"
                )
        if not problems:
            return
        dst.delete(name)
        raise VerificationFailed(
            f"{ctx.input['destination']}:{name} does not match its source: {'; '.join(problems)}. "
            "The copy was removed; the source is untouched."
        )

    def _summarise(self, ctx: JobContext) -> dict[str, Any]:
        outcomes: Counter = Counter()
        moved_bytes = 0
        for result in UnitResult.objects.filter(job_id=ctx.job_id).values_list("result", flat=True):
            if isinstance(result, dict) and "outcome" in result:
                outcomes[result["outcome"]] += 1
                if result["outcome"] == "moved":
                    moved_bytes += result.get("size", 0)
        moved = outcomes["moved"] + outcomes["already_moved"]
        message = f"moved {moved:,} file(s), {moved_bytes:,} bytes"
        if outcomes["conflict_skipped"]:
            message += f"; skipped {outcomes['conflict_skipped']:,} that exist at the destination"
        if outcomes["vanished"]:
            message += f"; {outcomes['vanished']:,} vanished before they were moved"
        summary = {"summary": dict(outcomes), "bytes": moved_bytes}
        ctx.event("moved", message, **summary)
        return summary


def _local_path(storage: Storage, name: str) -> str | None:
    return storage.path(name) if isinstance(storage, FileSystemStorage) else None


def _stamp(path: str) -> tuple[int, int]:
    """(size, mtime in ns): a local file that kept both was not written meanwhile."""
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns
