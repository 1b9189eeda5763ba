"""``restore.database``: a verified backup back into this site's tables.

Units, in order:

1. ``verify`` — check ``SHA256SUMS``, the manifest and every part file's
   size and SHA-256, and that every table in the backup exists here with the
   same columns. Anything wrong refuses the restore (non-retryable, a
   ``restore-backup`` event with ``done=False``) **before any row is
   touched**;
2. ``clear`` (``replace`` only) — delete the rows of every table being
   restored, in one transaction, so the tables end up equal to the backup;
3. ``load:<model>:<n>`` — one part file, checked against its SHA-256 again,
   upserted by primary key in one transaction. Parents before children;
   foreign keys inside a cycle (a self-reference) are written as NULL here…
4. ``link:<model>:<n>`` — …and filled in by upserting those parts again once
   every row of the cycle exists;
5. ``sequences`` — move PostgreSQL sequences past the restored ids;
   ``rebuild`` — recompute the derived tables (``durable.builtin.derived``:
   day counts, search indexes) from the restored rows. A backup never holds
   them (one from an older version may: they are skipped), and they are
   never compared, since a trigger on this database also writes them;
6. ``check:<model>:<n>`` (``replace`` only) — the digest of one batch of a
   restored table (``CHECK_BATCH`` rows in primary-key order), bounded like
   every other unit;
7. ``finish`` — with ``replace``, the batches' digests add up per table and
   must equal the manifest's, and each table must still hold the manifest's
   row count; announce ``restore-backup``.

Journal tables (``durable.builtin.derived``: the Recovery events, when
``DURABLE_RESTORE_KEEP_APPS`` lets them be restored) are logs the engine
appends to while the restore runs — this job's own reclaim after a crash,
say. ``clear`` moves their sequences past the backup's last key, so an event
appended after it can never take a backup row's id, and the check compares
only the backup's key range with the backup: appended rows are kept, not
reported as differences.

A ``replace`` restore that ends cancelled or failed after ``clear`` has left
the restored tables empty or partly loaded. That is announced as a
``restore-backup`` event with ``done=False`` and ``deleted_data=True``,
naming the tables and the command that finishes the job — from the
``job_state_changed`` signal when it happens, and at every worker start for
any such job whose announcement a crash lost (``announce_interrupted``).
Cancelling is not refused between ``clear`` and ``finish``: an operator may
have to stop a restore that is doing damage; they are told what it left.

Every write is an upsert by primary key, so repeating a unit after a crash
changes nothing. Without ``replace`` (merge), rows created since the backup
stay, and a row that conflicts on another unique column (a user re-created
under a new id) fails the unit with the database's message.

The engine's tables (jobs, events…) are never in a backup nor restored: this
job's own row lives there.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.db import IntegrityError, models

from .. import signals
from ..errors import InputRejected, NonRetryable
from ..models import Job, UnitResult
from ..models.builtin import Announcement
from ..operations import Access, JobContext, Operation, Unit, register
from ..pacing import Pacer
from ..states import JobState
from . import backupdir, inputs
from .announce import announce
from .derived import derived_labels, is_journal, rebuilds_after
from .fence import fenced
from .manifest import MANIFEST, SUMS, is_excluded, reorder, restore_problems
from .tables import (
    PlanError,
    TableDigest,
    TableSpec,
    advance_sequence,
    batches,
    combine,
    count_rows,
    delete_all,
    digest_batch,
    plan_order,
    reset_sequences,
    site_tables,
    units_for,
    upsert,
)

FIELDS = ("name", "database", "replace", "exclude")
CHECK_BATCH = 2000  # rows per check unit
STOPPED = (JobState.CANCELLED, JobState.FAILED)
AUTO_FIELDS = (models.AutoField, models.BigAutoField, models.SmallAutoField)
INTERRUPTED_KEY = "restore-interrupted"
MAX_LISTED = 10

log = logging.getLogger("durable.op.restore.database")


def published_backups() -> list[str]:
    """Names of complete-looking backups (checksums present), newest first."""
    root = backupdir.backup_root()
    if not root.is_dir():
        return []
    found = [
        entry
        for entry in root.iterdir()
        if backupdir.NAME.match(entry.name) and (entry / SUMS).is_file()
    ]
    return [entry.name for entry in sorted(found, key=lambda e: e.stat().st_mtime, reverse=True)]


class RestoreForm(forms.Form):
    name = forms.ChoiceField(
        choices=lambda: [(name, name) for name in published_backups()],
        help_text="A backup in the backup directory.",
    )
    database = forms.ChoiceField(choices=inputs.database_choices, initial="default")
    replace = forms.BooleanField(
        required=False,
        help_text="Delete the current rows of the restored tables first, so they equal the "
        "backup. Without it, rows created since the backup are kept.",
    )
    exclude = inputs.ExcludeField()


def _sha256_of(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@register
class RestoreDatabase(Operation):
    name = "restore.database"
    label = "Restore a backup"
    description = "Verify a backup completely, then upsert its rows table by table."
    max_attempts = 3
    non_retryable = (backupdir.BackupDamaged,)
    input_form = RestoreForm
    # It replaces the site's rows.
    access = Access.PRIVILEGED

    # --- enqueue -------------------------------------------------------------------

    def unique_key(self, data: dict[str, Any]) -> str:
        """One writer per database: restores and copies into it share the key."""
        return inputs.database_write_key(data["database"])

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        inputs.reject_unknown(data, FIELDS)
        name = data.get("name")
        if not name:
            raise InputRejected("name", "required: the name of a backup in the backup directory")
        try:
            backupdir.check_name(name)
        except ValueError as exc:
            raise InputRejected("name", str(exc)) from None
        root = backupdir.backup_root()
        if not (root / name).is_dir():
            raise InputRejected("name", f"there is no backup named {name!r} in {root}")
        database, exclude = inputs.database_alias(data, "database"), inputs.exclude(data)
        # Audit logs (the site's Problems → Recovery history) are never rewritten by a
        # restore: it would erase the very events that explain why it was needed.
        kept = getattr(settings, "DURABLE_RESTORE_KEEP_APPS", [])
        exclude = [*exclude, *(label for label in kept if label not in exclude)]
        inputs.check_tables(database, exclude)
        return {
            "name": name,
            "database": database,
            "replace": inputs.flag(data, "replace"),
            "exclude": exclude,
        }

    # --- planning ------------------------------------------------------------------

    def _path(self, ctx: JobContext) -> Path:
        return backupdir.backup_root() / ctx.input["name"]

    def _site(self, ctx: JobContext) -> dict[str, TableSpec]:
        specs = site_tables(ctx.input["database"], ctx.input["exclude"])
        return {spec.label: spec for spec in specs}

    def _manifest(self, ctx: JobContext, sha: str | None) -> dict[str, Any]:
        """The manifest the ``verify`` unit checked; refuse if it changed since."""
        raw = (self._path(ctx) / MANIFEST).read_bytes() if sha else b""
        if not sha or hashlib.sha256(raw).hexdigest() != sha:
            raise NonRetryable("the backup's manifest changed during the restore; start again")
        return json.loads(raw)

    def _skipped(self, ctx: JobContext) -> set[str]:
        """Excluded tables, and the derived ones (rebuilt, never restored)."""
        return set(ctx.input["exclude"]) | derived_labels()

    def _restored(self, ctx: JobContext, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        skipped = self._skipped(ctx)
        return [t for t in manifest["tables"] if not is_excluded(t["model"], skipped)]

    def _plan(self, ctx: JobContext, manifest: dict[str, Any]) -> tuple[list[str], dict]:
        site = self._site(ctx)
        edges = {t["model"]: site[t["model"]].foreign_keys() for t in self._restored(ctx, manifest)}
        plan = plan_order(edges)
        return list(plan.order), dict(plan.deferred)

    def _steps(self, ctx: JobContext, manifest: dict[str, Any]) -> list[str]:
        tables = {t["model"]: t for t in self._restored(ctx, manifest)}
        order, deferred = self._plan(ctx, manifest)
        steps = ["verify"]
        if ctx.input["replace"]:
            steps.append("clear")
        for label in order:
            steps += [f"load:{label}:{n}" for n in range(len(tables[label]["parts"]))]
        for label in order:
            if label in deferred:
                steps += [f"link:{label}:{n}" for n in range(len(tables[label]["parts"]))]
        steps += ["sequences", "rebuild"]
        if ctx.input["replace"]:
            steps.append("check")  # not a unit: it stands for the check batches
        return [*steps, "finish"]

    def total_units(self, ctx: JobContext) -> int | None:
        try:
            manifest = json.loads((self._path(ctx) / MANIFEST).read_bytes())
            steps = self._steps(ctx, manifest)
        except (OSError, ValueError, KeyError, TypeError, PlanError):
            return None  # the verify unit will say what is wrong
        if "check" not in steps:
            return len(steps)
        rows = [t["rows"] for t in self._restored(ctx, manifest)]
        return len(steps) - 1 + sum(units_for(n, CHECK_BATCH) for n in rows)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        checkpoint = ctx.checkpoint or {"next": 0}
        if checkpoint["next"] == 0:
            sha = _sha256_of(self._path(ctx) / MANIFEST)
            checkpoint = {"next": 1, "manifest": sha}
            yield Unit(key="verify", payload={"manifest": sha}, checkpoint=checkpoint)
        manifest = self._manifest(ctx, checkpoint["manifest"])
        steps = self._steps(ctx, manifest)
        for index in range(checkpoint["next"], len(steps)):
            if steps[index] == "check":
                resume = checkpoint if index == checkpoint["next"] else {}
                yield from self._check_units(ctx, manifest, checkpoint["manifest"], index, resume)
                continue
            if steps[index] == "finish":
                # The total was an estimate (check batches are paced); now it is known.
                ctx.set_total(ctx.units_done + 1)
            yield Unit(
                key=steps[index],
                checkpoint={"next": index + 1, "manifest": checkpoint["manifest"]},
            )

    def _check_units(
        self,
        ctx: JobContext,
        manifest: dict[str, Any],
        sha: str,
        index: int,
        resume: dict[str, Any],
    ) -> Iterator[Unit]:
        """Batches of every restored table, resumed at the (table, last key) of the checkpoint."""
        order, _ = self._plan(ctx, manifest)
        site = self._site(ctx)
        try:
            for batch in batches(
                site, order, ctx.input["database"], Pacer(cap=CHECK_BATCH),
                table=resume.get("table"), after=resume.get("after"), index=resume.get("n", 0),
            ):  # fmt: skip
                yield Unit(
                    key=f"check:{batch.label}:{batch.index}",
                    payload={"table": batch.label, "after": batch.after, "upto": batch.upto},
                    checkpoint={"next": index, "manifest": sha,
                                "table": batch.label, "after": batch.upto, "n": batch.index + 1},
                )  # fmt: skip
        except ValueError as exc:
            raise NonRetryable(f"the restored tables changed during the restore: {exc}") from None

    # --- units ---------------------------------------------------------------------

    def run_unit(self, ctx: JobContext, unit: Unit) -> Any:
        step, _, rest = unit.key.partition(":")
        if step == "verify":
            return self._verify(ctx, unit.payload["manifest"])
        manifest = self._manifest(ctx, ctx.checkpoint["manifest"])
        site = self._site(ctx)
        alias = ctx.input["database"]
        order, deferred = self._plan(ctx, manifest)
        if step == "clear":
            try:
                with fenced(ctx):  # a worker that lost the job must not delete others' work
                    deleted = delete_all([site[label] for label in order], alias)
                    ends = self._cleared_ats(ctx, manifest, site)
                    for label, end in ends.items():
                        advance_sequence(site[label], alias, end)
            except IntegrityError as exc:
                raise NonRetryable(
                    f"the current rows cannot be deleted ({exc}); a table left out of the "
                    "restore still references them"
                ) from exc
            return {"deleted": sum(deleted.values()), "journals": ends}
        if step in ("load", "link"):
            label, number = rest.rsplit(":", 1)
            table = next(t for t in manifest["tables"] if t["model"] == label)
            spec = site[label]
            rows = backupdir.read_part(
                self._path(ctx), table["parts"][int(number)], table["columns"]
            )
            rows = reorder(rows, table["columns"], spec.columns)
            null = deferred.get(label, ()) if step == "load" else ()
            try:
                return {"rows": upsert(spec, alias, rows, null=null)}
            except IntegrityError as exc:
                # A verdict on the data (a unique or foreign key conflict), not a glitch.
                raise NonRetryable(
                    f"the database refused the rows of {table['parts'][int(number)]['file']}: {exc}"
                ) from exc
        if step == "sequences":
            return {"statements": reset_sequences([site[label] for label in order], alias)}
        if step == "rebuild":
            rebuilt = rebuilds_after(order)
            for entry in rebuilt:
                entry.rebuild(alias)
            return {"rebuilt": [entry.name for entry in rebuilt]}
        if step == "check":
            payload = unit.payload
            after, upto = payload["after"], payload["upto"]
            last = self._recorded_ends(ctx).get(payload["table"])
            if last is not None:  # a journal: rows appended after the clear are not the backup's
                if after is not None and after >= last:
                    return TableDigest().as_dict()
                upto = min(upto, last)
            return digest_batch(site[payload["table"]], alias, after, upto).as_dict()
        if step == "finish":
            return self._finish(ctx, manifest, [site[label] for label in order])
        raise NonRetryable(f"unknown restore step {unit.key!r}")

    def _refuse(self, ctx: JobContext, reason: str) -> NonRetryable:
        announce(
            ctx,
            "restore-refused",
            "restore-backup",
            severity="error",
            done=False,
            detail=f"Refused to restore {self._path(ctx)}: {reason}. Nothing was changed.",
            db=ctx.input["database"],
            object_ids=[ctx.input["name"]],
        )
        return NonRetryable(
            f"refused to restore {ctx.input['name']!r}: {reason}; nothing was changed"
        )

    def _cleared_ats(
        self, ctx: JobContext, manifest: dict[str, Any], site: dict[str, TableSpec]
    ) -> dict[str, int]:
        """The backup's highest key of each restored journal with integer keys (0: empty)."""
        ends = {}
        for table in self._restored(ctx, manifest):
            label = table["model"]
            if not is_journal(label) or not isinstance(site[label].pk, AUTO_FIELDS):
                continue
            position = table["columns"].index(site[label].pk.attname)
            last = table["parts"][-1:]  # parts are in key order: the last holds the highest
            rows = backupdir.read_part(self._path(ctx), last[0], table["columns"]) if last else []
            ends[label] = max((int(row[position]) for row in rows), default=0)
        return ends

    def _recorded_ends(self, ctx: JobContext) -> dict[str, int]:
        cleared = UnitResult.objects.filter(job_id=ctx.job_id, key="clear").first()
        return (cleared.result or {}).get("journals", {}) if cleared else {}

    def _verify(self, ctx: JobContext, expected_sha: str | None) -> dict[str, Any]:
        try:
            manifest = backupdir.verify(self._path(ctx))
        except backupdir.BackupDamaged as exc:
            raise self._refuse(ctx, str(exc)) from None
        if _sha256_of(self._path(ctx) / MANIFEST) != expected_sha:
            raise RuntimeError("the manifest changed while it was being verified; verifying again")
        site = {label: spec.columns for label, spec in self._site(ctx).items()}
        if problems := restore_problems(manifest, site, self._skipped(ctx)):
            raise self._refuse(ctx, "; ".join(problems[:5]))
        try:
            self._plan(ctx, manifest)
        except PlanError as exc:
            raise self._refuse(ctx, str(exc)) from None
        tables = self._restored(ctx, manifest)
        return {"tables": len(tables), "rows": sum(t["rows"] for t in tables)}

    def _finish(
        self, ctx: JobContext, manifest: dict[str, Any], specs: list[TableSpec]
    ) -> dict[str, Any]:
        alias, replace = ctx.input["database"], ctx.input["replace"]
        tables = {t["model"]: t for t in self._restored(ctx, manifest)}
        if replace:
            ends = self._recorded_ends(ctx)
            checked: dict[str, list[Any]] = {spec.label: [] for spec in specs}
            found_checks = UnitResult.objects.filter(job_id=ctx.job_id, key__startswith="check:")
            for key, result in found_checks.values_list("key", "result"):
                checked.setdefault(key.split(":")[1], []).append(result)
            differ = []
            for spec in specs:
                found = combine(checked[spec.label])
                table = tables[spec.label]
                # ...and nothing was written since the checks (journals: in the backup's range).
                end = ends.get(spec.label)
                rows = spec.model._base_manager.using(alias)
                now = count_rows(spec, alias) if end is None else rows.filter(pk__lte=end).count()
                if (found.rows, found.hexdigest(), now) != (
                    table["rows"], table["digest"], table["rows"],
                ):  # fmt: skip
                    differ.append(f"{spec.label} ({now} rows, backup {table['rows']})")
            if differ:
                announce(
                    ctx,
                    "restore-differs",
                    "restore-backup",
                    severity="error",
                    done=False,
                    detail=f"Restored {self._path(ctx)} but these tables differ from the backup "
                    f"(was the site writing?): {', '.join(differ[:10])}",
                    db=alias,
                    object_ids=[ctx.input["name"]],
                )
                raise NonRetryable(
                    f"after the restore these tables differ from the backup: {differ}"
                )
        rows = sum(table["rows"] for table in tables.values())
        mode = "replacing the tables' rows" if replace else "merged into the existing rows"
        announce(
            ctx,
            "restore-backup",
            "restore-backup",
            detail=f"Restored backup {self._path(ctx)} into database {alias!r} "
            f"({len(tables)} tables, {rows} rows, {mode})",
            db=alias,
            deleted_data=replace,
            object_ids=[ctx.input["name"]],
        )
        return {"tables": len(tables), "rows": rows, "verified": replace}


# --- a replace that stopped after clearing ------------------------------------------------------


def _left_behind(job: Job) -> tuple[list[str], list[str]]:
    """(tables emptied and not restored completely, tables restored) at the job's checkpoint."""
    op = RestoreDatabase()
    ctx = JobContext(job_id=job.pk, operation=job.operation, input=job.input,
                     checkpoint=job.checkpoint, attempt=job.attempts, worker_id="",
                     lease_epoch=0)  # fmt: skip
    manifest = op._manifest(ctx, (job.checkpoint or {}).get("manifest"))
    steps = op._steps(ctx, manifest)
    done = steps[: (job.checkpoint or {}).get("next", 0)]
    order, deferred = op._plan(ctx, manifest)
    tables = {t["model"]: t for t in op._restored(ctx, manifest)}
    complete = []
    for label in order:
        needed = [f"load:{label}:{n}" for n in range(len(tables[label]["parts"]))]
        if label in deferred:
            needed += [f"link:{label}:{n}" for n in range(len(tables[label]["parts"]))]
        if all(step in done for step in needed):
            complete.append(label)
    return [label for label in order if label not in complete], complete


def announce_interrupted(job_id: int) -> bool:
    """If job ``job_id`` is a replace restore that stopped after ``clear``, say what it left.

    One ``restore-backup`` event (``done=False``, ``deleted_data=True``) per
    stop: keyed by the job's event sequence, so a restore retried and stopped
    again is reported again, and a call repeated for the same stop is silent.
    True if it announced now.
    """
    job = Job.objects.filter(pk=job_id, operation=RestoreDatabase.name).first()
    if job is None or job.state not in STOPPED or not job.input.get("replace"):
        return False
    results = set(
        UnitResult.objects.filter(job_id=job_id, key__in=["clear", "finish"]).values_list(
            "key", flat=True
        )
    )
    if "clear" not in results or "finish" in results:
        return False  # nothing deleted yet, or everything restored
    if Announcement.objects.filter(job_id=job_id, key="restore-differs").exists():
        return False  # ``finish`` already reported which tables differ
    name, alias = job.input["name"], job.input["database"]
    try:
        empty, restored = _left_behind(job)
        listed = ", ".join(empty[:MAX_LISTED]) + (
            f" and {len(empty) - MAX_LISTED} more" if len(empty) > MAX_LISTED else ""
        )
        what = f"{len(empty)} table(s) are empty or partly restored: {listed}" + (
            f" ({len(restored)} restored completely)" if restored else ""
        )
    except (OSError, ValueError, KeyError, TypeError, NonRetryable, PlanError):
        what = "the restored tables are empty or partly restored (the backup is unreadable now)"
    command = f"python manage.py restore_database {name} --replace --database {alias}"
    excluded = [label for label in job.input.get("exclude", []) if label]
    if excluded:
        command += "".join(f" --exclude {label}" for label in excluded)
    ctx = JobContext(job_id=job.pk, operation=job.operation, input=job.input,
                     checkpoint=job.checkpoint, attempt=job.attempts, worker_id="",
                     lease_epoch=0)  # fmt: skip
    return announce(
        ctx,
        f"{INTERRUPTED_KEY}:{job.event_seq}",
        "restore-backup",
        severity="error",
        done=False,
        deleted_data=True,
        detail=f"The restore of backup {name!r} into database {alias!r} (job {job.pk}) "
        f"{'was cancelled' if job.state == JobState.CANCELLED else 'failed'} after it "
        f"deleted the current rows: {what}. The data is in the "
        f"backup: restore it again ({command}, or retry job {job.pk}) to finish.",
        db=alias,
        object_ids=[name],
    )


def on_job_state_changed(
    sender: object, *, job_id: int, operation: str = "", new_state: str = "", **kwargs: object
) -> None:
    if operation == RestoreDatabase.name and new_state in STOPPED:
        announce_interrupted(job_id)


def on_worker_started(sender: object, **kwargs: object) -> None:
    """Catch up on stops whose announcement a crash lost (the signal is sent after commit)."""
    stopped = Job.objects.filter(operation=RestoreDatabase.name, state__in=STOPPED)
    cleared = UnitResult.objects.filter(key="clear").values("job_id")
    for job_id in stopped.filter(pk__in=cleared).values_list("pk", flat=True):
        try:
            announce_interrupted(job_id)
        except Exception:
            log.exception("could not announce an interrupted restore", extra={"job": job_id})


signals.job_state_changed.connect(on_job_state_changed, dispatch_uid="durable.restore.stopped")
signals.worker_started.connect(on_worker_started, dispatch_uid="durable.restore.catch_up")
