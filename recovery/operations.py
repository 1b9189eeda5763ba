"""``recovery.ingest``: import new lines of ``recovery-events.jsonl`` as a durable job.

Unit = one bounded batch of complete lines; checkpoint = the file's identity
(device:inode, fingerprints of its first bytes and of the bytes before the
offset, CRC-32 of everything read) plus the byte offset reached. A run reads
only bytes after the offset, so importing 10 appended lines costs the same
whether the file holds 100 lines or 10 million.

The cursor (``IngestCursor``) belongs to the file, by device:inode, and
outlives the job: every periodic ingest is a new job that starts where the
last one stopped, under whatever name it was asked for (``IngestPath``
records each name and the file it held, which is how a rotation is
noticed). A unit inserts its lines and advances the cursor — conditional on
the cursor still being where the unit started — in the transaction that
also advances the job's checkpoint (``atomic_units``). So a crash anywhere
repeats at most an uncommitted batch, and two ingests of one file (under
one name or two) cannot both import it. Every line also carries its
identity (file tag and generation, offset, CRC) under a unique constraint,
so even a replay that got past all of that inserts nothing twice.

Reading happens in ``units()`` (outside the write transaction), cutting the
bytes into lines; ``run_unit`` parses them, 2,000 lines at a time — on
PostgreSQL one step ahead on a thread while it inserts the step before. The batch passes from
one to the other in memory, keyed by job, lease epoch and unit key: a unit
payload is bounded JSON, and a batch of thousands of lines does not belong
in it.
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

from django.db import transaction
from django.utils import timezone

from durable.errors import InputRejected, NonRetryable, RetryLater, Unavailable
from durable.models import UnitResult
from durable.operations import Access, JobContext, Operation, Unit, register
from durable.pacing import Pacer

# The site's other operations, registered on import (autodiscovery imports this module only).
from .dashboard.bulk import BulkAction  # noqa: F401 - registers recovery.bulk_action
from .dashboard.indexing import SearchIndex  # noqa: F401 - registers recovery.search_index
from .imports import operations as _imports  # noqa: F401 - registers import.jsonl, import.csv
from .models import EventType, RecoveryEvent
from .notify import publish_errors
from .parsing import SKIP_LABELS, Chunk
from .policy import Position, Verdict, ingest_report, ingest_unique_key, plan_start, verdict
from .records.cursors import (
    advance_cursor,
    cursor_of_file,
    follow,
    is_followed,
    name_for,
    point_name,
    position_of,
)
from .records.lines import insert_lines, parse_ahead_pays
from .tailer import MIN_BATCH_BYTES, NotAFile, OpenFile, canonical, find_rotated

DEFAULT_BATCH_LINES = 10_000
MAX_BATCH_LINES = 100_000
DEFAULT_BATCH_BYTES = 2 * 1024 * 1024
MAX_BATCH_BYTES = 64 * 1024 * 1024
MAX_PATH_CHARS = 1024


@dataclass
class _Batch:
    """A unit's work, prepared by ``units()`` for ``run_unit``."""

    cursor_id: int | None
    expected: Position  # the cursor as this unit finds it
    after: Position  # the cursor once this unit is done
    chunk: Chunk | None = None
    note: str = ""
    path: str = ""  # the file the bytes come from (the name, or its rotated file)
    summary_of: str = ""  # set on the run's last unit: the file's signature
    name_id: int | None = None  # on the last unit: the name to point at the cursor


_pending: dict[tuple[int, int, str], _Batch] = {}
_pending_lock = threading.Lock()
MISSING = "missing"


def _int_in(data: dict, name: str, default: int, low: int, high: int) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputRejected(name, f"must be a whole number from {low:,} to {high:,}")
    return value


def _units_left(pacer: Pacer, chunk: Chunk, end: int) -> int:
    """About how many units the bytes after ``chunk`` take at the pace: the progress bar's."""
    if chunk.lines < 1 or chunk.end <= chunk.offset:
        return 1
    bytes_per_line = (chunk.end - chunk.offset) / chunk.lines
    return pacer.units_for(int((end - chunk.end) / bytes_per_line))


def job_summary(job_id: int) -> dict[str, Any]:
    """What a whole ingest job imported: its run summaries added up.

    A job usually has one; a replay that got further after a crash adds
    another for what it imported, never the same lines twice.
    """
    total: dict[str, Any] = {"lines": 0, "imported": 0, "duplicates": 0, "ips_dropped": 0}
    skipped: Counter = Counter()
    notes: list[str] = []
    results = UnitResult.objects.filter(job_id=job_id, key__startswith="summary:").order_by("id")
    for result in results.values_list("result", flat=True):
        summary = (result or {}).get("summary") or {}
        for name in total:
            total[name] += summary.get(name, 0)
        skipped.update(summary.get("skipped") or {})
        notes += summary.get("notes") or []
    return {**total, "skipped": dict(skipped), "notes": notes}


@register
class IngestRecoveryEvents(Operation):
    name = "recovery.ingest"
    label = "Import recovery-events.jsonl"
    description = "Imports the lines launch scripts appended since the last import."
    # Its input names a file on the server, read with the worker's rights.
    access = Access.PRIVILEGED
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
            "path": canonical(path.strip()),
            "batch_lines": _int_in(data, "batch_lines", DEFAULT_BATCH_LINES, 1, MAX_BATCH_LINES),
            "batch_bytes": _int_in(
                data, "batch_bytes", DEFAULT_BATCH_BYTES, MIN_BATCH_BYTES, MAX_BATCH_BYTES
            ),
        }

    def unique_key(self, data: dict[str, Any]) -> str:
        """One unfinished ingest per name, however it was asked for (symlinks resolved)."""
        return ingest_unique_key(data["path"])

    def total_units(self, ctx: JobContext) -> int:
        """An estimate from the unread bytes: the progress bar needs no exact count."""
        try:
            info = os.stat(ctx.input["path"])
        except OSError:
            return 1
        cursor = cursor_of_file(f"{info.st_dev}:{info.st_ino}")
        offset = cursor.offset if cursor is not None else 0
        unread = info.st_size - offset if info.st_size >= offset else info.st_size
        return math.ceil(unread / ctx.input["batch_bytes"]) + 1

    # --- reading: outside the write transaction --------------------------------------

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        path = ctx.input["path"]
        # Lines per unit from the rate measured, aiming at DURABLE_UNIT_TARGET_SECONDS:
        # batch_lines and batch_bytes stay the upper bounds; small first after a claim.
        pacer = Pacer(cap=ctx.input["batch_lines"])
        limits = {"batch_bytes": ctx.input["batch_bytes"], "batch_lines": pacer.size}
        try:
            handle = OpenFile.open(path)
        except PermissionError as exc:
            raise Unavailable(
                f"cannot read {path}: {exc.strerror}; give the worker's user read access"
            ) from None
        except NotAFile as exc:
            raise NonRetryable(str(exc)) from None
        stage = self._stager(ctx)
        try:
            name = name_for(path)
            if handle is None:
                ctx.event("nothing_to_import", f"{path} does not exist (yet)")
                nowhere = Position()
                yield stage(name.cursor_id, nowhere, nowhere, summary_of=MISSING, name_id=name.pk)
                return
            cursor = cursor_of_file(handle.file_id)
            previous = name.cursor
            note = ""
            if previous is not None and previous.file_id != handle.file_id:
                # The name held another file at the last look: rotated or replaced.
                # Finish the old one first, wherever it went; then follow the new one.
                expected = position_of(previous)
                drained = ""
                old = find_rotated(path, expected, known=is_followed)
                if old is not None:
                    with old:
                        expected = yield from self._drain(
                            stage, previous.pk, expected, old, limits, pacer
                        )
                    drained = old.path
                if cursor is None:
                    probe = handle.probe(expected)
                    prefix_crc = None
                    if (
                        not drained
                        and handle.size >= expected.offset
                        and (probe.head == expected.head and probe.tail == expected.tail)
                    ):
                        prefix_crc = handle.crc(expected.offset)
                    plan = plan_start(expected, probe, drained=drained, prefix_crc=prefix_crc)
                    cursor, note = follow(path, plan.start), plan.note
            elif cursor is None:
                cursor = follow(path, Position.fresh(handle.file_id))
            # The file at the name, from where its cursor stopped.
            expected = position_of(cursor)
            probe = handle.probe(expected)
            drained = ""
            if verdict(expected, probe) in (Verdict.TRUNCATED, Verdict.REWRITTEN):
                # copytruncate: the lines written since the last look are in the copy.
                copy = find_rotated(path, expected, known=is_followed)
                if copy is not None:
                    with copy:
                        expected = yield from self._drain(
                            stage, cursor.pk, expected, copy, limits, pacer
                        )
                    drained, probe = copy.path, handle.probe(expected)
            plan = plan_start(expected, probe, drained=drained)
            note = "; ".join(filter(None, [note, plan.note]))
            moved = False
            for chunk, after in handle.chunks(plan.start, end=handle.size, **limits):
                yield stage(cursor.pk, expected, after, chunk=chunk, note=note, path=path)
                pacer.done(chunk.lines)
                expected, note, moved = after, "", True
                ctx.set_total(ctx.units_done + 1 + _units_left(pacer, chunk, handle.size))
            if not moved and expected != plan.start:
                # A new generation with no complete line yet: remember it anyway, so
                # the next run neither looks for a copy again nor misses the change.
                yield stage(cursor.pk, expected, plan.start, note=note, path=path)
                expected, note = plan.start, ""
            yield stage(
                cursor.pk,
                expected,
                expected,
                note=note,
                path=path,
                summary_of=handle.signature,
                name_id=name.pk,
            )
        finally:
            if handle is not None:
                handle.close()
            with _pending_lock:
                for key in [k for k in _pending if k[:2] == (ctx.job_id, ctx.lease_epoch)]:
                    del _pending[key]

    def _drain(
        self,
        stage: Any,
        cursor_id: int,
        expected: Position,
        old: OpenFile,
        limits: dict,
        pacer: Pacer,
    ) -> Generator[Unit, None, Position]:
        """Read the rest of a rotated file (or its copy) to its very end; the position reached.

        Nobody writes to it any more, so its last line counts even without its newline.
        A copy is then remembered as a file the ingest has finished, so a later
        rotation that begins with the same bytes is never taken for it.
        """
        how = "rotated" if old.file_id == expected.file_id else "copied"
        note = f"{how}: finishing {old.path}"
        for chunk, after in old.chunks(expected, end=old.size, final=True, **limits):
            yield stage(cursor_id, expected, after, chunk=chunk, note=note, path=old.path)
            pacer.done(chunk.lines)
            expected, note = after, ""
        if old.file_id != expected.file_id:
            follow(old.path, replace(expected, file_id=old.file_id))
        return expected

    def _stager(self, ctx: JobContext) -> Any:
        def stage(
            cursor_id: int | None,
            expected: Position,
            after: Position,
            *,
            chunk: Chunk | None = None,
            note: str = "",
            path: str = "",
            summary_of: str = "",
            name_id: int | None = None,
        ) -> Unit:
            if summary_of == MISSING:
                key = "summary:missing"
            elif summary_of:
                # Named by where the run ended: a replay that gets further after a
                # crash reports what it imported, one that does not is a repeat.
                key = f"summary:{cursor_id}:{after.generation}:{after.offset}"
            elif chunk is not None:
                key = f"lines:{cursor_id}:{after.generation}:{chunk.offset}"
            else:
                key = f"switch:{cursor_id}:{after.generation}:{after.file_id}:{after.offset}"
            batch = _Batch(
                cursor_id=cursor_id,
                expected=expected,
                after=after,
                chunk=chunk,
                note=note,
                path=path,
                summary_of=summary_of,
                name_id=name_id,
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
                assert batch.name_id is not None  # a run's last unit always names its file
                result = self._summarise(ctx, batch)
                if batch.summary_of == MISSING:
                    point_name(batch.name_id, batch.cursor_id, seen="")
                    return result
                point_name(batch.name_id, batch.cursor_id, seen=batch.summary_of)
                assert batch.cursor_id is not None  # only a missing file has no cursor
                moved = advance_cursor(batch.cursor_id, batch.expected, batch.after)
            else:
                assert batch.cursor_id is not None  # lines come from a followed file
                result = self._import(batch)
                moved = advance_cursor(
                    batch.cursor_id,
                    batch.expected,
                    batch.after,
                    imported=result.get("imported", 0),
                    skipped=sum(result.get("skipped", {}).values()),
                    path=batch.path,
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
        prefix = batch.after.prefix
        # Read here, a step ahead on a thread while the step before is written
        # (where that pays); closed (its thread joined) before this unit ends,
        # even on an error.
        with closing(chunk.parsed(ahead=parse_ahead_pays())) as steps:
            events = chain.from_iterable(steps)
            inserted = insert_lines(events, prefix=prefix, recorded_at=timezone.now())
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
        """The run's last unit: one report for what the run imported, recorded once.

        It covers the units since the job's previous summary, if a crashed run
        left one: each line is reported by the run that imported it.
        """
        totals = {"lines": 0, "imported": 0, "duplicates": 0, "ips_dropped": 0}
        skipped: Counter = Counter()
        first_skipped: dict[str, int] = {}
        notes: list[str] = []
        results = UnitResult.objects.filter(job_id=ctx.job_id).order_by("id")
        for result in results.values_list("result", flat=True):
            if not isinstance(result, dict):
                continue
            if "summary" in result:  # reported already: start counting again
                totals = dict.fromkeys(totals, 0)
                skipped, first_skipped, notes = Counter(), {}, []
                continue
            for name in totals:
                totals[name] += result.get(name, 0)
            skipped.update(result.get("skipped", {}))
            for reason, at in result.get("first_skipped", {}).items():
                first_skipped[reason] = min(at, first_skipped.get(reason, at))
            if result.get("note"):
                notes.append(result["note"])
        if batch.note:
            notes.append(batch.note)
        path = ctx.input["path"]
        report = ingest_report(
            path,
            imported=totals["imported"],
            lines=totals["lines"],
            skipped=skipped,
            first_skipped=first_skipped,
            ips_dropped=totals["ips_dropped"],
            notes=[note for note in notes if not note.startswith(("rotated: ", "copied: "))],
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
            if batch.summary_of != MISSING
            else "the file does not exist"
        )
        ctx.event("ingested", message, **summary)
        return {"summary": summary}
