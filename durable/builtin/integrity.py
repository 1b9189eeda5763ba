"""``integrity.scan``: check a storage's files against the last scan, or a database's pages.

**Storage** (``{"target": "storage", "storage": "default", "prefix": ""}``):
walks a Django storage (``STORAGES``) in a stable order, hashing at most
``batch_files`` files per unit, and compares each file with the inventory of
the previous scan: new, unchanged, modified (its modification time moved) or
corrupted (its bytes changed, yet its size and modification time did not).
The checkpoint is the last key of the batch, so a restart continues after it.
A corrupted file keeps its last good baseline in the inventory, so every
later scan reports it again until its bytes are back or it is rewritten.
A final sweep marks the files of the inventory that were not seen as missing.
Each batch's inventory update, its tallies and its ``corruption-detected``
event commit in one transaction: a batch repeated after a crash finds its
files already recorded for this scan and reports nothing twice.

**Database** (``{"target": "database", "database": "default"}``).
PostgreSQL: one unit per range of ``BLOCKS_PER_UNIT`` heap pages of a table
(``table:<name>:<first block>``) — with the ``amcheck`` extension,
``verify_heapam`` on those pages; without it, every row on them is read in
full (detoasted, a TID range scan), which finds unreadable pages and values —
then one unit per table (``table:<name>``) for ``bt_index_check`` on each of
its b-tree indexes (amcheck only; an index is checked whole, there is no
range form). The checkpoint is (table, next block), so a big table is
scanned in many bounded units. SQLite: one unit per table, ``PRAGMA
quick_check(<table>)`` (the table's b-tree and its indexes; SQLite has no
ranged form, and page accounting across tables needs a whole-file check,
which is not bounded and not done here).

A scan holds its scope (``storage:<alias>:<prefix>`` or
``database:<alias>``); a second scan of the same scope waits until the
first is finished. Clean scans announce ``integrity-ok``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Q
from django.utils import timezone

from ..errors import InputRejected, NonRetryable, RetryLater, Unavailable
from ..models import Job
from ..models.builtin import Announcement, IntegrityScope, InventoryEntry
from ..operations import JobContext, Operation, Unit, register
from ..pacing import Pacer
from . import inputs
from .announce import announce
from .inventory import (
    CORRUPTED,
    FINDINGS,
    MISSING,
    MODIFIED,
    NEW,
    OK,
    FileState,
    classify,
    clean_prefix,
    keys_after,
    severity,
    storable,
    take_batch,
)

DEFAULT_BATCH_FILES = 200
MAX_BATCH_FILES = 10_000
MAX_PAYLOAD_BYTES = 48 * 1024
CHUNK = 1 << 20
WAIT_FOR_OTHER_SCAN = timedelta(seconds=15)
BLOCKS_PER_UNIT = 2048  # PostgreSQL heap pages per unit at most: 16 MiB at the default page size
LISTED = 50
FIELDS = ("target", "storage", "prefix", "database", "batch_files")


class ScanForm(forms.Form):
    target = forms.ChoiceField(choices=[("storage", "Storage files"), ("database", "Database")])
    storage = forms.ChoiceField(
        choices=lambda: [(alias, alias) for alias in settings.STORAGES],
        initial="default",
        required=False,
    )
    # The metaclass moves fields into declared_fields: this never shadows BaseForm.prefix.
    prefix = forms.CharField(  # type: ignore[assignment]
        required=False, help_text="Only files under this path."
    )
    database = forms.ChoiceField(choices=inputs.database_choices, initial="default", required=False)
    batch_files = forms.IntegerField(
        min_value=1, max_value=MAX_BATCH_FILES, initial=DEFAULT_BATCH_FILES, required=False
    )


def scope_of(data: dict[str, Any]) -> str:
    if data["target"] == "database":
        return f"database:{data['database']}"
    return f"storage:{data['storage']}:{data['prefix']}"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_state(storage: Storage, key: str) -> FileState:
    """Size and SHA-256 of the bytes as read, and the modification time if the storage knows it."""
    sha = hashlib.sha256()
    size = 0
    with storage.open(key, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    try:
        mtime = storage.get_modified_time(key).timestamp()
    except (NotImplementedError, AttributeError):
        mtime = None
    return FileState(size=size, sha256=sha.hexdigest(), mtime=mtime)


@register
class IntegrityScan(Operation):
    name = "integrity.scan"
    label = "Integrity scan"
    description = "Check stored files against the last scan, or the database's pages."
    max_attempts = 5
    input_form = ScanForm
    # Access.ANYONE: it only reads, and reports what it found to Problems → Recovery.

    # --- enqueue -------------------------------------------------------------------

    def unique_key(self, data: dict[str, Any]) -> str:
        """One unfinished scan per scope: asking again returns the scan already under way."""
        return inputs.bounded_key(f"integrity.scan:{scope_of(data)}")

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        inputs.reject_unknown(data, FIELDS)
        target = data.get("target") or "storage"
        if target not in ("storage", "database"):
            raise InputRejected("target", "must be 'storage' or 'database'")
        if target == "database":
            return {"target": target, "database": inputs.database_alias(data, "database")}
        alias = data.get("storage") or "default"
        if alias not in settings.STORAGES:
            raise InputRejected(
                "storage", f"no storage {alias!r} in STORAGES ({', '.join(settings.STORAGES)})"
            )
        storage = storages[alias]
        if isinstance(storage, FileSystemStorage) and not storage.base_location:
            # An unset MEDIA_ROOT means "the current directory": never what is meant.
            raise InputRejected(
                "storage", f"storage {alias!r} has no location (set MEDIA_ROOT or its location)"
            )
        prefix = data.get("prefix") or ""
        if not isinstance(prefix, str):
            raise InputRejected("prefix", "must be a path")
        try:
            prefix = clean_prefix(prefix)
        except ValueError as exc:
            raise InputRejected("prefix", str(exc)) from None
        size = data.get("batch_files")
        size = DEFAULT_BATCH_FILES if size in (None, "") else size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_FILES:
            raise InputRejected("batch_files", f"must be an integer from 1 to {MAX_BATCH_FILES:,}")
        return {"target": target, "storage": alias, "prefix": prefix, "batch_files": size}

    # --- planning ------------------------------------------------------------------

    def _storage(self, ctx: JobContext) -> Storage:
        return storages[ctx.input["storage"]]

    def _listdir(self, ctx: JobContext) -> Any:
        storage = self._storage(ctx)

        def listdir(path: str) -> tuple[list[str], list[str]]:
            dirs, files = storage.listdir(path)
            return list(dirs), list(files)

        return listdir

    def _tables(self, ctx: JobContext) -> list[str]:
        return sorted(connections[ctx.input["database"]].introspection.table_names())

    def prepare(self, ctx: JobContext) -> None:
        if ctx.input["target"] != "storage":
            return
        storage = self._storage(ctx)
        top = ctx.input["prefix"]
        if isinstance(storage, FileSystemStorage):
            root = os.path.join(storage.location, top)
            if not os.path.isdir(root):
                raise Unavailable(
                    f"the storage root {root} does not exist (not mounted?); nothing was scanned"
                )
            return
        try:
            storage.listdir(top)
        except Exception as exc:
            raise Unavailable(f"storage {ctx.input['storage']!r} cannot be listed: {exc}") from exc

    def _blocks(self, ctx: JobContext, table: str) -> int | None:
        """A PostgreSQL table's heap pages now (None: checked in one unit, as on SQLite)."""
        connection = connections[ctx.input["database"]]
        if connection.vendor != "postgresql" or connection.get_database_version() < (14,):
            return None  # TID range scans (bounded reads by page) need PostgreSQL 14
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                [connection.ops.quote_name(table)],
            )
            return int(cursor.fetchone()[0])

    def total_units(self, ctx: JobContext) -> int:
        if ctx.input["target"] == "database":
            ranges = 0
            for table in self._tables(ctx):
                blocks = self._blocks(ctx, table)
                ranges += -(-blocks // BLOCKS_PER_UNIT) if blocks else 0
            return len(self._tables(ctx)) + ranges + 2
        # The batches the scan will cut, by the same rule (files *and* bytes per batch).
        keys = filter(storable, keys_after(self._listdir(ctx), ctx.input["prefix"], None))
        batches = 0
        while take_batch(keys, max_files=ctx.input["batch_files"], max_bytes=MAX_PAYLOAD_BYTES):
            batches += 1
        return batches + 3

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        checkpoint = ctx.checkpoint or {"phase": "begin"}
        phase = checkpoint["phase"]
        if phase == "begin":
            yield Unit(key="begin", checkpoint={"phase": "scan"})
            phase, checkpoint = "scan", {}
        if phase == "scan":
            if ctx.input["target"] == "database":
                yield from self._table_units(ctx, checkpoint)
            else:
                yield from self._file_units(ctx, checkpoint.get("after"), checkpoint.get("n", 0))
                yield Unit(key="sweep", checkpoint={"phase": "report"})
            phase = "report"
        if phase == "report":
            # The total was an estimate (files and pages come and go while a scan runs);
            # now it is known: a completed scan shows N/N.
            ctx.set_total(ctx.units_done + 1)
            yield Unit(key="report", checkpoint={"phase": "done"})

    def _file_units(self, ctx: JobContext, after: str | None, number: int) -> Iterator[Unit]:
        skipped: list[str] = []

        def usable(key: str) -> bool:
            if storable(key):
                return True
            skipped.append(key)  # counted in the batch's result, named in the log
            return False

        keys = filter(usable, keys_after(self._listdir(ctx), ctx.input["prefix"], after))
        pacer = Pacer(cap=ctx.input["batch_files"])  # files per unit from the pace
        while batch := take_batch(keys, max_files=pacer.size(), max_bytes=MAX_PAYLOAD_BYTES):
            yield Unit(
                key=f"files:{number}",
                payload={"keys": batch, "skipped": [ascii(key) for key in skipped[:LISTED]],
                         "skipped_count": len(skipped)},
                checkpoint={"phase": "scan", "after": batch[-1], "n": number + 1},
            )  # fmt: skip
            pacer.done(len(batch))
            skipped.clear()
            number += 1

    def _table_units(self, ctx: JobContext, checkpoint: dict[str, Any]) -> Iterator[Unit]:
        """Page ranges, then the table's own unit; resumed at (table, block) or after a table."""
        after, current = checkpoint.get("after"), checkpoint.get("table")
        pacer = Pacer(cap=BLOCKS_PER_UNIT)  # heap pages per unit from the pace
        for table in self._tables(ctx):
            if after is not None and table <= after:
                continue
            if current is not None and table < current:
                continue
            blocks = self._blocks(ctx, table) or 0
            first = checkpoint.get("block", 0) if table == current else 0
            while first < blocks:
                end = min(first + pacer.size(), blocks)
                yield Unit(
                    key=f"table:{table}:{first}",
                    payload={"table": table, "start": first, "end": end},
                    checkpoint={"phase": "scan", "table": table, "block": end},
                )
                pacer.done(end - first)
                first = end
            yield Unit(
                key=f"table:{table}",
                payload={"table": table},
                checkpoint={"phase": "scan", "after": table},
            )

    # --- units ---------------------------------------------------------------------

    def run_unit(self, ctx: JobContext, unit: Unit) -> Any:
        step = unit.key.split(":", 1)[0]
        if step == "begin":
            return self._begin(ctx)
        if step == "files":
            return self._check_files(ctx, unit)
        if step == "table":
            return self._check_table(ctx, unit.key, unit.payload)
        if step == "sweep":
            return self._sweep(ctx)
        if step == "report":
            return self._report(ctx)
        raise NonRetryable(f"unknown scan step {unit.key!r}")

    def _locked_scope(self, ctx: JobContext) -> IntegrityScope:
        row = IntegrityScope.objects.select_for_update().get(scope=scope_of(ctx.input))
        if row.job_id != ctx.job_id:
            raise NonRetryable(f"scan {row.job_id} took over {row.scope}; this scan stops")
        return row

    def _begin(self, ctx: JobContext) -> dict[str, Any]:
        scope = scope_of(ctx.input)
        now = timezone.now()
        IntegrityScope.objects.get_or_create(scope=scope)
        with transaction.atomic():
            row = IntegrityScope.objects.select_for_update().get(scope=scope)
            if row.job_id not in (None, ctx.job_id) and (
                Job.objects.unfinished().filter(pk=row.job_id).exists()
            ):
                raise RetryLater(
                    f"scan {row.job_id} of {scope} is still running; waiting for it",
                    at=now + WAIT_FOR_OTHER_SCAN,
                    consume_attempt=False,
                )
            row.job_id, row.started_at, row.finished_at = ctx.job_id, now, None
            row.tallies = {"checked": 0, NEW: 0, MODIFIED: 0, CORRUPTED: 0, MISSING: 0}
            row.save()
        return {"scope": scope}

    def _check_files(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        storage = self._storage(ctx)
        scope = scope_of(ctx.input)
        observed: dict[str, FileState] = {}
        for key in unit.payload["keys"]:
            try:
                observed[key] = read_state(storage, key)
            except FileNotFoundError:
                continue  # deleted since it was listed: the sweep reports it if it was known
        if unit.payload.get("skipped_count"):
            ctx.logger.warning(
                "file names that are not valid UTF-8 were skipped",
                extra={"job": ctx.job_id, "names": unit.payload["skipped"]},
            )
        now = timezone.now()
        findings: list[tuple[str, str]] = []
        with transaction.atomic():
            row = self._locked_scope(ctx)
            known = {
                entry.key_hash: entry
                for entry in InventoryEntry.objects.filter(
                    scope=scope, key_hash__in=[key_hash(key) for key in observed]
                )
            }
            created, unchanged, counts = [], [], dict(row.tallies)
            for key, state in observed.items():
                entry = known.get(key_hash(key))
                if entry is not None and entry.seen_by == ctx.job_id:
                    continue  # recorded by an earlier run of this same unit
                previous = (
                    FileState(entry.size, entry.sha256, entry.mtime) if entry is not None else None
                )
                status = classify(previous, state)
                counts["checked"] += 1
                counts[status] = counts.get(status, 0) + 1
                if status in FINDINGS:
                    findings.append((key, status))
                fields = {
                    "size": state.size,
                    "sha256": state.sha256,
                    "mtime": state.mtime,
                    "status": status,
                    "seen_by": ctx.job_id,
                    "checked_at": now,
                }
                if entry is None:
                    created.append(
                        InventoryEntry(scope=scope, key=key, key_hash=key_hash(key), **fields)
                    )
                elif status == OK and entry.mtime == state.mtime:
                    unchanged.append(entry.pk)  # the common case: one UPDATE for all of them
                elif status == CORRUPTED:
                    # Keep the last good baseline: the damaged bytes must not become what the
                    # next scan calls "ok". Reported by every scan until the bytes are back
                    # (ok again) or the file is rewritten (its mtime moves: modified).
                    InventoryEntry.objects.filter(pk=entry.pk).update(
                        status=CORRUPTED, seen_by=ctx.job_id, checked_at=now
                    )
                else:
                    InventoryEntry.objects.filter(pk=entry.pk).update(**fields)
            InventoryEntry.objects.bulk_create(created)
            InventoryEntry.objects.filter(pk__in=unchanged).update(
                status=OK, seen_by=ctx.job_id, checked_at=now
            )
            row.tallies = counts
            row.save(update_fields=["tallies"])
            if findings:
                self._announce_findings(ctx, unit.key, findings)
        return {
            "checked": len(observed),
            "findings": len(findings),
            "skipped": unit.payload.get("skipped_count", 0),
        }

    def _announce_findings(
        self, ctx: JobContext, key: str, findings: list[tuple[str, str]]
    ) -> None:
        statuses = [status for _, status in findings]
        counts = ", ".join(
            f"{statuses.count(s)} {s}" for s in (CORRUPTED, MODIFIED, MISSING) if s in statuses
        )
        explain = {
            CORRUPTED: "content changed although size and modification time did not",
            MODIFIED: "rewritten since the last scan",
            MISSING: "gone since the last scan",
        }
        why = "; ".join(
            f"{s}: {explain[s]}" for s in (CORRUPTED, MODIFIED, MISSING) if s in statuses
        )
        announce(
            ctx,
            key,
            "corruption-detected",
            severity=severity(statuses),
            detail=f"Integrity scan of {scope_of(ctx.input)}: {counts} ({why})",
            db=scope_of(ctx.input),
            object_ids=[k for k, _ in findings],
            object_titles=[f"{k} ({s})" for k, s in findings],
        )

    def _sweep(self, ctx: JobContext) -> dict[str, Any]:
        scope = scope_of(ctx.input)
        with transaction.atomic():
            row = self._locked_scope(ctx)
            gone = (
                InventoryEntry.objects.filter(scope=scope)
                .exclude(seen_by=ctx.job_id)
                .exclude(status=MISSING)
            )
            listed = list(gone.order_by("key").values_list("key", flat=True)[:LISTED])
            # Kept, not deleted: a file that comes back is compared with what it was.
            count = gone.update(status=MISSING, checked_at=timezone.now())
            if count:
                row.tallies = {**row.tallies, MISSING: row.tallies.get(MISSING, 0) + count}
                row.save(update_fields=["tallies"])
                self._announce_findings(ctx, "sweep", [(key, MISSING) for key in listed])
        return {"missing": count}

    def _check_table(self, ctx: JobContext, key: str, payload: dict[str, Any]) -> dict[str, Any]:
        alias = ctx.input["database"]
        connection = connections[alias]
        table, pages = payload["table"], None
        try:
            if connection.vendor == "sqlite":
                method, problems = _sqlite_check(connection, table)
            elif "start" in payload:
                pages = (payload["start"], payload["end"])
                method, problems = _postgres_pages(connection, table, *pages)
            elif self._blocks(ctx, table) is None:
                method, problems = _postgres_check(connection, table)  # PostgreSQL < 14: whole
            else:
                method, problems = _postgres_indexes(connection, table)
        except DatabaseError as exc:
            method, problems = "read", [f"reading the table failed: {exc}"]
        if problems:
            where = f" (pages {pages[0]}-{pages[1] - 1})" if pages else ""
            with transaction.atomic():
                row = self._locked_scope(ctx)
                # A table with problems in several ranges is one corrupted table in the tallies.
                first = not Announcement.objects.filter(
                    Q(key=f"table:{table}") | Q(key__startswith=f"table:{table}:"),
                    job_id=ctx.job_id,
                ).exists()
                sent = announce(
                    ctx,
                    key,
                    "corruption-detected",
                    severity="error",
                    detail=f"Integrity check ({method}) of table {table}{where} in database "
                    f"{alias!r}: " + "; ".join(problems[:5]),
                    db=alias,
                    object_ids=[table],
                )
                if sent and first:
                    row.tallies = {**row.tallies, CORRUPTED: row.tallies.get(CORRUPTED, 0) + 1}
                    row.save(update_fields=["tallies"])
        result = {"table": table, "method": method, "problems": problems[:5]}
        return {**result, "pages": list(pages)} if pages else result

    def _report(self, ctx: JobContext) -> dict[str, Any]:
        with transaction.atomic():
            row = self._locked_scope(ctx)
            tallies = dict(row.tallies)
            problems = sum(tallies.get(s, 0) for s in FINDINGS)
            if ctx.input["target"] == "database":
                tables = len(self._tables(ctx))
                what = f"{tables} tables of database {ctx.input['database']!r}"
            else:
                what = f"{tallies.get('checked', 0)} files in {scope_of(ctx.input)}"
            if not problems:
                new = tallies.get(NEW, 0)
                announce(
                    ctx,
                    "integrity-ok",
                    "integrity-ok",
                    detail=f"Integrity scan checked {what}: no problems"
                    + (f" ({new} new files recorded)" if new else ""),
                    db=scope_of(ctx.input),
                )
            row.finished_at = timezone.now()
            row.save(update_fields=["finished_at"])
        if ctx.input["target"] == "database":
            # A database scan's tallies count findings only; the tables it checked are here.
            return {**tallies, "tables": tables}
        return tallies


def _sqlite_check(connection: BaseDatabaseWrapper, table: str) -> tuple[str, list[str]]:
    quoted = connection.ops.quote_name(table)
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA quick_check({quoted})")
        rows = [str(row[0]) for row in cursor.fetchall()]
    return "PRAGMA quick_check", [] if rows == ["ok"] else rows


def _has_amcheck(cursor: CursorWrapper) -> bool:
    cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'")
    return cursor.fetchone() is not None


def _postgres_pages(
    connection: BaseDatabaseWrapper, table: str, start: int, end: int
) -> tuple[str, list[str]]:
    """Heap pages ``start`` to ``end - 1`` of a table: amcheck, or every row on them read."""
    quoted = connection.ops.quote_name(table)
    with connection.cursor() as cursor:
        if _has_amcheck(cursor):
            try:
                with transaction.atomic(using=connection.alias):
                    cursor.execute(
                        "SELECT blkno, offnum, msg FROM verify_heapam(%s::regclass, "
                        "check_toast => true, startblock => %s, endblock => %s)",
                        [quoted, start, end - 1],
                    )
                    found = cursor.fetchall()
                return "amcheck", [f"block {b} item {o}: {m}" for b, o, m in found]
            except DatabaseError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != "42501":
                    raise
                # amcheck is installed but this role may not run it: read instead.
        # A TID range scan: only these pages are read; every column of every row is detoasted.
        cursor.execute(
            f"SELECT count(*), sum(length(t::text)) FROM {quoted} AS t "  # noqa: S608
            "WHERE ctid >= %s::tid AND ctid < %s::tid",
            [f"({start},0)", f"({end},0)"],
        )
        cursor.fetchone()
        return "full read", []


def _postgres_indexes(connection: BaseDatabaseWrapper, table: str) -> tuple[str, list[str]]:
    """The table's b-tree indexes, each whole (amcheck only; nothing to do without it)."""
    quoted = connection.ops.quote_name(table)
    with connection.cursor() as cursor:
        if not _has_amcheck(cursor):
            return "full read", []  # its pages were read by the range units
        try:
            return "amcheck", _index_problems(connection, cursor, quoted)
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "42501":
                raise
            return "full read", []  # may not run amcheck: the pages were read instead


def _postgres_check(connection: BaseDatabaseWrapper, table: str) -> tuple[str, list[str]]:
    quoted = connection.ops.quote_name(table)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'")
        if cursor.fetchone() is not None:
            try:
                return "amcheck", _amcheck(connection, cursor, quoted)
            except DatabaseError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != "42501":
                    raise
                # amcheck is installed but this role may not run it: read instead.
        # Reading every column of every row touches every heap and TOAST page.
        cursor.execute(f"SELECT count(*), sum(length(t::text)) FROM {quoted} AS t")  # noqa: S608
        cursor.fetchone()
        return "full read", []


def _amcheck(connection: BaseDatabaseWrapper, cursor: CursorWrapper, quoted: str) -> list[str]:
    problems = []
    with transaction.atomic(using=connection.alias):
        cursor.execute(
            "SELECT blkno, offnum, msg FROM verify_heapam(%s::regclass, check_toast => true)",
            [quoted],
        )
        problems += [f"block {b} item {o}: {m}" for b, o, m in cursor.fetchall()]
    return problems + _index_problems(connection, cursor, quoted)


def _index_problems(
    connection: BaseDatabaseWrapper, cursor: CursorWrapper, quoted: str
) -> list[str]:
    problems = []
    cursor.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
        "WHERE i.indrelid = %s::regclass AND a.amname = 'btree'",
        [quoted],
    )
    for (index,) in cursor.fetchall():
        try:
            with transaction.atomic(using=connection.alias):
                cursor.execute("SELECT bt_index_check(%s::regclass, true)", [index])
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == "42501":
                raise
            problems.append(f"index {index}: {exc}")
    return problems
