"""``backup.database``: this site's tables into a verified backup directory.

Units, in order:

1. ``begin`` — create the staging directory ``.NAME.partial-<job>`` (empty
   it if a previous attempt left one) and remove staging directories of
   backups that were cancelled or failed;
2. ``part:<model>:<n>`` — one batch of one table (primary-key order, at most
   ``batch_size`` rows) written as a gzip JSON Lines file, synced, renamed
   into place. Its size, SHA-256, row count and row digest are the unit's
   result; a repeat rewrites the same file from the same key range;
3. ``publish`` — write ``manifest.json`` and ``SHA256SUMS``, sync, and rename
   the staging directory to ``NAME``: the backup exists completely or not at
   all. Announces ``backup-created``;
4. ``verify`` — delete the snapshot (if any), read the published backup back
   and check every checksum. Announces ``backup-verified`` (or the failure,
   ``done=False``).

Consistency: each part is one SELECT, so each part is a consistent set of
rows. Units are separate transactions (they must be, to survive a restart),
so a backup taken while the site writes is *not* one point-in-time
snapshot: a row changed after its batch was read keeps its old value, a row
inserted into an already-read range is missing. Tables are read
children-first (the reverse of the foreign-key order), so a row's parent is
read after the row and normally exists in the backup too; a parent deleted
in between can still leave a dangling reference that a restore refuses. For
an exact snapshot, stop the site's writers during the backup — or, on SQLite,
pass ``snapshot``: ``begin`` then copies the whole database with one
``VACUUM INTO`` (one read transaction; writers carry on) into
``.NAME.snapshot-<job>/`` beside the staging directory, and every part is read
from that copy. The backup is then exactly the database as of ``begin``, and
still resumable part by part.

Nothing is removed while the saved progress still needs it: the snapshot is
deleted by ``verify``, whose checkpoint (``published``) no longer reads it —
not by ``publish``, which a crash may repeat with the progress still in the
``tables`` phase (that repeat plans its units from the snapshot).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django import forms
from django.db import connections
from django.utils import timezone
from django.utils.crypto import get_random_string

from .. import faults
from ..errors import InputRejected, NonRetryable, Unavailable, VerificationFailed
from ..models import Job, UnitResult
from ..operations import Access, JobContext, Operation, Unit, register
from ..pacing import Pacer
from . import backupdir, inputs
from .announce import announce
from .manifest import MANIFEST, SUMS, build_manifest, format_sums, part_name
from .tables import (
    TableDigest,
    TableSpec,
    batches,
    combine,
    count_rows,
    migration_state,
    missing_tables,
    plan_for,
    read_rows,
    row_bytes,
    site_tables,
    units_for,
)

DEFAULT_BATCH = 1000
NAME_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
SNAPSHOT_FILE = "snapshot.sqlite3"
FIELDS = ("database", "name", "batch_size", "exclude", "snapshot")


class BackupForm(forms.Form):
    database = forms.ChoiceField(choices=inputs.database_choices, initial="default")
    name = forms.CharField(
        required=False,
        max_length=100,
        help_text="Directory name under the backup directory; empty: backup-<time>-<random>.",
    )
    batch_size = inputs.batch_size_field(DEFAULT_BATCH, "Rows per part file.")
    exclude = inputs.ExcludeField()
    snapshot = forms.BooleanField(
        required=False,
        help_text="SQLite: back up a consistent copy taken when the backup starts (VACUUM "
        "INTO), so the site may keep writing. Needs free space for one copy of the database.",
    )


def default_name(now: Any) -> str:
    """``backup-<UTC time>-<4 random characters>``: sortable, and unique for jobs in one second."""
    return f"backup-{now:%Y%m%dT%H%M%SZ}-{get_random_string(4, NAME_CHARACTERS)}"


def backup_path(name: str) -> Path:
    return backupdir.backup_root() / name


@register
class BackupDatabase(Operation):
    name = "backup.database"
    label = "Back up the database"
    description = "Copy this site's tables into a checksummed backup directory, published last."
    max_attempts = 5
    input_form = BackupForm
    # It reads every table of the site into files on the server.
    access = Access.PRIVILEGED

    # --- enqueue -------------------------------------------------------------------

    def unique_key(self, data: dict[str, Any]) -> str:
        """One unfinished backup per name: the same command again follows the first job."""
        return inputs.bounded_key(f"backup.database:{data['name']}")

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        inputs.reject_unknown(data, FIELDS)
        name = data.get("name") or default_name(timezone.now())
        try:
            backupdir.check_name(name)
        except ValueError as exc:
            raise InputRejected("name", str(exc)) from None
        if backup_path(name).exists() and not _published_by_unfinished(backup_path(name)):
            # (Published by a job still verifying it: enqueue returns that job.)
            raise InputRejected("name", f"a backup named {name!r} already exists")
        database = inputs.database_alias(data, "database")
        snapshot = inputs.flag(data, "snapshot")
        if snapshot and connections[database].vendor != "sqlite":
            raise InputRejected(
                "snapshot",
                "only for SQLite databases; for a point-in-time copy of PostgreSQL use pg_dump",
            )
        exclude = inputs.exclude(data)
        inputs.check_tables(database, exclude)
        return {
            "database": database,
            "name": name,
            "batch_size": inputs.batch_size(data, DEFAULT_BATCH),
            "exclude": exclude,
            "snapshot": snapshot,
        }

    # --- planning ------------------------------------------------------------------

    def _tables(self, ctx: JobContext) -> tuple[dict[str, TableSpec], list[str]]:
        specs = site_tables(ctx.input["database"], ctx.input["exclude"])
        plan = plan_for(specs)
        # Children first: a row is read before its parent, so the parent is in the backup.
        return {spec.label: spec for spec in specs}, list(reversed(plan.order))

    def _staging(self, ctx: JobContext) -> Path:
        return backupdir.staging_dir(backupdir.backup_root(), ctx.input["name"], ctx.job_id)

    def _snapshot(self, ctx: JobContext) -> Path:
        return backupdir.snapshot_dir(backupdir.backup_root(), ctx.input["name"], ctx.job_id)

    def _source(self, ctx: JobContext) -> str:
        """The alias rows are read from: the database, or (snapshot) this job's copy of it.

        The copy is opened read-only under an alias of its own, so the ORM reads
        it exactly as it reads the database.
        """
        if not ctx.input.get("snapshot"):
            return ctx.input["database"]
        alias = f"durable_snapshot_{ctx.job_id}"
        if alias not in connections.settings:
            path = self._snapshot(ctx) / SNAPSHOT_FILE
            if not path.is_file():
                raise RuntimeError(f"the snapshot {path} is gone")
            connections.settings[alias] = {
                **connections[ctx.input["database"]].settings_dict,
                "NAME": f"file:{quote(str(path))}?mode=ro",
                "OPTIONS": {},
            }
        return alias

    def _drop_snapshot(self, ctx: JobContext) -> None:
        alias = f"durable_snapshot_{ctx.job_id}"
        if alias in connections.settings:
            connections[alias].close()
            del connections[alias]
            del connections.settings[alias]
        backupdir.remove_tree(self._snapshot(ctx))

    def prepare(self, ctx: JobContext) -> None:
        root = backupdir.backup_root()
        try:
            root.mkdir(exist_ok=True)
        except OSError as exc:
            raise Unavailable(
                f"the backup directory {root} cannot be created ({exc.strerror}); "
                "create it or set DURABLE_BACKUP_DIR"
            ) from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise Unavailable(f"the backup directory {root} is not writable by the worker")

    def total_units(self, ctx: JobContext) -> int:
        specs, order = self._tables(ctx)
        size = ctx.input["batch_size"]
        alias = ctx.input["database"]
        return 3 + sum(units_for(count_rows(specs[label], alias), size) for label in order)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        checkpoint = ctx.checkpoint or {}
        phase = checkpoint.get("phase")
        if phase is None:
            yield Unit(key="begin", checkpoint={"phase": "tables"})
            phase, checkpoint = "tables", {}
        if phase == "tables":
            specs, order = self._tables(ctx)
            if ctx.input.get("snapshot"):
                # The parts are cut from the snapshot, not the live tables counted when
                # the job was claimed: count its rows (it never changes: exact, each claim).
                size, source = ctx.input["batch_size"], self._source(ctx)
                parts = sum(units_for(count_rows(specs[label], source), size) for label in order)
                ctx.set_total(3 + parts)
            try:
                todo = batches(
                    specs,
                    order,
                    self._source(ctx),
                    Pacer(cap=ctx.input["batch_size"]),  # rows per part from the pace
                    table=checkpoint.get("table"),
                    after=checkpoint.get("after"),
                    index=checkpoint.get("part", 0),
                )
                for batch in todo:
                    yield Unit(
                        key=f"part:{batch.label}:{batch.index}",
                        payload={
                            "table": batch.label,
                            "part": batch.index,
                            "after": batch.after,
                            "upto": batch.upto,
                        },
                        checkpoint={
                            "phase": "tables",
                            "table": batch.label,
                            "after": batch.upto,
                            "part": batch.index + 1,
                        },
                    )
            except ValueError as exc:
                raise self._refuse(
                    ctx, f"the site's tables changed during the backup ({exc}); start a new backup"
                ) from None
            # The total was an estimate (parts are sized as they go); now it is known.
            ctx.set_total(ctx.units_done + 2)
            yield Unit(key="publish", checkpoint={"phase": "published"})
            phase = "published"
        if phase == "published":
            yield Unit(key="verify", checkpoint={"phase": "verified"})

    def run_unit(self, ctx: JobContext, unit: Unit) -> Any:
        if unit.key == "begin":
            return self._begin(ctx)
        if unit.key == "publish":
            return self._publish(ctx)
        if unit.key == "verify":
            return self._verify(ctx)
        return self._part(ctx, unit.payload)

    def verify(self, ctx: JobContext, unit: Unit, result: Any) -> None:
        """A part counts as done only if the file on disk is the one just written."""
        if unit.key.startswith("part:"):
            found = backupdir.file_digest(self._staging(ctx) / result["file"])
            if found != (result["bytes"], result["sha256"]):
                raise VerificationFailed(f"{result['file']} does not read back as written")

    def _refuse(self, ctx: JobContext, reason: str) -> NonRetryable:
        """A failed backup is a Recovery fact too: ``backup-created`` with ``done=False``."""
        announce(
            ctx,
            "backup-failed",
            "backup-created",
            severity="error",
            done=False,
            detail=f"Backup {ctx.input['name']!r} of database {ctx.input['database']!r} "
            f"failed: {reason}",
            db=ctx.input["database"],
            object_ids=[ctx.input["name"]],
        )
        return NonRetryable(reason)

    # --- units ---------------------------------------------------------------------

    def _begin(self, ctx: JobContext) -> dict[str, Any]:
        specs, order = self._tables(ctx)
        if missing := missing_tables(ctx.input["database"], specs.values()):
            raise self._refuse(
                ctx,
                f"tables missing from database {ctx.input['database']!r}: {', '.join(missing)}; "
                "run migrate first",
            )
        root = backupdir.backup_root()
        if (root / ctx.input["name"]).exists():
            raise self._refuse(
                ctx, f"a backup named {ctx.input['name']!r} already exists in {root}"
            )
        for path, job_id in backupdir.staging_dirs(root):
            if job_id != ctx.job_id and not Job.objects.unfinished().filter(pk=job_id).exists():
                backupdir.remove_tree(path)  # a cancelled or failed backup's leftovers
        staging = self._staging(ctx)
        backupdir.remove_tree(staging)
        staging.mkdir()
        started_at = timezone.now().isoformat()
        if ctx.input.get("snapshot"):
            # One read transaction copies the whole database: every part is read from it.
            self._drop_snapshot(ctx)  # a repeated begin takes a new one
            self._snapshot(ctx).mkdir()
            with connections[ctx.input["database"]].cursor() as cursor:
                cursor.execute("VACUUM INTO %s", [str(self._snapshot(ctx) / SNAPSHOT_FILE)])
        return {"started_at": started_at, "tables": order}

    def _part(self, ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
        specs, _ = self._tables(ctx)
        spec = specs[payload["table"]]
        staging = self._staging(ctx)
        if not staging.is_dir():
            # Only ``begin`` creates it: a worker that lost its lease must not recreate it.
            raise RuntimeError(f"the staging directory {staging} is gone")
        rows = read_rows(spec, self._source(ctx), payload["after"], payload["upto"])
        digest = TableDigest()
        for row in rows:
            digest.add(row_bytes(row))
        header = {
            "model": spec.label,
            "table": spec.table,
            "columns": spec.columns,
            "part": payload["part"],
        }
        data = backupdir.encode_part(header, rows)
        name = part_name(spec.label, payload["part"])
        backupdir.write_atomic(staging / name, data)
        return {
            "file": name,
            "rows": len(rows),
            "bytes": len(data),
            "sha256": _sha256(data),
            "digest": digest.hexdigest(),
        }

    def _publish(self, ctx: JobContext) -> dict[str, Any]:
        root = backupdir.backup_root()
        final = root / ctx.input["name"]
        if final.exists():
            if _published_by(final) != ctx.job_id:
                raise self._refuse(
                    ctx, f"a backup named {ctx.input['name']!r} already exists in {root}"
                )
            manifest = json.loads((final / MANIFEST).read_bytes())  # we published it, then crashed
        else:
            manifest = self._build_manifest(ctx)
            staging = self._staging(ctx)
            payload = json.dumps(manifest, indent=1, ensure_ascii=False).encode()
            backupdir.write_atomic(staging / MANIFEST, payload)
            digests = {
                part["file"]: part["sha256"] for t in manifest["tables"] for part in t["parts"]
            }
            digests[MANIFEST] = _sha256(payload)
            backupdir.write_atomic(staging / SUMS, format_sums(digests).encode())
            backupdir.fsync_dir(staging)
            os.rename(staging, final)
            backupdir.fsync_dir(root)
        faults.reach("backup.after_publish")
        tables = len(manifest["tables"])
        rows = sum(table["rows"] for table in manifest["tables"])
        announce(
            ctx,
            "backup-created",
            "backup-created",
            detail=f"Backed up database {ctx.input['database']!r} ({tables} tables, {rows} rows) "
            f"to {final}",
            db=ctx.input["database"],
            object_ids=[ctx.input["name"]],
        )
        return {"path": str(final), "tables": tables, "rows": rows}

    def _build_manifest(self, ctx: JobContext) -> dict[str, Any]:
        specs, order = self._tables(ctx)
        begun = UnitResult.objects.get(job_id=ctx.job_id, key="begin").result
        if begun["tables"] != order:
            raise self._refuse(
                ctx, "the site's tables changed during the backup; start a new backup"
            )
        parts: dict[str, list[tuple[int, Any]]] = {label: [] for label in order}  # JSON read back
        results = UnitResult.objects.filter(job_id=ctx.job_id, key__startswith="part:")
        for key, result in results.values_list("key", "result"):
            _, label, index = key.rsplit(":", 2)
            parts[label].append((int(index), result))
        staging = self._staging(ctx)
        tables, listed = [], {}
        for label in order:
            ordered = [result for _, result in sorted(parts[label], key=lambda item: item[0])]
            for result in ordered:
                if backupdir.file_digest(staging / result["file"]) != (
                    result["bytes"],
                    result["sha256"],
                ):
                    raise self._refuse(
                        ctx,
                        f"staged file {result['file']} changed after it was written; "
                        "the storage is unreliable, start a new backup",
                    )
            spec = specs[label]
            tables.append(
                {
                    "model": label,
                    "table": spec.table,
                    "columns": spec.columns,
                    "pk": spec.pk.attname,
                    "digest": combine(ordered).hexdigest(),
                }
            )
            listed[label] = [
                {key: result[key] for key in ("file", "rows", "bytes", "sha256")}
                for result in ordered
            ]
        alias = ctx.input["database"]
        return build_manifest(
            job_id=ctx.job_id,
            database=alias,
            vendor=connections[alias].vendor,
            started_at=begun["started_at"],
            finished_at=timezone.now().isoformat(),
            consistency="snapshot" if ctx.input.get("snapshot") else "per-batch",
            migrations=migration_state(alias),
            tables=tables,
            parts=listed,
        )

    def _verify(self, ctx: JobContext) -> dict[str, Any]:
        # The checkpoint says "published": nothing reads the snapshot any more.
        self._drop_snapshot(ctx)
        path = backup_path(ctx.input["name"])
        try:
            manifest = backupdir.verify(path)
        except backupdir.BackupDamaged as exc:
            announce(
                ctx,
                "backup-verified",
                "backup-verified",
                severity="error",
                done=False,
                detail=f"Backup {path} failed verification right after it was written: {exc}",
                db=ctx.input["database"],
                object_ids=[ctx.input["name"]],
            )
            raise NonRetryable(f"the published backup failed verification: {exc}") from None
        files = sum(len(table["parts"]) for table in manifest["tables"])
        announce(
            ctx,
            "backup-verified",
            "backup-verified",
            detail=f"Verified backup {path}: {files} files and the manifest match their SHA-256",
            db=ctx.input["database"],
            object_ids=[ctx.input["name"]],
        )
        return {"files": files}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _published_by(path: Path) -> int | None:
    try:
        return json.loads((path / MANIFEST).read_bytes()).get("job_id")
    except (OSError, ValueError, AttributeError):
        return None


def _published_by_unfinished(path: Path) -> bool:
    job_id = _published_by(path)
    return job_id is not None and Job.objects.unfinished().filter(pk=job_id).exists()
