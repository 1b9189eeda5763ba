"""``files.move``: move files from one Django storage to another, one file per unit.

A unit copies one file to a **temporary name of its own** in the destination
directory — ``.durable-move-<job>-<digest of the name>.part``, so no other job
and no other file can share it — hashing the bytes as it reads them, checks
that the source did not change meanwhile (a local source: same size and
nanosecond mtime after as before; another storage: hashed once more before
the copy), keeps the modification time between local storages, and verifies
the copy: size and SHA-256 of the bytes now there, and the modification
time. Only then is the copy published under its real name, **never over an
existing file** (a hard link, which fails if the name exists; other storages:
``save``, which picks another name rather than overwrite), the temporary name
removed, and the source deleted — in that order: once the source is gone the
name is never listed again, so nothing would come back for a temporary name
left after it. Every step is safe to repeat:

- destination absent: copy to the temporary name, verify, publish, drop the
  temporary name, delete the source;
- destination present and *ours* — the same file as our temporary name (a
  crash between publishing and dropping the temporary name): the
  modification time is applied again and the copy verified again, then the
  temporary name is dropped and the source deleted; no second copy;
- destination present, not ours, with the source's bytes and modification
  time (somebody else's copy, or ours after a crash between dropping the
  temporary name and deleting the source): nothing would be lost, the
  source is deleted;
- destination present with anything else (other bytes, a shorter file, an
  empty file, the same bytes with another modification time): somebody
  else's file, never touched. The source is left in place and the unit
  fails as non-retryable (or, with ``on_conflict: "skip"``, both are kept and
  the file is counted as skipped);
- source absent, destination present (a crash after the delete): done;
  neither present: the file vanished meanwhile, counted, not an error.

A unit only ever deletes its own temporary name (and, when it finds one left
by a crash, the file published from it if the source has changed since):
never a file it did not create, and never another job's copy in progress.

A copy whose bytes do not verify is removed again, the source is left
untouched, and the unit fails with the reason and both checksums. That
failure is retried with backoff (the usual cause is a source being written
while it was copied, or a flaky network storage); once the attempts are
spent the job fails with that reason, naming the file.

The checkpoint is the last name done; names are listed in lexicographic
order, so a resumed job never lists what it already moved, and files that
arrive during the move are picked up by a second listing if their names sort
after the checkpoint (others wait for the next move). Temporary names are
never listed as files to move.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
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
TEMPORARY = re.compile(r"(?:^|/)\.durable-move-\d+-[0-9a-f]{16}\.part$")

# --- pure helpers -------------------------------------------------------------------------------


def unit_key(name: str) -> str:
    """The unit's idempotency key: the name itself, or its digest when too long for a key."""
    if len(name) <= MAX_KEY_NAME_CHARS:
        return f"file:{name}"
    return "file-sha256:" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()


def temporary_name(name: str, job_id: int) -> str:
    """Where job ``job_id`` copies ``name`` before publishing it: beside it, its own.

    Tagged with the job and a digest of the name (the unit's identity), so two
    jobs moving the same name never share it, and short whatever the name's
    length.
    """
    directory, _, _ = name.rpartition("/")
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    base = f".durable-move-{job_id}-{digest}.part"
    return f"{directory}/{base}" if directory else base


def is_temporary(name: str) -> bool:
    return TEMPORARY.search(name) is not None


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
        elif path.startswith(prefix) and path > after and not is_temporary(path):
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
    source = forms.ChoiceField(label="From storage", choices=_storage_choices)
    destination = forms.ChoiceField(label="To storage", choices=_storage_choices)
    # The metaclass moves fields into declared_fields: this never shadows BaseForm.prefix.
    prefix = forms.CharField(  # type: ignore[assignment]
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
    # No unit_timeout: a unit is one file, and copying a large one over a slow link may
    # take hours. Past a timeout the worker process would exit (status 70) and the
    # attempt be spent, every attempt again: the file could never be moved.
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
        src_root, dst_root = (local_root(storages[alias]) for alias in aliases.values())
        if src_root and dst_root and roots_overlap(src_root, dst_root):
            raise InputRejected(
                "destination", f"{dst_root} and {src_root} overlap: a move would loop or destroy"
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
        src_root, dst_root = local_root(src), local_root(dst)
        if src_root and dst_root and roots_overlap(src_root, dst_root):
            raise NonRetryable(f"{dst_root} and {src_root} overlap: refusing to move")
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
            try:
                return self._move(ctx, src, dst, name)
            except FileNotFoundError:
                if src.exists(name):
                    raise  # something else went missing: retried with backoff
                # The source went while we read it (another move took it, or its owner
                # deleted it): decide again — moved by someone, or vanished.
                return self._move(ctx, src, dst, name)
        except OSError as exc:
            mapped = _access_error(exc, where)
            if mapped is exc:
                raise
            raise mapped from exc

    def _move(self, ctx: JobContext, src: Storage, dst: Storage, name: str) -> dict[str, Any]:
        result: dict[str, Any] = {"name": name}
        tmp = temporary_name(name, ctx.job_id)
        if not src.exists(name):
            _discard(dst, tmp)  # a crash after the delete, before this cleanup
            if dst.exists(name):  # moved before a crash, which lost the checkpoint
                size, sha = digest(dst, name)
                return {**result, "outcome": "already_moved", "size": size, "sha256": sha}
            return {**result, "outcome": "vanished"}
        if dst.exists(name):
            found = self._existing(ctx, src, dst, name, tmp)
            if found is not None:
                return {**result, **found}
        _discard(dst, tmp)  # a copy of ours cut short by a crash: ours by its name
        size, sha = self._copy(src, dst, name, tmp)
        self._verify(ctx, src, dst, name, tmp, size, sha)
        if not self._publish(dst, tmp, name, size, sha):
            # The name was taken while we copied: whoever wrote it, it is not ours.
            found = self._existing(ctx, src, dst, name, tmp)
            if found is None:
                raise VerificationFailed(f"{name}: the source changed while it was published")
            return {**result, **found}
        faults.reach("files.after_copy")
        # The temporary name goes before the source: once the source is gone the
        # file is never listed again, so no replay would come back to remove it.
        _discard(dst, tmp)
        src.delete(name)
        faults.reach("files.after_delete")
        return {**result, "outcome": "moved", "copied": True, "size": size, "sha256": sha}

    def _existing(
        self, ctx: JobContext, src: Storage, dst: Storage, name: str, tmp: str
    ) -> dict[str, Any] | None:
        """The destination has ``name``: finish our own move, or leave somebody else's file.

        Returns the unit's outcome, or None when the file is ours but stale (the
        source changed after we published it): then it has been removed and
        the caller copies afresh.
        """
        size, sha = digest(src, name)
        dst_size, dst_sha = digest(dst, name)
        same_bytes = (dst_size, dst_sha) == (size, sha)
        if _published_from(dst, tmp, name):
            if not same_bytes:
                ctx.logger.info("our published copy is stale; copying again", extra={"file": name})
                dst.delete(name)
                _discard(dst, tmp)
                return None
            # Killed between publishing and deleting the source: re-apply the
            # modification time (it is the source's, a repeat changes nothing) and
            # check everything again before the source goes.
            _keep_mtime(src, dst, name, name)
            self._verify(ctx, src, dst, name, name, size, sha, remove=False)
            _discard(dst, tmp)  # before the source, as in _move
            src.delete(name)
            return {"outcome": "moved", "copied": False, "size": size, "sha256": sha}
        _discard(dst, tmp)  # a copy of ours that never got published: the name was taken
        if same_bytes and _same_mtime(src, dst, name):
            # Somebody else's file, yet exactly ours in bytes and time: nothing is lost.
            src.delete(name)
            return {"outcome": "moved", "copied": False, "size": size, "sha256": sha}
        if ctx.input["on_conflict"] == "skip":
            return {"outcome": "conflict_skipped", "size": size, "sha256": sha,
                    "destination_sha256": dst_sha}  # fmt: skip
        what = (
            "the same bytes with another modification time"
            if same_bytes
            else f"other content ({dst_size:,} bytes, sha256 {dst_sha[:16]}…)"
        )
        raise NonRetryable(
            f"{ctx.input['destination']}:{name} already exists with {what}; the source has "
            f"{size:,} bytes, sha256 {sha[:16]}…. Neither file is touched (the source is left "
            "in place): remove or rename one of them and retry, or move with on_conflict=skip."
        )

    def _copy(self, src: Storage, dst: Storage, name: str, tmp: str) -> tuple[int, str]:
        """Copy to ``tmp``, hashing what is read; returns (size, SHA-256) of the source's bytes.

        Those are the bytes written only if the source did not change during
        the copy: checked, for a local source, against its size and nanosecond
        mtime before and after; a remote source is hashed first and compared.
        """
        src_path = _local_path(src, name)
        before = _stamp(src_path) if src_path else None
        expected: tuple[int, str] | None = None
        if before is not None:
            size = before[0]
        else:
            expected = digest(src, name)
            size = expected[0]
        with src.open(name, "rb") as handle:
            reader = _HashingReader(handle, size)
            try:
                # A file-like object as Storage.save takes one: read, seek, tell.
                saved = dst.save(tmp, File(reader, name=name))  # type: ignore[arg-type]
            except BaseException:
                _discard(dst, tmp)  # a partial copy of ours: never leave it behind
                raise
        if saved != tmp:  # our own name taken meanwhile: cannot happen unless tampered with
            dst.delete(saved)
            raise VerificationFailed(
                f"{name}: the destination stored the copy as {saved!r}, not {tmp!r}; "
                "removed that copy, will try again"
            )
        read = (reader.read_bytes, reader.sha.hexdigest())
        if expected is not None:
            unchanged = read == expected
        else:
            unchanged = src_path is not None and _stamp(src_path) == before and read[0] == size
        if not unchanged:
            _discard(dst, tmp)
            raise VerificationFailed(
                f"{name}: the source changed while it was copied ({read[0]:,} bytes read); "
                "removed the copy, the source is untouched"
            )
        _keep_mtime(src, dst, name, tmp)
        return read

    def _verify(
        self,
        ctx: JobContext,
        src: Storage,
        dst: Storage,
        name: str,
        copy: str,
        size: int,
        sha: str,
        *,
        remove: bool = True,
    ) -> None:
        """The copy's bytes (and kept metadata) agree, or the unit fails (our copy removed)."""
        got_size, got_sha = digest(dst, copy)
        problems = []
        if (got_size, got_sha) != (size, sha):
            problems.append(
                f"{got_size:,} bytes with sha256 {got_sha} at the destination, "
                f"{size:,} bytes with sha256 {sha} at the source"
            )
        src_path, dst_path = _local_path(src, name), _local_path(dst, copy)
        if src_path and dst_path:
            src_mtime, dst_mtime = os.stat(src_path).st_mtime, os.stat(dst_path).st_mtime
            if int(src_mtime) != int(dst_mtime):
                problems.append(
                    f"modification time {dst_mtime:.0f} is not the source's {src_mtime:.0f}"
                )
        if not problems:
            return
        if remove:
            _discard(dst, copy)
        raise VerificationFailed(
            f"{ctx.input['destination']}:{name} does not match its source: {'; '.join(problems)}. "
            + (
                "The copy was removed; the source is untouched."
                if remove
                else "The source is untouched."
            )
        )

    def _publish(self, dst: Storage, tmp: str, name: str, size: int, sha: str) -> bool:
        """Give the verified copy its real name, never replacing a file; False if it is taken.

        Local: a hard link (``link`` fails if the name exists; the temporary
        name stays until the copy is verified under its name and the source is
        about to go, as proof that the file is ours).
        A file system without hard links: the name is reserved with
        ``O_EXCL`` and the copy renamed over the reservation. Another storage:
        ``save`` under the name, which picks another name rather than
        overwrite (that copy is removed again and False returned), then the
        bytes are checked once more.
        """
        tmp_path, final_path = _local_path(dst, tmp), _local_path(dst, name)
        if tmp_path and final_path:
            try:
                os.link(tmp_path, final_path)
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                    raise
            try:
                os.close(os.open(final_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                return False
            os.replace(tmp_path, final_path)  # over our own, empty, reservation
            return True
        with dst.open(tmp, "rb") as handle:
            saved = dst.save(name, File(handle, name=name))
        if saved != name:
            dst.delete(saved)
            return False
        if digest(dst, name) != (size, sha):
            dst.delete(name)  # ours, just written
            raise VerificationFailed(
                f"{name}: the copy published at the destination does not read back as verified; "
                "removed it, will try again"
            )
        return True

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


def _discard(storage: Storage, tmp: str) -> None:
    """Remove one of our temporary names, if it is there (never anything else)."""
    if not is_temporary(tmp):  # a guard against ever deleting a real file by mistake
        raise ValueError(f"{tmp!r} is not a temporary name of files.move")
    if storage.exists(tmp):
        storage.delete(tmp)


def _published_from(dst: Storage, tmp: str, name: str) -> bool:
    """True if ``name`` at the destination is the file we published from ``tmp``.

    Local: the same inode (a hard link of it). Elsewhere: our temporary copy is
    still there with the same bytes (it is removed only after the source).
    """
    tmp_path, final_path = _local_path(dst, tmp), _local_path(dst, name)
    if tmp_path and final_path:
        try:
            one, two = os.stat(tmp_path), os.stat(final_path)
        except FileNotFoundError:
            return False
        return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)
    return dst.exists(tmp) and digest(dst, tmp) == digest(dst, name)


def _keep_mtime(src: Storage, dst: Storage, name: str, copy: str) -> None:
    """Between local storages, give the copy the source's modification time."""
    src_path, dst_path = _local_path(src, name), _local_path(dst, copy)
    if src_path and dst_path:
        info = os.stat(src_path)
        os.utime(dst_path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _same_mtime(src: Storage, dst: Storage, name: str) -> bool:
    """Whether the kept metadata agrees (only local storages keep it)."""
    src_path, dst_path = _local_path(src, name), _local_path(dst, name)
    if not (src_path and dst_path):
        return True
    return int(os.stat(src_path).st_mtime) == int(os.stat(dst_path).st_mtime)


def _stamp(path: str) -> tuple[int, int]:
    """(size, mtime in ns): a local file that kept both was not written meanwhile."""
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns
