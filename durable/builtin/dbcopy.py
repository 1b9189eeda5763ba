"""``db.copy``: this site's tables from one configured database to another.

The way from the embedded SQLite database to PostgreSQL (or back, or between
two PostgreSQL servers). Both databases are aliases in ``DATABASES``; the
target must already have the schema (``migrate --database TARGET``).

Units, in order:

1. ``prepare`` — check that every table exists on the target with every
   column; then either refuse a target whose tables hold rows, or, with
   ``replace``, delete those rows in one transaction;
2. ``copy:<model>:<n>`` — one batch of one table in primary-key order, read
   from the source with one SELECT and upserted into the target in one
   transaction. The checkpoint is (table, last primary key), so a restart
   continues with the next batch and a repeated batch rewrites the same rows.
   Foreign keys inside a cycle (a self-reference) are written as NULL here…
3. ``link:<model>:<n>`` — …and set by upserting those batches again once
   every row of the cycle is on the target;
4. ``sequences`` — move the target's PostgreSQL sequences past the copied ids;
   ``rebuild`` — recompute the target's derived tables (day counts, search
   indexes: ``durable.builtin.derived``) from the copied rows. They are never
   copied nor compared: a trigger on the target also writes them;
5. ``verify:<model>:<n>`` — one batch of source rows (primary-key order,
   ``batch_size`` rows) and the target's rows with the same keys: their
   order-independent digests of every value must agree (by key, not by range:
   vendors may sort text keys differently);
6. ``verified:<model>`` — both tables hold exactly as many rows as the
   batches covered, so the target has nothing extra and the source did not
   grow; the batches' digests add up to the table's. Any difference fails the
   job (non-retryable: copy again with the site's writers stopped). Every
   verification unit is bounded by a batch, so a big table is checked in
   many short units, resumed after a restart from the last one done;
7. ``tail:<n>`` — rows appended to *journal* tables since their close are
   copied and verified (see below), and their counts checked; another tail
   follows whenever a journal grew meanwhile, so a copy loses no row the
   source held when it finished.

Journal tables (``durable.builtin.derived.register_journal``: the Recovery
events) are append-only logs the engine itself writes to while the copy runs
— when the copy's own job is taken back after a crash, its
``job-reclaimed-after-restart`` event lands in the source. A journal row the
target does not have yet is copied by the verification that finds it (a
batch, the close, or ``tail``: at most one batch of rows each) and then
verified like the others; a journal row that *differs* on the target, or
one deleted from the source, still fails the copy.

The engine's own tables (jobs and their events) are not copied: this job is
running in them. See docs/how-to/move-to-postgresql.md, "Moving to another database",
for the switch-over.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django import forms
from django.db import IntegrityError, connections, router

from .. import faults
from ..errors import InputRejected, NonRetryable
from ..models import UnitResult
from ..operations import Access, JobContext, Operation, Unit, register
from ..pacing import Pacer
from . import inputs
from .derived import is_journal, rebuilds_after
from .fence import fenced
from .tables import (
    Plan,
    TableDigest,
    TableSpec,
    batches,
    combine,
    count_rows,
    decode_pk,
    delete_all,
    digest_keys,
    digest_rows,
    encode_pk,
    missing_tables,
    next_boundary,
    plan_for,
    read_rows,
    reset_sequences,
    same_database,
    site_tables,
    units_for,
    upsert,
)

DEFAULT_BATCH = 1000
FIELDS = ("source", "target", "replace", "batch_size", "exclude")
MAX_LISTED = 10


class CopyForm(forms.Form):
    source = forms.ChoiceField(choices=inputs.database_choices, initial="default")
    target = forms.ChoiceField(choices=inputs.database_choices)
    replace = forms.BooleanField(
        required=False,
        help_text="Delete the target's rows of the copied tables first (needed after migrate, "
        "which creates content types and permissions).",
    )
    batch_size = inputs.batch_size_field(DEFAULT_BATCH, "Rows per unit.")
    exclude = inputs.ExcludeField()


@register
class CopyDatabase(Operation):
    name = "db.copy"
    label = "Copy the database to another"
    description = "Copy this site's tables to another configured database, then verify them."
    max_attempts = 5
    input_form = CopyForm
    # It deletes and writes the target's rows.
    access = Access.PRIVILEGED
    # units() decides whether another tail is needed from the last tail's result.
    look_ahead = False

    # --- enqueue -------------------------------------------------------------------

    def unique_key(self, data: dict[str, Any]) -> str:
        """One writer per target database: copies and restores into it share the key."""
        return inputs.database_write_key(data["target"])

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        inputs.reject_unknown(data, FIELDS)
        source = inputs.database_alias(data, "source")
        target = inputs.database_alias(data, "target", default=None)
        if source == target or same_database(source, target):
            raise InputRejected("target", f"{target!r} is the same database as the source")
        exclude = inputs.exclude(data)
        inputs.check_tables(source, exclude)
        return {
            "source": source,
            "target": target,
            "replace": inputs.flag(data, "replace"),
            "batch_size": inputs.batch_size(data, DEFAULT_BATCH),
            "exclude": exclude,
        }

    # --- planning ------------------------------------------------------------------

    def _tables(self, ctx: JobContext) -> tuple[dict[str, TableSpec], Plan]:
        specs = site_tables(ctx.input["source"], ctx.input["exclude"])
        specs = [s for s in specs if _allowed(s, ctx.input["target"])]
        return {spec.label: spec for spec in specs}, plan_for(specs)

    def total_units(self, ctx: JobContext) -> int:
        specs, plan = self._tables(ctx)
        size, source = ctx.input["batch_size"], ctx.input["source"]
        batches_per = {label: units_for(count_rows(specs[label], source), size) for label in specs}
        linked = sum(batches_per[label] for label in plan.deferred)
        # prepare, the copies, the links, sequences, rebuild, then each table's batches
        # and its close, and the journals' tail.
        tail = int(any(is_journal(label) for label in specs))
        return 3 + 2 * sum(batches_per.values()) + linked + len(specs) + tail

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        checkpoint = ctx.checkpoint or {"phase": "prepare"}
        specs, plan = self._tables(ctx)
        phase = checkpoint["phase"]
        if phase == "prepare":
            yield Unit(key="prepare", checkpoint={"phase": "copy"})
            phase, checkpoint = "copy", {}
        for stage, order in (("copy", plan.order), ("link", [*plan.deferred])):
            if phase != stage:
                continue
            ordered = [label for label in plan.order if label in order]
            try:
                for batch in batches(
                    specs,
                    ordered,
                    ctx.input["source"],
                    Pacer(cap=ctx.input["batch_size"]),  # rows per unit from the pace
                    table=checkpoint.get("table"),
                    after=checkpoint.get("after"),
                    index=checkpoint.get("n", 0),
                ):
                    yield Unit(
                        key=f"{stage}:{batch.label}:{batch.index}",
                        payload={"table": batch.label, "after": batch.after, "upto": batch.upto},
                        checkpoint={
                            "phase": stage,
                            "table": batch.label,
                            "after": batch.upto,
                            "n": batch.index + 1,
                        },
                    )
            except ValueError as exc:
                raise NonRetryable(f"the site's tables changed during the copy: {exc}") from None
            phase, checkpoint = ("link" if stage == "copy" else "sequences"), {}
        if phase == "sequences":
            yield Unit(key="sequences", checkpoint={"phase": "rebuild"})
            phase, checkpoint = "rebuild", {}
        if phase == "rebuild":
            yield Unit(key="rebuild", checkpoint={"phase": "verify"})
            phase, checkpoint = "verify", {}
        if phase == "verify":
            yield from self._verify_units(ctx, specs, plan, checkpoint)
            phase, checkpoint = "tail", {}
        if phase == "tail" and any(is_journal(label) for label in plan.order):
            # The first tail always runs (it checks the counts); another one whenever a
            # journal grew since — when this job was taken back after its last unit, say,
            # its reclaim event landed in the source after everything was verified.
            tails = checkpoint.get("tails", 0)
            while tails == 0 or self._journals_grew(ctx, specs, plan, tails):
                ctx.set_total(ctx.units_done + 1)  # (estimated so far: units are paced)
                yield Unit(
                    key=f"tail:{tails}", payload={"n": tails},
                    checkpoint={"phase": "tail", "tails": tails + 1},
                )  # fmt: skip
                tails += 1

    def _verify_units(
        self, ctx: JobContext, specs: dict[str, TableSpec], plan: Plan, checkpoint: dict
    ) -> Iterator[Unit]:
        """Each table's batches, then its close; resumed at (table, last key) or the next table."""
        labels = list(plan.order)
        table = checkpoint.get("table")
        if table is None:
            start, after, number = 0, None, 0
        elif checkpoint.get("closed"):
            start, after, number = labels.index(table) + 1, None, 0
        else:
            start, after, number = labels.index(table), checkpoint.get("after"), checkpoint["n"]
        pacer = Pacer(cap=ctx.input["batch_size"])  # rows per unit from the pace
        for label in labels[start:]:
            todo = batches(
                specs, [label], ctx.input["source"], pacer,
                table=label, after=after, index=number,
            )  # fmt: skip
            for batch in todo:
                yield Unit(
                    key=f"verify:{label}:{batch.index}",
                    payload={"table": label, "after": batch.after, "upto": batch.upto},
                    checkpoint={"phase": "verify", "table": label, "after": batch.upto,
                                "n": batch.index + 1},
                )  # fmt: skip
            if label == labels[-1]:
                # The total was an estimate (units are paced); now it is known, but for
                # the journals' tail, which sets it again.
                tail = any(is_journal(each) for each in labels)
                ctx.set_total(ctx.units_done + 1 + int(tail))
            yield Unit(
                key=f"verified:{label}",
                payload={"table": label},
                checkpoint={"phase": "verify", "table": label, "closed": True},
            )
            after, number = None, 0

    # --- units ---------------------------------------------------------------------

    def run_unit(self, ctx: JobContext, unit: Unit) -> Any:
        specs, plan = self._tables(ctx)
        source, target = ctx.input["source"], ctx.input["target"]
        step = unit.key.split(":", 1)[0]
        if step == "prepare":
            return self._prepare(ctx, specs, plan)
        if step in ("copy", "link"):
            spec = specs[unit.payload["table"]]
            rows = read_rows(spec, source, unit.payload["after"], unit.payload["upto"])
            null = plan.deferred.get(spec.label, ()) if step == "copy" else ()
            try:
                return {"rows": upsert(spec, target, rows, null=null)}
            except IntegrityError as exc:
                # A verdict on the data (a unique or foreign key conflict), not a glitch.
                raise NonRetryable(
                    f"the target refused {spec.label} rows after {unit.payload['after']!r} "
                    f"up to {unit.payload['upto']!r}: {exc}"
                ) from exc
        if step == "sequences":
            return {"statements": reset_sequences([specs[label] for label in plan.order], target)}
        if step == "rebuild":
            rebuilt = rebuilds_after(plan.order)
            for entry in rebuilt:
                entry.rebuild(target)
            return {"rebuilt": [entry.name for entry in rebuilt]}
        if step == "verify":
            faults.reach("dbcopy.before_verify")
            spec = specs[unit.payload["table"]]
            return self._verify_batch(spec, source, target, unit.payload)
        if step == "verified":
            return self._verify_table(ctx, specs[unit.payload["table"]], source, target)
        if step == "tail":
            return self._tail(ctx, specs, plan, source, target, unit.payload["n"])
        raise NonRetryable(f"unknown copy step {unit.key!r}")

    def _verify_batch(self, spec: TableSpec, source: str, target: str, payload: dict) -> dict:
        rows = read_rows(spec, source, payload["after"], payload["upto"])
        position = spec.columns.index(spec.pk.attname)
        appended = _copy_absent(spec, target, rows, position) if is_journal(spec.label) else 0
        ours = digest_rows(rows)  # encoded already: encoding again changes nothing
        theirs = digest_keys(spec, target, [row[position] for row in rows])
        if ours != theirs:
            raise NonRetryable(
                f"{spec.label} differs after the copy (rows after {payload['after']!r} up to "
                f"{payload['upto']!r}): source {ours.rows} rows (digest "
                f"{ours.hexdigest()[:12]}), target {theirs.rows} rows (digest "
                f"{theirs.hexdigest()[:12]}); stop the site's writers and copy again"
            )
        return {**ours.as_dict(), "upto": payload["upto"], "appended": appended}

    def _verify_table(self, ctx: JobContext, spec: TableSpec, source: str, target: str) -> dict:
        prefix = f"verify:{spec.label}:"
        found = UnitResult.objects.filter(job_id=ctx.job_id, key__startswith=prefix)
        results: dict[int, Any] = {
            int(key.rsplit(":", 1)[1]): r for key, r in found.values_list("key", "result")
        }
        whole = combine(results.values())
        upto = results[max(results)].get("upto") if results else None
        appended = 0
        if is_journal(spec.label):
            # Appended since its last batch was verified (the engine's own events).
            extra, upto, appended = self._journal_tail(ctx, spec, source, target, upto)
            whole.merge(extra.rows, extra.total)
        counts = {"source": count_rows(spec, source), "target": count_rows(spec, target)}
        if counts != {"source": whole.rows, "target": whole.rows}:
            raise NonRetryable(
                f"{spec.label} differs after the copy: the verified batches hold {whole.rows} "
                f"rows, the source has {counts['source']} and the target {counts['target']} "
                "now; stop the site's writers and copy again"
            )
        return {**whole.as_dict(), "upto": upto, "appended": appended}

    def _journal_tail(
        self, ctx: JobContext, spec: TableSpec, source: str, target: str, after: Any
    ) -> tuple[TableDigest, Any, int]:
        """Copy and verify the journal's rows after ``after``: (digest, new last key, copied).

        One batch at most: more than that appended during a copy is the site
        writing, which the counts then report.
        """
        upto = next_boundary(spec, source, after, ctx.input["batch_size"])
        if upto is None:
            return TableDigest(), after, 0
        result = self._verify_batch(spec, source, target, {"after": after, "upto": upto})
        digest = TableDigest(rows=int(result["rows"]), total=int(result["digest"], 16))
        return digest, upto, int(result["appended"])

    def _verified_so_far(self, ctx: JobContext, label: str, tails: int) -> dict:
        """A journal's rows verified (rows, digest, last key) by its close and ``tails`` tails."""
        if tails == 0:
            return UnitResult.objects.get(job_id=ctx.job_id, key=f"verified:{label}").result
        previous = UnitResult.objects.get(job_id=ctx.job_id, key=f"tail:{tails - 1}").result
        return previous[label]

    def _journals_grew(
        self, ctx: JobContext, specs: dict[str, TableSpec], plan: Plan, tails: int
    ) -> bool:
        for label in plan.order:
            if is_journal(label):
                upto = self._verified_so_far(ctx, label, tails)["upto"]
                if next_boundary(specs[label], ctx.input["source"], upto, 1) is not None:
                    return True
        return False

    def _tail(
        self,
        ctx: JobContext,
        specs: dict[str, TableSpec],
        plan: Plan,
        source: str,
        target: str,
        tails: int,
    ) -> dict:
        """After every close: the journals' rows appended since, copied and verified."""
        done = {}
        for label in plan.order:
            if not is_journal(label):
                continue
            spec = specs[label]
            before = self._verified_so_far(ctx, label, tails)
            extra, upto, appended = self._journal_tail(ctx, spec, source, target, before["upto"])
            whole = combine([before])
            whole.merge(extra.rows, extra.total)
            counts = {"source": count_rows(spec, source), "target": count_rows(spec, target)}
            if counts != {"source": whole.rows, "target": whole.rows}:
                raise NonRetryable(
                    f"{label} differs after the copy: {whole.rows} rows verified, the source "
                    f"has {counts['source']} and the target {counts['target']} now; stop the "
                    "site's writers and copy again"
                )
            done[label] = {**whole.as_dict(), "upto": upto, "appended": appended}
        return done

    def _prepare(self, ctx: JobContext, specs: dict[str, TableSpec], plan: Plan) -> dict:
        target = ctx.input["target"]
        ordered = [specs[label] for label in plan.order]
        if missing := missing_tables(target, ordered):
            raise NonRetryable(
                f"the target {target!r} lacks tables {', '.join(missing[:MAX_LISTED])}: "
                f"run `python manage.py migrate --database {target}` first"
            )
        if problems := _column_problems(ordered, target):
            raise NonRetryable(
                f"the target's schema differs: {'; '.join(problems[:MAX_LISTED])}; "
                "migrate both databases to the same version first"
            )
        if ctx.input["replace"]:
            try:
                with fenced(ctx):  # a worker that lost the job must not delete others' work
                    deleted = delete_all(ordered, target)
            except IntegrityError as exc:
                raise NonRetryable(
                    f"the target's rows cannot be deleted ({exc}); a table left out of the copy "
                    "still references them"
                ) from exc
            return {"deleted": sum(deleted.values())}
        occupied = [
            f"{spec.table} ({n} rows)" for spec in ordered if (n := count_rows(spec, target))
        ]
        if occupied:
            raise NonRetryable(
                f"the target {target!r} already has rows in {', '.join(occupied[:MAX_LISTED])}; "
                "copy with replace to delete them first (migrate creates content types and "
                "permissions, so a freshly migrated target needs replace too)"
            )
        return {"deleted": 0}


def _copy_absent(spec: TableSpec, target: str, rows: list[list[Any]], position: int) -> int:
    """Upsert the rows (encoded) whose keys the target lacks; how many there were."""
    present = spec.model._base_manager.using(target).filter(
        pk__in=[decode_pk(spec, row[position]) for row in rows]
    )
    have = {encode_pk(spec, key) for key in present.values_list(spec.pk.attname, flat=True)}
    absent = [row for row in rows if row[position] not in have]
    return upsert(spec, target, absent)


def _allowed(spec: TableSpec, alias: str) -> bool:
    return router.allow_migrate_model(alias, spec.model)


def _column_problems(specs: list[TableSpec], alias: str) -> list[str]:
    connection = connections[alias]
    problems = []
    with connection.cursor() as cursor:
        for spec in specs:
            found = {
                c.name for c in connection.introspection.get_table_description(cursor, spec.table)
            }
            wanted = {f.column for f in spec.fields}
            if wanted - found:
                problems.append(f"{spec.table} lacks {', '.join(sorted(wanted - found))}")
    return problems
