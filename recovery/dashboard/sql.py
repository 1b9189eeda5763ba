"""Database structures Django's models cannot declare: search indexes and day counts.

- **Search** over ``type``, ``detail`` and ``db`` of a million Recovery events:
  SQLite gets an FTS5 table with the ``trigram`` tokenizer (external content:
  the text is not stored twice); PostgreSQL gets ``pg_trgm`` GIN indexes,
  which serve ``ILIKE '%…%'`` directly.
- **Counts** per day (``DailyCount``).

PostgreSQL maintains both in the inserting statement: the GIN indexes are
indexes, and per-statement triggers over the transition tables turn the
ingest's 10,000-row inserts into one upsert per (day, failed, deleted, severity), taken
in a fixed order so two writers cannot deadlock.

SQLite **defers** both: a trigram index updated row by row inside the ingest
costs about three times the ingest itself. Events up to
``recovery_searchcursor.indexed_upto`` are indexed and counted; ``catch_up``
indexes and counts the next batch in bulk and moves the cursor in the same
transaction; readers scan and count the (normally small) tail beyond the
cursor directly, so search results and totals are exact at every moment.
Deleting or editing an event already indexed adjusts the index and the counts
by trigger (rare: events are append-only history).

``install(connection)`` is idempotent (``IF NOT EXISTS`` / ``OR REPLACE``) and
rebuilds the index and the counts from the table, so running it again is
always safe. **A later migration that rebuilds ``recovery_recoveryevent`` on
SQLite** (Django copies the table on most ``AlterField``s) drops its triggers:
call ``install_in_migration`` again at its end. ``tests/integration/dashboard/test_search.py``
fails if the triggers are missing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

log = logging.getLogger("recovery.dashboard")

EVENTS = "recovery_recoveryevent"
COUNTS = "recovery_dailycount"
FTS = "recovery_event_fts"
CURSOR = "recovery_searchcursor"
SQLITE_TRIGGERS = (
    "recovery_event_fts_ad",
    "recovery_event_fts_au",
    "recovery_dailycount_ad",
    "recovery_dailycount_au",
)
# Earlier versions indexed and counted every insert by trigger.
SQLITE_RETIRED_TRIGGERS = ("recovery_event_fts_ai", "recovery_dailycount_ai")
CATCH_UP_BATCH = 20_000
PG_TRIGGERS = ("recovery_dailycount_ins", "recovery_dailycount_del", "recovery_dailycount_upd")
PG_TRGM_INDEXES = {
    "recovery_event_type_trgm": "type",
    "recovery_event_detail_trgm": "detail",
    "recovery_event_db_trgm": "db",
}

# --- the keys of a count -----------------------------------------------------------------

# The columns of recovery_dailycount that key a count, with the value of each for an
# event row ``{row}``. ``severity`` came with migration 0007: the earlier migrations
# install the SQL of their own day (``install_in_migration``), without it.
_SQLITE_DAY = "substr(COALESCE({row}.ts, {row}.recorded_at), 1, 10)"
_SQLITE_KEYS = {
    "day": _SQLITE_DAY,
    "failed": "{row}.done IS 0",
    "deleted": "{row}.deleted_data = 1",
    "severity": "{row}.severity",
}
_PG_DAY = "(COALESCE({row}.ts, {row}.recorded_at) AT TIME ZONE 'UTC')::date"
_PG_KEYS = {
    "day": _PG_DAY,
    "failed": "{row}.done IS FALSE",
    "deleted": "{row}.deleted_data",
    "severity": "{row}.severity",
}
KEYS = tuple(_SQLITE_KEYS)
# The day of an event row, for queries over the events table itself.
SQLITE_DAY_OF_ROW = "substr(COALESCE(ts, recorded_at), 1, 10)"


def _keys(by_severity: bool) -> tuple[str, ...]:
    return KEYS if by_severity else KEYS[:-1]


def _values(exprs: dict[str, str], keys: tuple[str, ...], row: str) -> str:
    return ", ".join(exprs[key].format(row=row) for key in keys)


def _positions(keys: tuple[str, ...]) -> str:
    return ", ".join(str(n) for n in range(1, len(keys) + 1))


# --- SQLite -------------------------------------------------------------------------------


def _sqlite_count(row: str, delta: str, keys: tuple[str, ...]) -> str:
    columns = ", ".join(keys)
    return (
        f"INSERT INTO {COUNTS} ({columns}, events) "
        f"VALUES ({_values(_SQLITE_KEYS, keys, row)}, {delta}) "
        f"ON CONFLICT ({columns}) DO UPDATE SET events = events + ({delta});"
    )


def _sqlite_uncount(row: str, keys: tuple[str, ...]) -> str:
    """Only ever decrements an existing row: if the counts were emptied first (a
    flush that deletes both tables), a delete must not leave a -1 behind."""
    where = " AND ".join(f"{key} = ({_SQLITE_KEYS[key].format(row=row)})" for key in keys)
    return f"UPDATE {COUNTS} SET events = events - 1 WHERE {where};"


def _sqlite_recount(keys: tuple[str, ...], where: str = "") -> str:
    columns = ", ".join(keys)
    return (
        f"INSERT INTO {COUNTS} ({columns}, events) "
        f"SELECT {_values(_SQLITE_KEYS, keys, EVENTS)}, count(*) FROM {EVENTS}{where} "
        f"GROUP BY {_positions(keys)} "
        f"ON CONFLICT ({columns}) DO UPDATE SET events = events + excluded.events"
    )


# Only rows the index and the counts already hold are adjusted on delete/update.
_INDEXED = f"old.id <= (SELECT indexed_upto FROM {CURSOR} WHERE id = 1)"


def sqlite_install(by_severity: bool = True) -> list[str]:
    keys = _keys(by_severity)
    watched = ", ".join(["ts", "recorded_at", "done", "deleted_data", *keys[3:]])
    return [
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {FTS} USING fts5("
        f"type, detail, db, content='{EVENTS}', content_rowid='id', tokenize='trigram')",
        *(f"DROP TRIGGER IF EXISTS {name}" for name in SQLITE_RETIRED_TRIGGERS),
        f"""CREATE TRIGGER IF NOT EXISTS recovery_event_fts_ad AFTER DELETE ON {EVENTS}
            WHEN {_INDEXED} BEGIN
            INSERT INTO {FTS} ({FTS}, rowid, type, detail, db)
                VALUES ('delete', old.id, old.type, old.detail, old.db);
        END""",
        f"""CREATE TRIGGER IF NOT EXISTS recovery_event_fts_au
            AFTER UPDATE OF type, detail, db ON {EVENTS} WHEN {_INDEXED} BEGIN
            INSERT INTO {FTS} ({FTS}, rowid, type, detail, db)
                VALUES ('delete', old.id, old.type, old.detail, old.db);
            INSERT INTO {FTS} (rowid, type, detail, db)
                VALUES (new.id, new.type, new.detail, new.db);
        END""",
        # Dropped and created again: an install over the other version's triggers
        # must not keep them.
        "DROP TRIGGER IF EXISTS recovery_dailycount_ad",
        f"""CREATE TRIGGER recovery_dailycount_ad AFTER DELETE ON {EVENTS}
            WHEN {_INDEXED} BEGIN
            {_sqlite_uncount("old", keys)}
        END""",
        "DROP TRIGGER IF EXISTS recovery_dailycount_au",
        f"""CREATE TRIGGER recovery_dailycount_au
            AFTER UPDATE OF {watched} ON {EVENTS} WHEN {_INDEXED} BEGIN
            {_sqlite_uncount("old", keys)}
            {_sqlite_count("new", "1", keys)}
        END""",
        # Rebuild from the table: right after creation and after any gap in the triggers.
        f"INSERT INTO {FTS} ({FTS}) VALUES ('rebuild')",
        f"DELETE FROM {COUNTS}",
        _sqlite_recount(keys),
        f"DELETE FROM {CURSOR}",
        f"INSERT INTO {CURSOR} (id, indexed_upto) SELECT 1, COALESCE(max(id), 0) FROM {EVENTS}",
    ]


# One batch of the catch-up, for ids in (%s, %s]; parameters: low, high.
_SQLITE_CATCH_UP = [
    f"""INSERT INTO {FTS} (rowid, type, detail, db)
        SELECT id, type, detail, db FROM {EVENTS} WHERE id > %s AND id <= %s""",
    _sqlite_recount(KEYS, " WHERE id > %s AND id <= %s"),
]

SQLITE_UNINSTALL = [
    *(f"DROP TRIGGER IF EXISTS {name}" for name in (*SQLITE_TRIGGERS, *SQLITE_RETIRED_TRIGGERS)),
    f"DROP TABLE IF EXISTS {FTS}",
]

# --- PostgreSQL ---------------------------------------------------------------------------


def _pg_upsert(rows: str, keys: tuple[str, ...]) -> str:
    columns = ", ".join(keys)
    positions = _positions(keys)
    return (
        f"INSERT INTO {COUNTS} AS c ({columns}, events) "
        f"SELECT {_values(_PG_KEYS, keys, rows)}, count(*) FROM {rows} "
        f"GROUP BY {positions} ORDER BY {positions} "
        f"ON CONFLICT ({columns}) DO UPDATE SET events = c.events + EXCLUDED.events;"
    )


def _pg_subtract(rows: str, keys: tuple[str, ...]) -> str:
    """Decrements existing rows only (see ``_sqlite_uncount``)."""
    named = ", ".join(f"{_PG_KEYS[key].format(row=rows)} AS {key}" for key in keys)
    where = " AND ".join(f"c.{key} = gone.{key}" for key in keys)
    return (
        f"UPDATE {COUNTS} AS c SET events = c.events - gone.n FROM ("
        f"SELECT {named}, count(*) AS n FROM {rows} GROUP BY {_positions(keys)}) AS gone "
        f"WHERE {where};"
    )


def _pg_recount(keys: tuple[str, ...]) -> str:
    return (
        f"INSERT INTO {COUNTS} ({', '.join(keys)}, events) "
        f"SELECT {_values(_PG_KEYS, keys, EVENTS)}, count(*) FROM {EVENTS} "
        f"GROUP BY {_positions(keys)}"
    )


def pg_install(by_severity: bool = True) -> list[str]:
    keys = _keys(by_severity)
    return [
        f"""CREATE OR REPLACE FUNCTION recovery_dailycount_ins() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN {_pg_upsert("new_rows", keys)} RETURN NULL; END $$""",
        f"""CREATE OR REPLACE FUNCTION recovery_dailycount_del() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN {_pg_subtract("old_rows", keys)} RETURN NULL; END $$""",
        f"""CREATE OR REPLACE FUNCTION recovery_dailycount_upd() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN
                {_pg_subtract("old_rows", keys)}
                {_pg_upsert("new_rows", keys)}
                RETURN NULL;
            END $$""",
        f"DROP TRIGGER IF EXISTS recovery_dailycount_ins ON {EVENTS}",
        f"""CREATE TRIGGER recovery_dailycount_ins AFTER INSERT ON {EVENTS}
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
            EXECUTE FUNCTION recovery_dailycount_ins()""",
        f"DROP TRIGGER IF EXISTS recovery_dailycount_del ON {EVENTS}",
        f"""CREATE TRIGGER recovery_dailycount_del AFTER DELETE ON {EVENTS}
            REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
            EXECUTE FUNCTION recovery_dailycount_del()""",
        f"DROP TRIGGER IF EXISTS recovery_dailycount_upd ON {EVENTS}",
        f"""CREATE TRIGGER recovery_dailycount_upd AFTER UPDATE ON {EVENTS}
            REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
            EXECUTE FUNCTION recovery_dailycount_upd()""",
        f"DELETE FROM {COUNTS}",
        _pg_recount(keys),
    ]


PG_TRGM = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    *(
        f"CREATE INDEX IF NOT EXISTS {name} ON {EVENTS} USING gin ({column} gin_trgm_ops)"
        for name, column in PG_TRGM_INDEXES.items()
    ),
]

PG_UNINSTALL = [
    *(f"DROP TRIGGER IF EXISTS {name} ON {EVENTS}" for name in PG_TRIGGERS),
    *(f"DROP FUNCTION IF EXISTS {name}()" for name in PG_TRIGGERS),
    *(f"DROP INDEX IF EXISTS {name}" for name in PG_TRGM_INDEXES),
]


# --- applying them ------------------------------------------------------------------------


def install(connection: BaseDatabaseWrapper, *, by_severity: bool = True) -> None:
    """Create (or re-create) the search index and counting triggers, then fill them.

    ``by_severity=False``: the SQL from before migration 0007, for the migrations
    before it (``install_in_migration``)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for statement in sqlite_install(by_severity):
                cursor.execute(statement)
        elif connection.vendor == "postgresql":
            for statement in pg_install(by_severity):
                cursor.execute(statement)
            try:
                # A savepoint: without the extension (not installed on the
                # server, or no right to create it) search still works, by
                # scanning, and the migration does not fail.
                with transaction.atomic(using=connection.alias):
                    for statement in PG_TRGM:
                        cursor.execute(statement)
            except Exception:
                log.exception("pg_trgm is unavailable: Recovery search will scan the table")
        else:  # pragma: no cover - the project supports SQLite and PostgreSQL
            log.warning("no search index or counting triggers for %s", connection.vendor)


def deferred(connection: BaseDatabaseWrapper) -> bool:
    """True where search and counts lag behind inserts and readers must add the tail."""
    return connection.vendor == "sqlite"


def indexed_upto(connection: BaseDatabaseWrapper) -> int | None:
    """The cursor (SQLite), or None where everything is always indexed (PostgreSQL)."""
    if not deferred(connection):
        return None
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT indexed_upto FROM {CURSOR} WHERE id = 1")
        row = cursor.fetchone()
    return row[0] if row else 0


def pending(connection: BaseDatabaseWrapper) -> int:
    """How many events wait for the index (0 on PostgreSQL). Two primary-key lookups."""
    upto = indexed_upto(connection)
    if upto is None:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {EVENTS} WHERE id > %s", [upto])
        return cursor.fetchone()[0]


def has_pending(connection: BaseDatabaseWrapper, at_least: int = 1) -> bool:
    """True if ``at_least`` events wait for the index (one primary-key range probe)."""
    upto = indexed_upto(connection)
    if upto is None:
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {EVENTS} WHERE id > %s ORDER BY id LIMIT 1 OFFSET %s",
            [upto, max(at_least, 1) - 1],
        )
        return cursor.fetchone() is not None


def catch_up(connection: BaseDatabaseWrapper, batch: int = CATCH_UP_BATCH) -> int:
    """Index and count the next ``batch`` events beyond the cursor; move it. Returns how many.

    Must run inside a transaction: the index rows, the counts and the cursor
    commit together, so a crash half-way leaves all three as they were.
    """
    if not deferred(connection):
        return 0
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT indexed_upto FROM {CURSOR} WHERE id = 1")
        low = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT count(*), max(id) FROM (SELECT id FROM {EVENTS} WHERE id > %s "
            f"ORDER BY id LIMIT %s)",
            [low, batch],
        )
        count, high = cursor.fetchone()
        if not count:
            return 0
        for statement in _SQLITE_CATCH_UP:
            cursor.execute(statement, [low, high])
        cursor.execute(
            f"UPDATE {CURSOR} SET indexed_upto = %s WHERE id = 1 AND indexed_upto = %s",
            [high, low],
        )
        if cursor.rowcount != 1:  # pragma: no cover - SQLite serialises writers
            raise RuntimeError("the search cursor moved under this catch-up")
    return count


# Derived tables (``durable.builtin.derived``): backup, restore and db.copy never move
# these; after writing events they call ``rebuild`` on that database.
DERIVED_MODELS = ("recovery.dailycount", "recovery.searchcursor")
SOURCE_MODELS = ("recovery.recoveryevent",)

_SQLITE_RESET = [
    f"INSERT INTO {FTS} ({FTS}) VALUES ('delete-all')",
    f"DELETE FROM {COUNTS}",
    f"DELETE FROM {CURSOR}",
    f"INSERT INTO {CURSOR} (id, indexed_upto) VALUES (1, 0)",
]
_PG_REBUILD = [
    # Waits for the writers in flight and holds new ones until the counts are
    # rebuilt: a concurrent insert is counted once, by its trigger, after us.
    f"LOCK TABLE {EVENTS} IN SHARE MODE",
    f"DELETE FROM {COUNTS}",
    _pg_recount(KEYS),
]


def rebuild(alias: str) -> None:
    """Recompute the counts (and SQLite's search index) on ``alias`` from its events.

    After a restore or a copy wrote events by primary key. PostgreSQL: the
    counts are recounted in one statement (the GIN indexes are indexes). SQLite:
    the index, the counts and the cursor are reset to "nothing indexed" —
    readers then scan and count every event directly, exact at once — and the
    first batch is caught up here; the indexer job does the rest, in bounded
    batches, as after any ingest. An event written below the old cursor by
    the restore would otherwise never be indexed.
    """
    connection = connections[alias]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for statement in _PG_REBUILD:
                cursor.execute(statement)
        elif connection.vendor == "sqlite":
            for statement in _SQLITE_RESET:
                cursor.execute(statement)
            catch_up(connection)


def install_in_migration(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """For ``RunPython``: install the SQL that fits the migration's own DailyCount (with
    or without ``severity``), so that every step of ``migrate``, forwards or back, leaves
    triggers that name only columns which exist."""
    model = apps.get_model("recovery", "DailyCount")
    columns = {field.column for field in model._meta.concrete_fields}
    install(schema_editor.connection, by_severity="severity" in columns)


def uninstall(connection: BaseDatabaseWrapper) -> None:
    statements = {"sqlite": SQLITE_UNINSTALL, "postgresql": PG_UNINSTALL}.get(connection.vendor, [])
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def missing(connection: BaseDatabaseWrapper) -> list[str]:
    """Names of triggers/indexes that should exist and do not (for checks and tests)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type IN ('trigger', 'table')")
            present = {row[0] for row in cursor.fetchall()}
            wanted = [*SQLITE_TRIGGERS, FTS, CURSOR]
        elif connection.vendor == "postgresql":
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass "
                "UNION SELECT indexname FROM pg_indexes WHERE tablename = %s",
                [EVENTS, EVENTS],
            )
            present = {row[0] for row in cursor.fetchall()}
            wanted = [*PG_TRIGGERS, *PG_TRGM_INDEXES]
        else:  # pragma: no cover
            return []
    return [name for name in wanted if name not in present]
