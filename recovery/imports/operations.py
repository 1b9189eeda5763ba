"""``import.jsonl`` and ``import.csv``: recovery events from another instance's export.

Units, in order:

1. ``source`` — the whole file's SHA-256 (computed before the unit, outside
   the transaction) becomes an ``ImportRecord``, unique by that digest, in
   the transaction that advances the checkpoint. So one source file maps to
   exactly one import record before the queue moves on. The same bytes
   imported again (another path, another name, another day) find the record:
   completed — the job imports nothing and says so; being imported by an
   unfinished job — likewise, that job does it; left unfinished by a job
   that failed or was cancelled — this job takes it over.
2. ``records:<offset>`` — one bounded batch of records (lines, or CSV rows).
   Each event is inserted with the identity ``imp:<digest>:<offset>:<crc>``
   under the table's unique ``source_line`` constraint, and the units run
   inside the checkpoint's transaction (``atomic_units``): a crash anywhere
   repeats at most an uncommitted batch, and even a replay past that inserts
   nothing twice. Bad records are skipped and counted, never fatal.
3. ``summary`` — the record is marked completed; one ``recovery-events-import``
   event reports what was imported and skipped.

The file must not change while it is imported: every claim, and every
``records`` unit before and after it reads, compares the open file's device,
inode, size and modification time with the first unit's, so a file replaced
under the same path is never imported under the old file's SHA-256.

Where files are read: only inside ``RECOVERY_IMPORT_DIRS`` (default
``var/imports``), checked at enqueue and again, links resolved, by the worker
that opens the file. No message quotes the file's content.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from typing import IO, Any

from django import forms
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from durable.builtin.inputs import bounded_key
from durable.errors import InputRejected, NonRetryable, Unavailable
from durable.models import Job
from durable.operations import Access, JobContext, Operation, Unit, register
from durable.pacing import Pacer

from ..models import RecoveryEvent
from ..parsing import SKIP_LABELS
from ..records.lines import insert_lines
from .formats import (
    Batch,
    count_batches,
    parse_header,
    parse_records,
    read_record,
    read_records,
    record_limit,
)
from .formats import skip_labels as with_csv_labels
from .models import ImportRecord, ImportState

IMPORT_REPORT = "recovery-events-import"
DEFAULT_BATCH_RECORDS = 1000
MAX_BATCH_RECORDS = 10_000
BATCH_BYTES = 4 * 1024 * 1024
HASH_CHUNK = 1024 * 1024
MAX_PATH_CHARS = 1024


def line_prefix(sha256: str) -> str:
    """The start of every imported event's ``source_line``: this file, by content."""
    return f"imp:{sha256[:24]}:"


def _identity(info: os.stat_result) -> dict[str, Any]:
    return {
        "file": f"{info.st_dev}:{info.st_ino}",
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
    }


def allowed(path: str, directories: list[str]) -> bool:
    """``path``, symbolic links resolved, lies inside one of ``directories`` (resolved too).

    No directories means no path: there is no "read anything" mode.
    """
    real = os.path.realpath(path)
    return any(
        real.startswith(os.path.realpath(directory).rstrip("/") + "/") for directory in directories
    )


def default_import_dir() -> str:
    var = getattr(settings, "VAR_DIR", None) or os.path.join(settings.BASE_DIR, "var")  # E004
    return os.path.join(str(var), "imports")


def import_dirs() -> list[str]:
    """The directories imports may read: ``RECOVERY_IMPORT_DIRS``, else ``var/imports``.

    Why a fixed place: whoever may start an import names a path the *worker*
    opens, and what it reads ends up in Recovery events. Left open, that is a
    way to read any file the worker can (``/proc/self/environ``, ``.env``).
    The default directory is created when first needed (mode 0750); the
    configured ones are the operator's and are never created.
    """
    default = default_import_dir()
    configured = [str(d) for d in getattr(settings, "RECOVERY_IMPORT_DIRS", None) or [] if d]
    directories = configured or [default]
    if any(os.path.abspath(d) == os.path.abspath(default) for d in directories):
        os.makedirs(default, mode=0o750, exist_ok=True)
    return directories


def outside_message(directories: list[str]) -> str:
    return (
        f"imports are only read from {', '.join(directories)} (RECOVERY_IMPORT_DIRS); "
        "put the export there"
    )


class ImportForm(forms.Form):
    path = forms.CharField(
        max_length=MAX_PATH_CHARS, help_text="The export file, as the workers see it."
    )
    batch_records = forms.IntegerField(
        min_value=1, max_value=MAX_BATCH_RECORDS, initial=DEFAULT_BATCH_RECORDS, required=False
    )

    def clean_batch_records(self) -> int:
        return self.cleaned_data["batch_records"] or DEFAULT_BATCH_RECORDS


class ImportEvents(Operation):
    """The shared machinery; subclasses say which format."""

    format = ""
    # It reads a server path (inside RECOVERY_IMPORT_DIRS): not for everyone who may start jobs.
    access = Access.PRIVILEGED

    def unique_key(self, data: dict[str, Any]) -> str:
        """One unfinished import per path (either format): ``--wait`` again follows it."""
        return bounded_key(f"import:{data['path']}")

    atomic_units = True  # its only side effects are rows in this database
    max_attempts = 5
    backoff_base, backoff_max = 2.0, 120.0
    unit_timeout = 600.0
    input_form = ImportForm

    @property
    def csv(self) -> bool:
        return self.format == "csv"

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        path = data.get("path")
        if not isinstance(path, str) or not path.strip():
            raise InputRejected("path", "the file to import is required")
        if len(path) > MAX_PATH_CHARS or "\x00" in path:
            raise InputRejected("path", f"must be at most {MAX_PATH_CHARS} characters, no NUL")
        path = os.path.abspath(os.path.expanduser(path.strip()))
        directories = import_dirs()
        if not allowed(path, directories):
            raise InputRejected("path", outside_message(directories))
        batch = data.get("batch_records", DEFAULT_BATCH_RECORDS)
        if (
            isinstance(batch, bool)
            or not isinstance(batch, int)
            or not 1 <= batch <= MAX_BATCH_RECORDS
        ):
            raise InputRejected("batch_records", f"a whole number from 1 to {MAX_BATCH_RECORDS:,}")
        return {"path": path, "batch_records": batch}

    # --- reading: outside the transaction --------------------------------------------------

    def _open(self, ctx: JobContext) -> IO[bytes]:
        """Open the export, checked again here: the worker's settings and links are what count.

        Between the enqueue and now a link inside an import directory may have
        been pointed elsewhere, or the worker may have other settings: the
        resolved path is checked once more and opened without following a
        link in its last component.
        """
        path = ctx.input["path"]
        directories = import_dirs()
        real = os.path.realpath(path)
        if not allowed(real, directories):
            raise NonRetryable(f"{path}: {outside_message(directories)}")
        try:
            # O_NONBLOCK: a FIFO must not hang the worker until it is refused below.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(real, flags)
        except FileNotFoundError:
            raise Unavailable(f"{path} does not exist: put the export there, then resume") from None
        except PermissionError:
            raise Unavailable(
                f"cannot read {path}: permission denied; give the worker's user read access"
            ) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the link was swapped in after the check above
                raise NonRetryable(f"{path}: {outside_message(directories)}") from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            if stat.S_ISDIR(mode):
                raise NonRetryable(f"{path} is a directory, not an export file")
            raise NonRetryable(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")

    def _scan(self, ctx: JobContext, handle: IO[bytes]) -> tuple[str, int]:
        """(SHA-256, batches) of the whole file: its identity, and the progress bar's total.

        The batches are counted by the reads the import would make at its caps
        (a CSV's header, quoted newlines, the last line without its newline,
        the byte limit of a batch): the fewest units it can take. Paced units
        are often smaller, so the units re-estimate the total as they go, and
        the summary makes it exact: a completed import shows N/N.
        """
        sha = hashlib.sha256()
        handle.seek(0)
        while chunk := handle.read(HASH_CHUNK):
            sha.update(chunk)
        batches = count_batches(
            handle,
            0,
            quoted=self.csv,
            limit=record_limit(self.csv),
            max_records=ctx.input["batch_records"],
            max_bytes=BATCH_BYTES,
            skip_first=self.csv,
        )
        return sha.hexdigest(), batches

    def _data_start(self, handle: IO[bytes], path: str) -> tuple[int, list[str] | None, list[str]]:
        """Where records start, and the CSV columns (None for JSONL)."""
        if not self.csv:
            return 0, None, []
        handle.seek(0)
        raw, consumed = read_record(handle, quoted=True, limit=record_limit(True))
        if raw is None:
            return 0, [], []  # an empty file: nothing to import
        try:
            columns, ignored = parse_header(raw)
        except ValueError as exc:
            raise NonRetryable(f"{path}: {exc}") from None
        return consumed, columns, ignored

    def _done_elsewhere(self, ctx: JobContext, sha: str) -> bool:
        record = ImportRecord.objects.filter(sha256=sha).exclude(job_id=ctx.job_id).first()
        if record is None:
            return False
        if record.state == ImportState.COMPLETED:
            return True
        other = Job.objects.filter(pk=record.job_id).only("state").first()
        return other is not None and not other.is_finished

    def _same_file(self, ctx: JobContext, handle: IO[bytes], checkpoint: dict[str, Any]) -> None:
        """The open file is the one the import started with (device, inode, size, mtime)."""
        identity = _identity(os.fstat(handle.fileno()))
        if {k: checkpoint.get(k) for k in identity} != identity:
            raise NonRetryable(
                f"{ctx.input['path']} changed since this import started (it was "
                f"{checkpoint['size']:,} bytes, sha256 {checkpoint['sha256'][:16]}…); "
                "the events read so far stay; import the new file as a new job"
            )

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        handle = self._open(ctx)
        try:
            yield from self._units(ctx, handle)
        finally:
            handle.close()

    def _units(self, ctx: JobContext, handle: IO[bytes]) -> Iterator[Unit]:
        checkpoint = ctx.checkpoint or {}
        identity = _identity(os.fstat(handle.fileno()))
        if not checkpoint:
            sha, batches = self._scan(ctx, handle)
            if _identity(os.fstat(handle.fileno())) != identity:
                raise NonRetryable(f"{ctx.input['path']} changed while it was read; try again")
            # The source, the batches, the summary — or the source alone, if this file is
            # imported already or being imported by another job (the source unit decides).
            ctx.set_total(1 if self._done_elsewhere(ctx, sha) else batches + 2)
            checkpoint = {"sha256": sha, **identity, "offset": None}
            yield Unit(
                key="source",
                payload={"sha256": sha, "size": identity["size"]},
                checkpoint=checkpoint,
            )
        else:
            self._same_file(ctx, handle, checkpoint)
        record = ImportRecord.objects.filter(sha256=checkpoint["sha256"]).first()
        if record is None or record.job_id != ctx.job_id:
            return  # imported, or being imported, by another job: the source unit said so
        if checkpoint.get("done"):
            yield Unit(key="summary", payload={}, checkpoint=checkpoint)
            return
        start, _, _ = self._data_start(handle, ctx.input["path"])
        offset = checkpoint["offset"] if checkpoint["offset"] is not None else start
        limit = record_limit(self.csv)
        # Records per unit from the rate measured (durable.pacing), batch_records the cap.
        pacer = Pacer(cap=ctx.input["batch_records"])
        while True:
            records, end = read_records(
                handle,
                offset,
                quoted=self.csv,
                limit=limit,
                max_records=pacer.size(),
                max_bytes=BATCH_BYTES,
            )
            if not records:
                break
            yield Unit(
                key=f"records:{offset}",
                payload={"start": offset, "end": end, "records": len(records)},
                checkpoint={**checkpoint, "offset": end},
            )
            pacer.done(len(records))
            left = int((checkpoint["size"] - end) * len(records) / max(end - offset, 1))
            ctx.set_total(ctx.units_done + 1 + pacer.units_for(left))
            offset = end
        # The total was an estimate (units are sized as they go); now it is known.
        ctx.set_total(ctx.units_done + 1)
        yield Unit(
            key="summary", payload={}, checkpoint={**checkpoint, "offset": offset, "done": True}
        )

    # --- writing: inside the unit's transaction ---------------------------------------------

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        if unit.key == "source":
            return self._register(ctx, unit.payload["sha256"], unit.payload["size"])
        sha = unit.checkpoint["sha256"]
        if unit.key == "summary":
            return self._summarise(ctx, sha)
        return self._import(ctx, unit.checkpoint, unit.payload["start"], unit.payload["end"])

    def _register(self, ctx: JobContext, sha: str, size: int) -> dict[str, Any]:
        ImportRecord.objects.bulk_create(
            [
                ImportRecord(
                    sha256=sha,
                    format=self.format,
                    path=ctx.input["path"][:MAX_PATH_CHARS],
                    size=size,
                    job_id=ctx.job_id,
                    created_at=timezone.now(),
                )
            ],
            ignore_conflicts=True,
        )
        record = ImportRecord.objects.select_for_update().get(sha256=sha)
        result = {"record": record.pk, "sha256": sha, "size": size}
        if record.job_id == ctx.job_id:
            return {**result, "status": "importing"}
        if record.state == ImportState.COMPLETED:
            ctx.event(
                "already_imported",
                f"this file (sha256 {sha[:16]}…) was imported by job {record.job_id} on "
                f"{record.finished_at:%Y-%m-%d %H:%M} UTC; nothing imported again",
                record=record.pk,
                job=record.job_id,
            )
            return {**result, "status": "already_imported", "by_job": record.job_id}
        other = Job.objects.filter(pk=record.job_id).only("state").first()
        if other is not None and not other.is_finished:
            ctx.event(
                "being_imported",
                f"job {record.job_id} is importing this file (sha256 {sha[:16]}…); "
                "nothing done here",
                record=record.pk,
                job=record.job_id,
            )
            return {**result, "status": "being_imported", "by_job": record.job_id}
        # The job that started it failed or was cancelled: carry on where it stopped.
        # Rows it imported are found again by their identity and counted as duplicates.
        previous = record.job_id
        ImportRecord.objects.filter(pk=record.pk).update(
            job_id=ctx.job_id, records=0, imported=0, duplicates=0, skipped={}
        )
        ctx.event("taken_over", f"continuing the import left unfinished by job {previous}")
        return {**result, "status": "taken_over", "from_job": previous}

    def _import(
        self, ctx: JobContext, checkpoint: dict[str, Any], start: int, end: int
    ) -> dict[str, Any]:
        sha = checkpoint["sha256"]
        with self._open(ctx) as handle:
            # The file whose SHA-256 the source unit took, or the unit stops here: a
            # file replaced since (same path, other inode) or written to (size, mtime)
            # must not be imported under the old file's identity.
            self._same_file(ctx, handle, checkpoint)
            _, columns, _ = self._data_start(handle, ctx.input["path"])
            records, reached = read_records(
                handle,
                start,
                quoted=self.csv,
                limit=record_limit(self.csv),
                max_records=0,
                max_bytes=0,
                end=end,
            )
            self._same_file(ctx, handle, checkpoint)  # and nobody wrote it while we read
        if reached != end:
            raise NonRetryable(f"{ctx.input['path']} changed while it was imported")
        batch: Batch = parse_records(records, columns=columns)
        inserted = insert_lines(batch.events, prefix=line_prefix(sha), recorded_at=timezone.now())
        duplicates = len(batch.events) - inserted
        record = ImportRecord.objects.select_for_update().get(sha256=sha, job_id=ctx.job_id)
        skipped = dict(record.skipped)
        for reason, count in batch.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
        ImportRecord.objects.filter(pk=record.pk).update(
            records=F("records") + len(records),
            imported=F("imported") + inserted,
            duplicates=F("duplicates") + duplicates,
            skipped=skipped,
        )
        return {
            "start": start,
            "end": end,
            "records": len(records),
            "imported": inserted,
            "duplicates": duplicates,
            "skipped": batch.skipped,
            "ips_dropped": batch.ips_dropped,
        }

    def _summarise(self, ctx: JobContext, sha: str) -> dict[str, Any]:
        now = timezone.now()
        record = ImportRecord.objects.select_for_update().get(sha256=sha, job_id=ctx.job_id)
        ImportRecord.objects.filter(pk=record.pk).update(
            state=ImportState.COMPLETED, finished_at=now
        )
        labels = with_csv_labels(SKIP_LABELS)
        problems = {reason: n for reason, n in record.skipped.items() if reason != "blank"}
        what = "rows" if self.csv else "lines"
        detail = (
            f"Imported {record.imported:,} event{'' if record.imported == 1 else 's'} from "
            f"{record.records:,} {what} of "
            f"{ctx.input['path']} ({self.format.upper()}, sha256 {sha[:16]}…)."
        )
        if record.duplicates:
            detail += f" {record.duplicates:,} were there already (an earlier attempt)."
        if problems:
            reasons = ", ".join(
                f"{n:,} {labels.get(reason, reason)}" for reason, n in sorted(problems.items())
            )
            detail += f" Skipped {sum(problems.values()):,}: {reasons}."
        RecoveryEvent.objects.create(
            type=IMPORT_REPORT,
            severity="warning" if problems else "info",
            source="worker",
            detail=detail,
            done=True,
            job_id=ctx.job_id,
            operation=self.name,
            recorded_at=now,
        )
        summary = {
            "records": record.records,
            "imported": record.imported,
            "duplicates": record.duplicates,
            "skipped": record.skipped,
        }
        ctx.event("imported", detail, **summary)
        return {"summary": summary, "record": record.pk}


@register
class ImportJsonl(ImportEvents):
    name = "import.jsonl"
    label = "Import recovery events (JSONL)"
    description = "Recovery events from another instance's JSONL export, one object per line."
    format = "jsonl"


@register
class ImportCsv(ImportEvents):
    name = "import.csv"
    label = "Import recovery events (CSV)"
    description = "Recovery events from a CSV export with a header row naming the fields."
    format = "csv"
