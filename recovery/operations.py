"""``recovery.ingest``: import new lines of ``recovery-events.jsonl`` as a durable job.

Unit = one bounded batch of complete lines; checkpoint = the file's identity
(device:inode, fingerprints of its first bytes and of the bytes before the
offset, CRC-32 of everything read) plus the byte offset reached. A run reads
only bytes after the offset, so importing 10 appended lines costs the same
whether the file holds 100 lines or 10 million.

The cursor (``IngestCursor``) outlives the job: every periodic ingest is a new
job that starts where the last one stopped. A unit inserts its lines and
advances the cursor — conditional on the cursor still being where the unit
started — in the transaction that also advances the job's checkpoint
(``atomic_units``). So a crash anywhere repeats at most an uncommitted batch,
and two ingests of one file cannot both import it. Every line also carries
its identity (file, generation, offset, CRC) under a unique constraint, so
even a replay that got past all of that inserts nothing twice.

Reading happens in ``units()`` (outside the write transaction); ``run_unit``
only inserts. The parsed batch passes from one to the other in memory, keyed
by job, lease epoch and unit key: a unit payload is bounded JSON, and a batch
of thousands of lines does not belong in it.
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from durable.errors import InputRejected, NonRetryable, RetryLater, Unavailable
from durable.models import UnitResult
from durable.operations import JobContext, Operation, Unit, register

from .models import EventType, IngestCursor, RecoveryEvent
from .notify import publish_errors
from .parsing import SKIP_LABELS, Chunk
from .policy import Position, Verdict, ingest_report, line_prefix, plan_start, verdict
from .records import advance_cursor, cursor_for, insert_lines, position_of
from .tailer import MIN_BATCH_BYTES, NotAFile, OpenFile, find_rotated

DEFAULT_BATCH_LINES = 10_000
MAX_BATCH_LINES = 100_000
DEFAULT_BATCH_BYTES = 2 * 1024 * 1024
MAX_BATCH_BYTES = 64 * 1024 * 1024
MAX_PATH_CHARS = 1024


@dataclass
class _Batch:
    """A unit's work, prepared by ``units()`` for ``run_unit``."""

    cursor_id: int
    expected: Position  # the cursor as this unit finds it
    after: Position  # the cursor once this unit is done
    chunk: Chunk | None = None
    tag: str = ""
    note: str = ""
    summary_of: str = ""  # set on the run's last unit: the file's signature
    path: str = ""
    keys: list[tuple[str, Any]] = field(default_factory=list)


_pending: dict[tuple[int, int, str], _Batch] = {}
_pending_lock = threading.Lock()


def _int_in(data: dict, name: str, default: int, low: int, high: int) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputRejected(name, f"must be a whole number from {low:,} to {high:,}")
    return value


@register
class IngestRecoveryEvents(Operation):
    name = "recovery.ingest"
    label = "Import recovery-events.jsonl"
    description = "Imports the lines launch scripts appended since the last import."
    atomic_units = True  # its only side effects are rows in this database
    max_attempts = 5
    backoff_base, backoff_max = 2.0, 120.0
    unit_timeout = 600.0

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        path = data.get("path")
        if not isinstance(path, str) or not path.strip():
            raise InputRejected("path", "the file to import is required")
        if len(path) > MAX_PATH_CHARS or "\x00" in path:
            raise InputRejected("path", f"must be at most {MAX_PATH_CHARS} characters, no NUL")
        return {
            "path": os.path.abspath(os.path.expanduser(path.strip())),
            "batch_lines": _int_in(data, "batch_lines", DEFAULT_BATCH_LINES, 1, MAX_BATCH_LINES),
            "batch_bytes": _int_in(
                data, "batch_bytes", DEFAULT_BATCH_BYTES, MIN_BATCH_BYTES, MAX_BATCH_BYTES
            ),
        }

    def total_units(self, ctx: JobContext) -> int:
        """An estimate from the unread bytes: the progress bar needs no exact count."""
        path = ctx.input["path"]
        try:
            size = os.stat(path).st_size
        except OSError:
            return 1
        offset = (
            IngestCursor.objects.filter(path=path).values_list("offset", flat=True).first() or 0
        )
        unread = size - offset if size >= offset else size
        return math.ceil(unread / ctx.input["batch_bytes"]) + 1

    # --- reading: outside the write transaction --------------------------------------

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        path = ctx.input["path"]
        limits = {"batch_bytes": ctx.input["batch_bytes"], "batch_lines": ctx.input["batch_lines"]}
        try:
            handle = OpenFile.open(path)
        except PermissionError as exc:
            raise Unavailable(
                f"cannot read {path}: {exc.strerror}; give the worker's user read access"
            ) from None
        except NotAFile as exc:
            raise NonRetryable(str(exc)) from None
        try:
            cursor = cursor_for(path)
            expected = position_of(cursor)
            stage = self._stager(ctx, cursor, path)
            if handle is None:
                ctx.event("nothing_to_import", f"{path} does not exist (yet)")
                yield stage(expected, expected, summary_of="missing")
                return
            probe = handle.probe(expected)
            drained = False
            prefix_crc = None
            if verdict(expected, probe) is Verdict.REPLACED:
                old = find_rotated(path, expected.file_id)
                if old is not None:
                    with old:
                        if verdict(expected, old.probe(expected)) is Verdict.CONTINUE:
                            note = f"rotated: finishing {old.path}"
                            for chunk, after in old.chunks(
                                expected, end=old.size, final=True, **limits
                            ):
                                yield stage(expected, after, chunk=chunk, note=note)
                                expected, note = after, ""
                            drained = True
                same_size_or_more = handle.size >= expected.offset
                if not drained and same_size_or_more and probe.head == expected.head:
                    prefix_crc = handle.crc(expected.offset)
            plan = plan_start(expected, probe, drained_rotated=drained, prefix_crc=prefix_crc)
            note, moved = plan.note, False
            for chunk, after in handle.chunks(plan.start, end=handle.size, **limits):
                yield stage(expected, after, chunk=chunk, note=note)
                expected, note, moved = after, "", True
            if not moved and expected != plan.start:
                # A new file with no complete line yet: remember it anyway, so the
                # next run neither looks for the old one again nor misses the change.
                yield stage(expected, plan.start, note=note)
                expected = plan.start
            yield stage(expected, expected, summary_of=handle.signature)
        finally:
            if handle is not None:
                handle.close()
            with _pending_lock:
                for key in [k for k in _pending if k[:2] == (ctx.job_id, ctx.lease_epoch)]:
                    del _pending[key]

    def _stager(self, ctx: JobContext, cursor: IngestCursor, path: str):
        def stage(
            expected: Position,
            after: Position,
            *,
            chunk: Chunk | None = None,
            note: str = "",
            summary_of: str = "",
        ) -> Unit:
            if summary_of:
                key = "summary"
            elif chunk is not None:
                key = f"lines:{after.generation}:{chunk.offset}"
            else:
                key = f"switch:{after.generation}:{after.file_id}:{after.offset}"
            batch = _Batch(
                cursor_id=cursor.pk,
                expected=expected,
                after=after,
                chunk=chunk,
                tag=cursor.tag,
                note=note,
                summary_of=summary_of,
                path=path,
            )
            with _pending_lock:
                _pending[(ctx.job_id, ctx.lease_epoch, key)] = batch
            payload = {"generation": after.generation, "to": after.offset}
            if chunk is not None:
                payload.update(start=chunk.offset, lines=chunk.lines)
            return Unit(key=key, payload=payload, checkpoint=after.as_checkpoint())

        return stage

    # --- writing: inside the unit's transaction ---------------------------------------

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        with _pending_lock:
            batch = _pending.pop((ctx.job_id, ctx.lease_epoch, unit.key), None)
        if batch is None:
            raise RetryLater(
                "the batch is no longer in memory; reading it again",
                at=timezone.now(),
                consume_attempt=False,
            )
        with transaction.atomic():
            if batch.summary_of:
                result = self._summarise(ctx, batch)
                seen = "" if batch.summary_of == "missing" else batch.summary_of
            else:
                result = self._import(batch)
                seen = None
            moved = advance_cursor(
                batch.cursor_id,
                batch.expected,
                batch.after,
                imported=result.get("imported", 0),
                skipped=sum(result.get("skipped", {}).values()),
                seen=seen,
            )
            if not moved:
                raise RetryLater(
                    "another ingest of this file got there first; continuing from its position",
                    at=timezone.now(),
                    consume_attempt=False,
                )
        return result

    def _import(self, batch: _Batch) -> dict[str, Any]:
        chunk = batch.chunk
        result: dict[str, Any] = {"to": batch.after.offset}
        if batch.note:
            result["note"] = batch.note
        if chunk is None:
            return result
        prefix = line_prefix(batch.tag, batch.after.generation)
        inserted = insert_lines(chunk.events, prefix=prefix, recorded_at=timezone.now())
        # In this unit's transaction: a replayed batch publishes nothing twice.
        published = publish_errors(chunk.events, prefix=prefix)
        if published:
            result["published"] = published
        result.update(
            start=chunk.offset,
            lines=chunk.lines,
            imported=inserted,
            duplicates=len(chunk.events) - inserted,
            skipped=dict(chunk.skipped),
            first_skipped=dict(chunk.first_skipped),
            ips_dropped=chunk.ips_dropped,
        )
        return result

    def _summarise(self, ctx: JobContext, batch: _Batch) -> dict[str, Any]:
        """The run's last unit: one report for the whole run, recorded once."""
        totals = {"lines": 0, "imported": 0, "duplicates": 0, "ips_dropped": 0}
        skipped: Counter = Counter()
        first_skipped: dict[str, int] = {}
        notes: list[str] = []
        results = UnitResult.objects.filter(job_id=ctx.job_id).values_list("result", flat=True)
        for result in results:
            if not isinstance(result, dict) or "summary" in result:
                continue
            for name in totals:
                totals[name] += result.get(name, 0)
            skipped.update(result.get("skipped", {}))
            for reason, at in result.get("first_skipped", {}).items():
                first_skipped[reason] = min(at, first_skipped.get(reason, at))
            if result.get("note"):
                notes.append(result["note"])
        report = ingest_report(
            batch.path,
            imported=totals["imported"],
            lines=totals["lines"],
            skipped=skipped,
            first_skipped=first_skipped,
            ips_dropped=totals["ips_dropped"],
            notes=[note for note in notes if not note.startswith("rotated: ")],
            labels=SKIP_LABELS,
        )
        summary = {**totals, "skipped": dict(skipped), "notes": notes}
        if report is not None:
            severity, detail = report
            RecoveryEvent.objects.create(
                type=EventType.INGEST_REPORT,
                severity=severity,
                source="worker",
                detail=detail,
                done=True,
                job_id=ctx.job_id,
                operation=self.name,
                checkpoint=batch.after.as_checkpoint(),
            )
        message = (
            f"imported {totals['imported']:,} of {totals['lines']:,} lines"
            if batch.summary_of != "missing"
            else "the file does not exist"
        )
        ctx.event("ingested", message, **summary)
        return {"summary": summary}


from .dashboard.bulk import BulkAction  # noqa: E402,F401 - registers recovery.bulk_action
from .dashboard.indexing import SearchIndex  # noqa: E402,F401 - registers recovery.search_index
from .imports import operations as _imports  # noqa: E402,F401 - registers import.jsonl, import.csv
