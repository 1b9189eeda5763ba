"""Database structures Django's models cannot declare: search indexes and day counts.

- **Search** over ``type``, ``detail`` and ``db`` of a million Recovery events:
  SQLite gets an FTS5 table with the ``trigram`` tokenizer (external content:
  the text is not stored twice); PostgreSQL gets ``pg_trgm`` GIN indexes,
  which serve ``ILIKE '%…%'`` directly.
- **Counts** per day (``DailyCount``).

PostgreSQL maintains both in the inserting statement: the GIN indexes are
indexes, and per-statement triggers over the transition tables turn the
ingest's 10,000-row inserts into one upsert per (day, failed, deleted), taken
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
call ``install`` again at its end. ``tests/integration/dashboard/test_search.py``
fails if the triggers are missing.
"""

from __future__ import annotations

import logging

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

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

# --- SQLite -------------------------------------------------------------------------------

_SQLITE_DAY = "substr(COALESCE({row}.ts, {row}.recorded_at), 1, 10)"
# The day of an event row, for queries over the events table itself.
SQLITE_DAY_OF_ROW = "substr(COALESCE(ts, recorded_at), 1, 10)"


def _sqlite_count(row: str, delta: str) -> str:
    day = _SQLITE_DAY.format(row=row)
    return (
        f"INSERT INTO {COUNTS} (day, failed, deleted, events) "
        f"VALUES ({day}, {row}.done IS 0, {row}.deleted_data = 1, {delta}) "
        f"ON CONFLICT (day, failed, deleted) DO UPDATE SET events = events + ({delta});"
    )


def _sqlite_uncount(row: str) -> str:
    """Only ever decrements an existing row: if the counts were emptied first (a
    flush that deletes both tables), a delete must not leave a -1 behind."""
    day = _SQLITE_DAY.format(row=row)
    return (
        f"UPDATE {COUNTS} SET events = events - 1 WHERE day = {day} "
        f"AND failed = ({row}.done IS 0) AND deleted = ({row}.deleted_data = 1);"
    )


# Only rows the index and the counts already hold are adjusted on delete/update.
_INDEXED = f"old.id <= (SELECT indexed_upto FROM {CURSOR} WHERE id = 1)"

SQLITE_INSTALL = [
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
        INSERT INTO {FTS} (rowid, type, detail, db) VALUES (new.id, new.type, new.detail, new.db);
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS recovery_dailycount_ad AFTER DELETE ON {EVENTS}
        WHEN {_INDEXED} BEGIN
        {_sqlite_uncount("old")}
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS recovery_dailycount_au
        AFTER UPDATE OF ts, recorded_at, done, deleted_data ON {EVENTS} WHEN {_INDEXED} BEGIN
        {_sqlite_uncount("old")}
        {_sqlite_count("new", "1")}
    END""",
    # Rebuild from the table: right after creation and after any gap in the triggers.
    f"INSERT INTO {FTS} ({FTS}) VALUES ('rebuild')",
    f"DELETE FROM {COUNTS}",
    f"""INSERT INTO {COUNTS} (day, failed, deleted, events)
        SELECT {_SQLITE_DAY.format(row=EVENTS)}, done IS 0, deleted_data = 1, count(*)
        FROM {EVENTS} GROUP BY 1, 2, 3""",
    f"DELETE FROM {CURSOR}",
    f"INSERT INTO {CURSOR} (id, indexed_upto) SELECT 1, COALESCE(max(id), 0) FROM {EVENTS}",
]

# One batch of the catch-up, for ids in (%s, %s]; parameters: low, high.
_SQLITE_CATCH_UP = [
    f"""INSERT INTO {FTS} (rowid, type, detail, db)
        SELECT id, type, detail, db FROM {EVENTS} WHERE id > %s AND id <= %s""",
    f"""INSERT INTO {COUNTS} (day, failed, deleted, events)
        SELECT {_SQLITE_DAY.format(row=EVENTS)}, done IS 0, deleted_data = 1, count(*)
        FROM {EVENTS} WHERE id > %s AND id <= %s GROUP BY 1, 2, 3
        ON CONFLICT (day, failed, deleted) DO UPDATE SET events = events + excluded.events""",
]

SQLITE_UNINSTALL = [
    *(f"DROP TRIGGER IF EXISTS {name}" for name in (*SQLITE_TRIGGERS, *SQLITE_RETIRED_TRIGGERS)),
    f"DROP TABLE IF EXISTS {FTS}",
]

# --- PostgreSQL ---------------------------------------------------------------------------

_PG_DAY = "(COALESCE(ts, recorded_at) AT TIME ZONE 'UTC')::date"


def _pg_upsert(rows: str) -> str:
    return (
        f"INSERT INTO {COUNTS} AS c (day, failed, deleted, events) "
        f"SELECT {_PG_DAY}, done IS FALSE, deleted_data, count(*) FROM {rows} "
        f"GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 "
        f"ON CONFLICT (day, failed, deleted) DO UPDATE SET events = c.events + EXCLUDED.events;"
    )


def _pg_subtract(rows: str) -> str:
    """Decrements existing rows only (see ``_sqlite_uncount``)."""
    return (
        f"UPDATE {COUNTS} AS c SET events = c.events - gone.n FROM ("
        f"SELECT {_PG_DAY} AS day, done IS FALSE AS failed, deleted_data AS deleted, "
        f"count(*) AS n FROM {rows} GROUP BY 1, 2, 3) AS gone "
        f"WHERE c.day = gone.day AND c.failed = gone.failed AND c.deleted = gone.deleted;"
    )


PG_INSTALL = [
    f"""CREATE OR REPLACE FUNCTION recovery_dailycount_ins() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN {_pg_upsert("new_rows")} RETURN NULL; END $$""",
    f"""CREATE OR REPLACE FUNCTION recovery_dailycount_del() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN {_pg_subtract("old_rows")} RETURN NULL; END $$""",
    f"""CREATE OR REPLACE FUNCTION recovery_dailycount_upd() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN
            {_pg_subtract("old_rows")}
            {_pg_upsert("new_rows")}
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
    f"""INSERT INTO {COUNTS} (day, failed, deleted, events)
        SELECT {_PG_DAY}, done IS FALSE, deleted_data, count(*) FROM {EVENTS} GROUP BY 1, 2, 3""",
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


def install(connection: BaseDatabaseWrapper) -> None:
    """Create (or re-create) the search index and counting triggers, then fill them."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for statement in SQLITE_INSTALL:
                cursor.execute(statement)
        elif connection.vendor == "postgresql":
            for statement in PG_INSTALL:
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
    f"""INSERT INTO {COUNTS} (day, failed, deleted, events)
        SELECT {_PG_DAY}, done IS FALSE, deleted_data, count(*) FROM {EVENTS} GROUP BY 1, 2, 3""",
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
