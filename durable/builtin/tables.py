"""This site's tables as backup, restore and db.copy see them.

All three move rows at the level of Django fields, not raw column bytes, so a
backup taken on SQLite restores into PostgreSQL and ``db.copy`` crosses
vendors: values are read through the ORM (its converters normalise what each
vendor returns), encoded to plain JSON by type, and decoded with each field's
own ``to_python``. Writes are upserts by primary key, done through Django's
insert machinery in *raw* mode so that ``auto_now`` fields keep their stored
values instead of being stamped with the time of the restore.

The engine's own tables (the ``durable`` app: jobs, events, unit results,
workers, inventories) are never part of the set: a restore that rewrote the
job table would rewrite the row of the very job doing the restore. Nor are
tables an app declared *derived* (``durable.builtin.derived``): they are
rebuilt from their sources instead of moved.

Top to bottom: pure helpers (value encoding, the order-independent table
digest, the foreign-key plan), then the functions that touch a database.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, cast

from django.apps import apps
from django.core.management.color import no_style
from django.db import connections, models, router, transaction
from django.db.models.constants import OnConflict
from django.utils.duration import duration_string

from ..pacing import Pacer
from .derived import derived_labels

ENGINE_APP = "durable"
MAX_DIGEST = 2**256
MAX_PARAMETERS = 65535

# --- values ---------------------------------------------------------------------------


def encode_value(value: Any) -> Any:
    """A field value as plain JSON; ``decode_value`` with the field gives it back.

    Types are those Django's ORM returns for its built-in fields. JSONField
    values (dicts, lists, scalars) pass through as JSON.
    """
    if value is None or isinstance(value, bool | int | str | list | dict):
        return value
    if isinstance(value, float):
        # JSON has no NaN/Infinity; FloatField.to_python reads these strings back.
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return duration_string(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def decode_value(model_field: models.Field, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(model_field, models.JSONField):
        return value  # stored as JSON already; to_python would not touch it either
    return model_field.to_python(value)


def row_bytes(encoded_row: Sequence[Any]) -> bytes:
    """Canonical bytes of one encoded row: the same on every vendor for the same values.

    Keys are sorted because PostgreSQL's jsonb reorders object keys.
    """
    return json.dumps(
        encoded_row, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


@dataclass
class TableDigest:
    """An order-independent checksum of a table's rows: a count and a sum of SHA-256s.

    Order-independent because two vendors may sort text keys differently
    (collations), yet hold the same rows. Summing 256-bit hashes modulo 2**256
    changes when any row is added, dropped or altered; rows are unique by
    primary key, so the cancellations an XOR would allow cannot occur.
    """

    rows: int = 0
    total: int = 0

    def add(self, data: bytes) -> None:
        self.rows += 1
        self.total = (self.total + int.from_bytes(hashlib.sha256(data).digest(), "big")) % (
            MAX_DIGEST
        )

    def merge(self, rows: int, total: int) -> None:
        """Add another part's count and sum (the parts hold disjoint rows)."""
        self.rows += rows
        self.total = (self.total + total) % MAX_DIGEST

    def hexdigest(self) -> str:
        return f"{self.total:064x}"

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "digest": self.hexdigest()}


# --- the foreign-key plan ----------------------------------------------------------------


class PlanError(ValueError):
    """The tables cannot be loaded in any order (a cycle of non-nullable foreign keys)."""


@dataclass(frozen=True)
class Plan:
    """``order``: parents before the tables that reference them.

    ``deferred[label]``: foreign-key columns that point into the table's own
    cycle (a self-reference, or tables referencing each other). They are
    written as NULL on the first pass and filled in by a second pass once
    every row of the cycle exists, because separate units are separate
    transactions and a deferred constraint is checked at each commit.
    """

    order: tuple[str, ...]
    deferred: Mapping[str, tuple[str, ...]]


def plan_order(edges: Mapping[str, Mapping[str, tuple[str, bool]]]) -> Plan:
    """Order tables by their foreign keys.

    ``edges[label]`` maps each foreign-key column of the table to
    ``(target label, nullable)``. Targets outside ``edges`` (excluded tables)
    impose no order. Ties are broken by label, so the plan is deterministic.
    """
    labels = sorted(edges)
    known = set(labels)
    targets = {
        label: sorted({target for target, _ in edges[label].values() if target in known})
        for label in labels
    }
    component = _strongly_connected(labels, targets)
    members: dict[int, list[str]] = {}
    for label in labels:
        members.setdefault(component[label], []).append(label)

    deferred: dict[str, tuple[str, ...]] = {}
    inner: dict[str, set[str]] = {label: set() for label in labels}
    for label in labels:
        cols = []
        for column, (target, nullable) in sorted(edges[label].items()):
            if target not in known or component[target] != component[label]:
                continue
            if nullable:
                cols.append(column)
            elif target == label:
                raise PlanError(
                    f"{label}.{column} is a non-nullable foreign key to its own table; "
                    "its rows cannot be loaded in batches"
                )
            else:
                inner[label].add(target)
        if cols:
            deferred[label] = tuple(cols)

    # Condensed graph: component -> components it depends on (must come first).
    needs: dict[int, set[int]] = {c: set() for c in members}
    for label in labels:
        for target in targets[label]:
            if component[target] != component[label]:
                needs[component[label]].add(component[target])
    order: list[str] = []
    done: set[int] = set()
    pending = set(members)
    while pending:
        ready = [c for c in pending if needs[c] <= done]
        first = min(ready, key=lambda c: members[c][0])
        order.extend(_order_within(members[first], inner))
        done.add(first)
        pending.discard(first)
    return Plan(order=tuple(order), deferred=deferred)


def _strongly_connected(labels: list[str], targets: Mapping[str, list[str]]) -> dict[str, int]:
    """Tarjan's algorithm, iterative (no recursion limit on big schemas)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    component: dict[str, int] = {}
    counter = 0
    for root in labels:
        if root in index:
            continue
        work = [(root, iter(targets[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(targets[child])))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = index[node]
                    if member == node:
                        break
    return component


def _order_within(group: list[str], inner: Mapping[str, set[str]]) -> list[str]:
    """Inside one cycle, order by the non-nullable edges (the nullable ones are deferred)."""
    if len(group) == 1:
        return group
    members = set(group)
    remaining = {label: inner[label] & members for label in group}
    order: list[str] = []
    while remaining:
        ready = sorted(label for label, deps in remaining.items() if deps <= set(order))
        if not ready:
            raise PlanError(
                "these tables reference each other only through non-nullable foreign keys, "
                f"so no load order exists: {', '.join(sorted(remaining))}"
            )
        order.append(ready[0])
        del remaining[ready[0]]
    return order


def units_for(rows: int, batch_size: int) -> int:
    """Batches a table of ``rows`` rows needs (an empty table needs none)."""
    return -(-rows // batch_size)


# --- the site's tables -----------------------------------------------------------------


class TableError(ValueError):
    """A model cannot be handled (e.g. a composite primary key); names it."""


@dataclass(frozen=True)
class TableSpec:
    """One model's own table: its local concrete fields (multi-table children included)."""

    label: str
    table: str
    model: type[models.Model]
    fields: tuple[models.Field, ...] = field(repr=False)
    pk: models.Field = field(repr=False)

    @property
    def columns(self) -> list[str]:
        return [f.attname for f in self.fields]

    def foreign_keys(self) -> dict[str, tuple[str, bool]]:
        return {
            f.attname: (_target_label(f), f.null)
            for f in self.fields
            if f.is_relation and (f.many_to_one or f.one_to_one)
        }


def _target_label(field: models.Field) -> str:
    """The concrete model a relation points at. Its lazy names ("app.Model", "self")
    are resolved once the app registry is ready, as it is whenever tables are read."""
    model = cast("type[models.Model]", field.related_model)
    return cast("type[models.Model]", model._meta.concrete_model)._meta.label_lower


def spec_for(model: type[models.Model]) -> TableSpec:
    opts = model._meta
    pk = opts.pk
    if pk is None or getattr(opts, "pk_fields", [pk]) != [pk]:
        raise TableError(f"{opts.label_lower} has a composite primary key, which is not supported")
    return TableSpec(
        label=opts.label_lower,
        table=opts.db_table,
        model=model,
        # Generated columns are computed by the database: never written, so not carried.
        fields=tuple(f for f in opts.local_concrete_fields if not getattr(f, "generated", False)),
        pk=pk,
    )


def parse_exclude(values: Iterable[str]) -> list[str]:
    """Validate ``app_label`` / ``app_label.model`` names; raise ValueError naming the bad one."""
    cleaned = []
    for raw in values:
        name = str(raw).strip().lower()
        if not name:
            continue
        if "." in name:
            app_label, model_name = name.split(".", 1)
            try:
                apps.get_model(app_label, model_name)
            except LookupError:
                raise ValueError(f"no model named {raw!r} (use app_label.model)") from None
        elif not any(config.label == name for config in apps.get_app_configs()):
            raise ValueError(f"no installed app labelled {raw!r}")
        cleaned.append(name)
    return sorted(set(cleaned))


def site_tables(alias: str, exclude: Iterable[str] = ()) -> list[TableSpec]:
    """Every table this site's models keep on ``alias``, by label, minus the engine's.

    Derived tables are left out too: they are rebuilt, never moved or compared.
    """
    excluded = set(exclude) | derived_labels()
    specs = []
    for model in apps.get_models(include_auto_created=True):
        opts = model._meta
        if opts.proxy or not opts.managed or opts.swapped:
            continue
        if opts.app_label == ENGINE_APP or opts.app_label in excluded:
            continue
        if opts.label_lower in excluded:
            continue
        if not router.allow_migrate_model(alias, model):
            continue
        specs.append(spec_for(model))
    return sorted(specs, key=lambda spec: spec.label)


def plan_for(specs: Sequence[TableSpec]) -> Plan:
    return plan_order({spec.label: spec.foreign_keys() for spec in specs})


def missing_tables(alias: str, specs: Iterable[TableSpec]) -> list[str]:
    existing = set(connections[alias].introspection.table_names())
    return [spec.table for spec in specs if spec.table not in existing]


def same_database(a: str, b: str) -> bool:
    """True if two aliases reach the same database (a copy onto itself would wipe it)."""
    one, two = connections[a].settings_dict, connections[b].settings_dict
    keys = ("ENGINE", "NAME", "HOST", "PORT")
    return all(str(one.get(k) or "") == str(two.get(k) or "") for k in keys)


# --- reading ------------------------------------------------------------------------------


def _rows(spec: TableSpec, alias: str) -> models.QuerySet:
    # The base manager: a custom default manager may hide rows (soft deletes...).
    return spec.model._base_manager.using(alias).order_by(spec.pk.attname)


def encode_pk(spec: TableSpec, value: Any) -> Any:
    return encode_value(value)


def decode_pk(spec: TableSpec, value: Any) -> Any:
    return decode_value(spec.pk, value)


def next_boundary(spec: TableSpec, alias: str, after: Any, batch_size: int) -> Any | None:
    """The primary key that ends the next batch after ``after`` (encoded), or None at the end."""
    return _boundary(spec, alias, after, batch_size)[0]


def _boundary(spec: TableSpec, alias: str, after: Any, batch_size: int) -> tuple[Any | None, int]:
    """(``next_boundary``, how many rows the batch up to it holds)."""
    rows = _rows(spec, alias)
    if after is not None:
        rows = rows.filter(pk__gt=decode_pk(spec, after))
    keys = list(rows.values_list(spec.pk.attname, flat=True)[:batch_size])
    return (encode_pk(spec, keys[-1]) if keys else None), len(keys)


def read_rows(spec: TableSpec, alias: str, after: Any, upto: Any) -> list[list[Any]]:
    """Encoded rows with ``after < pk <= upto`` in primary-key order: one SELECT."""
    rows = _rows(spec, alias).filter(pk__lte=decode_pk(spec, upto))
    if after is not None:
        rows = rows.filter(pk__gt=decode_pk(spec, after))
    return [[encode_value(v) for v in row] for row in rows.values_list(*spec.columns)]


@dataclass(frozen=True)
class Batch:
    """Rows ``after < pk <= upto`` of table ``label``; ``index`` counts the table's batches."""

    label: str
    index: int
    after: Any
    upto: Any
    rows: int = 0  # how many rows it held when its boundary was read


def batches(
    specs: Mapping[str, TableSpec],
    order: Sequence[str],
    alias: str,
    batch_size: int | Pacer,
    *,
    table: str | None = None,
    after: Any = None,
    index: int = 0,
) -> Iterator[Batch]:
    """The batches still to do, resuming at (``table``, ``after``) in ``order``.

    Each boundary is read just before its batch is yielded, so rows inserted
    meanwhile past the boundary are picked up by a later batch. Raises
    ValueError if ``table`` is not in ``order`` (the site's tables changed).
    ``batch_size``: rows per batch, or a ``Pacer`` that sizes each batch from
    the time the ones before took (its cap the most rows a batch holds); each
    batch is timed until the generator is asked for the next one.
    """
    pacer = batch_size if isinstance(batch_size, Pacer) else None
    start = order.index(table) if table is not None else 0
    for position in range(start, len(order)):
        label = order[position]
        if position != start:
            after, index = None, 0
        while True:
            size = pacer.size() if pacer is not None else cast(int, batch_size)
            upto, rows = _boundary(specs[label], alias, after, size)
            if upto is None:
                break
            yield Batch(label, index, after, upto, rows)
            if pacer is not None:
                pacer.done(rows)
            after, index = upto, index + 1


def digest_rows(rows: Iterable[Sequence[Any]]) -> TableDigest:
    """A ``TableDigest`` of rows as the ORM returned them (encoded here)."""
    digest = TableDigest()
    for row in rows:
        digest.add(row_bytes([encode_value(v) for v in row]))
    return digest


def digest_batch(spec: TableSpec, alias: str, after: Any, upto: Any) -> TableDigest:
    """The digest of rows ``after < pk <= upto``: one bounded SELECT, streamed."""
    rows = _rows(spec, alias).filter(pk__lte=decode_pk(spec, upto))
    if after is not None:
        rows = rows.filter(pk__gt=decode_pk(spec, after))
    return digest_rows(rows.values_list(*spec.columns).iterator(chunk_size=2000))


def digest_keys(spec: TableSpec, alias: str, keys: Sequence[Any], chunk: int = 500) -> TableDigest:
    """The digest of the rows whose primary keys (encoded) are ``keys``, read in chunks.

    By key, not by range: two vendors may order text keys differently
    (collations), so "after < pk <= upto" can hold other rows on each side.
    """
    digest = TableDigest()
    decoded = [decode_pk(spec, key) for key in keys]
    for start in range(0, len(decoded), chunk):
        rows = _rows(spec, alias).filter(pk__in=decoded[start : start + chunk])
        part = digest_rows(rows.values_list(*spec.columns))
        digest.merge(part.rows, part.total)
    return digest


def combine(digests: Iterable[Mapping[str, Any]]) -> TableDigest:
    """Batches' ``{"rows", "digest"}`` added up: the digest of the whole table."""
    total = TableDigest()
    for part in digests:
        total.merge(int(part["rows"]), int(part["digest"], 16))
    return total


def count_rows(spec: TableSpec, alias: str) -> int:
    return spec.model._base_manager.using(alias).count()


# --- writing ------------------------------------------------------------------------------


def decode_rows(spec: TableSpec, rows: Iterable[Sequence[Any]]) -> Iterator[models.Model]:
    model = spec.model
    for row in rows:
        if len(row) != len(spec.fields):
            raise ValueError(
                f"{spec.label}: a row has {len(row)} values, expected {len(spec.fields)}"
            )
        yield model(
            **{f.attname: decode_value(f, v) for f, v in zip(spec.fields, row, strict=True)}
        )


def upsert(
    spec: TableSpec, alias: str, rows: Sequence[Sequence[Any]], *, null: Iterable[str] = ()
) -> int:
    """Insert or update ``rows`` (encoded, in ``spec.columns`` order) by primary key.

    Raw mode: values are written as given, ``auto_now`` and other ``pre_save``
    hooks do not run — a restore must reproduce the stored timestamps.
    Columns in ``null`` are written as NULL (the first pass of a cycle).
    Runs in one transaction on ``alias``; repeating it changes nothing.
    """
    if not rows:
        return 0
    objs = list(decode_rows(spec, rows))
    for name in null:
        for obj in objs:
            setattr(obj, name, None)
    others = [f for f in spec.fields if f is not spec.pk]
    conflict = OnConflict.UPDATE if others else OnConflict.IGNORE
    connection = connections[alias]
    # PostgreSQL with server-side binding takes at most 65535 parameters per statement.
    limit = MAX_PARAMETERS // len(spec.fields)
    size = max(min(connection.ops.bulk_batch_size(list(spec.fields), objs), limit), 1)
    manager = spec.model._base_manager
    with transaction.atomic(using=alias):
        for start in range(0, len(objs), size):
            # QuerySet._insert is Django's own path for Model.save() and
            # bulk_create(); it is the one way to upsert with raw=True (private:
            # the stubs do not declare it).
            manager.using(alias)._insert(  # type: ignore[attr-defined]
                objs[start : start + size],
                fields=list(spec.fields),
                using=alias,
                raw=True,
                on_conflict=conflict,
                update_fields=others if others else None,
                unique_fields=[spec.pk],
            )
    return len(objs)


def delete_all(specs: Sequence[TableSpec], alias: str) -> dict[str, int]:
    """Empty these tables in one transaction (children first; deferred FKs check at commit)."""
    deleted = {}
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        quote = connections[alias].ops.quote_name
        for spec in reversed(specs):
            cursor.execute(f"DELETE FROM {quote(spec.table)}")  # noqa: S608 - a quoted table name
            deleted[spec.label] = max(cursor.rowcount, 0)
    return deleted


def reset_sequences(specs: Sequence[TableSpec], alias: str) -> int:
    """After writing explicit ids: move PostgreSQL sequences past them (SQLite needs nothing)."""
    connection = connections[alias]
    statements = connection.ops.sequence_reset_sql(no_style(), [s.model for s in specs])
    if statements:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)
    return len(statements)


def advance_sequence(spec: TableSpec, alias: str, past: int) -> None:
    """Make the next id the database hands out for ``spec`` greater than ``past``.

    Never moves a sequence back. For a journal a restore is about to refill:
    a row the engine appends meanwhile must not take an id the backup's rows
    will be written under (the upsert would overwrite it).
    """
    if past < 1:
        return  # every id is greater than 0 already
    connection = connections[alias]
    table = connection.ops.quote_name(spec.table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_get_serial_sequence(%s, %s)", [table, spec.pk.column])
            (sequence,) = cursor.fetchone()
            if sequence is None:
                return  # no sequence: ids are given explicitly
            # The sequence's own name, as PostgreSQL returned it (quoted where needed).
            current = f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {sequence}"  # noqa: S608
            cursor.execute(f"SELECT setval(%s, GREATEST(%s, ({current})))", [sequence, past])
        elif connection.vendor == "sqlite":
            cursor.execute(
                "UPDATE sqlite_sequence SET seq = MAX(seq, %s) WHERE name = %s", [past, spec.table]
            )
            if cursor.rowcount == 0:
                cursor.execute(
                    "INSERT INTO sqlite_sequence (name, seq) SELECT %s, %s WHERE EXISTS "
                    "(SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence')",
                    [spec.table, past],
                )


def migration_state(alias: str) -> dict[str, str]:
    """The latest applied migration per app: recorded in a backup's manifest."""
    from django.db.migrations.recorder import MigrationRecorder

    recorder = MigrationRecorder(connections[alias])
    if not recorder.has_table():
        return {}
    latest: dict[str, str] = {}
    for app, name in recorder.migration_qs.order_by("app", "name").values_list("app", "name"):
        latest[app] = name
    return latest
