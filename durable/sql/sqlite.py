"""The engine's SQL on SQLite: every statement by name, and the class that runs them.

One machine, one clock: lease times are computed in Python, from the moment
the write lock is held (``durable.lease.now_under_lock``) — a writer can wait
for the lock longer than a lease, and an expiry computed before the wait
would be written already past. SQLite has one writer at a time (``BEGIN
IMMEDIATE``), so nothing is row-locked and nothing is skipped.

The hot path (claims, unit commits) runs on the sqlite3 cursor, whose
placeholder is ``?``: Django's cursor wrapper costs about as much as the
statements themselves here. Its write transaction is ``BEGIN IMMEDIATE`` …
``COMMIT`` (``write``), taken in turn by this process's threads and announced
to other processes through ``durable.turns``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Field

from .. import faults, turns
from ..endings import finished
from .base import (
    COLUMN_INDEX,
    EVENTS,
    INSERT_COLUMNS,
    INSERT_FIELDS,
    JOB,
    JOB_COLUMNS,
    LEASED,
    ORDER,
    PAUSED,
    RESULTS,
    SHARED_COLUMNS,
    Cursor,
    NextClaim,
    Row,
    Stamp,
    Statements,
    T,
)

CLAIM_EVENTS_PER_INSERT = 200  # SQLite binds 4 values per started event
CLAIM_FACTS = ("id", "lease_epoch", "event_seq", "attempts")  # what a started event records

# The lease a worker holds, for the driver's cursor and for Django's.
FENCED = f"id = ? AND lease_owner = ? AND lease_epoch = ? AND state IN ({LEASED})"
HELD = FENCED.replace("?", "%s")

# --- claim ---------------------------------------------------------------------------

# SQLite turns ``NOT IN`` into an index lookup per paused queue and then sorts, so it
# keeps ``NOT EXISTS``, a per-row probe of the in-order scan.
QUEUE_NOT_PAUSED = f"NOT EXISTS (SELECT 1 FROM {PAUSED} WHERE {PAUSED}.queue = {JOB}.queue)"
# The claim's UPDATE; ``{target}`` is the pick. Parameters: owner, expiry, now, now,
# *pick's. Its rows are whole jobs with ``has_results``; the events follow
# (INSERT_STARTED) in the same transaction.
CLAIM = (
    f"UPDATE {JOB} SET state = 'running', lease_owner = %s, lease_expires_at = %s, "
    f"lease_epoch = lease_epoch + 1, started_at = COALESCE(started_at, %s), "
    f"units_at_claim = units_done, "  # a death after progress spends no attempt
    f"updated_at = %s, event_seq = event_seq + 1 WHERE {{target}} AND state = 'queued' "
    f"RETURNING {JOB_COLUMNS}, "
    f"EXISTS (SELECT 1 FROM {RESULTS} r WHERE r.job_id = {JOB}.id)"
)
INSERT_STARTED = f"INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) VALUES "
STARTED_VALUES = "(%s, %s, 'started', '', %s, %s)"  # one per event: job_id, seq, data, now

# --- renewal (Django's cursor) -----------------------------------------------------------

# Parameters: expiry, *fenced.
RENEW = f"UPDATE {JOB} SET lease_expires_at = %s WHERE {HELD} RETURNING state"

# --- unit commits (the driver's cursor) ---------------------------------------------------

# The commit also extends the lease, once less than two thirds of it is left (see
# PostgreSQL's); the expiries come as values: "renew below" and the new expiry.
EXTEND = "CASE WHEN lease_expires_at < ? THEN ? ELSE lease_expires_at END"
# Parameters: checkpoint, units_total, now, number of events, *EXTEND's, *fenced.
COMMIT_UNIT = (
    f"UPDATE {JOB} SET checkpoint = ?, units_done = units_done + 1, "
    f"units_total = COALESCE(?, units_total), updated_at = ?, "
    f"event_seq = event_seq + ?, lease_expires_at = COALESCE({EXTEND}, "
    f"lease_expires_at) WHERE {FENCED} RETURNING state, event_seq"
)
# Parameters: job_id, key, result, now.
INSERT_RESULT = (
    f"INSERT INTO {RESULTS} (job_id, key, result, created_at) "
    f"VALUES (?, ?, ?, ?) ON CONFLICT (job_id, key) DO NOTHING"
)
# The last unit's commit, which also ends the job as ``complete()`` would (see
# PostgreSQL's). Parameters: checkpoint, units_total, now, now, *fenced.
_ENDING = "state IN ('running', 'cancelling')"
FINISH_UNIT = (
    f"UPDATE {JOB} SET checkpoint = ?, units_done = units_done + 1, "
    f"units_total = COALESCE(?, units_total), updated_at = ?, "
    f"state = CASE state WHEN 'running' THEN 'completed' "
    f"WHEN 'cancelling' THEN 'cancelled' ELSE state END, "
    f"finished_at = CASE WHEN {_ENDING} THEN ? ELSE finished_at END, "
    f"reason = CASE state WHEN 'running' THEN '' WHEN 'cancelling' THEN "
    f"CASE WHEN reason = '' THEN 'cancelled' ELSE reason END ELSE reason END, "
    f"error_code = CASE state WHEN 'running' THEN '' "
    f"WHEN 'cancelling' THEN 'cancelled' ELSE error_code END, "
    f"event_seq = event_seq + CASE WHEN {_ENDING} THEN 1 ELSE 0 END, "
    f"lease_owner = NULL, lease_expires_at = NULL "
    f"WHERE {FENCED} RETURNING id, state, event_seq, units_done"
)
# The event of the state it ended in. Parameters: job_id, seq, kind, message, data, now.
INSERT_EVENT = (
    f"INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) VALUES (?, ?, ?, ?, ?, ?)"
)

# The events of a finish and of the claim made with it, in one INSERT: one VALUES row
# each (job_id, seq, kind, message, data, now).
INSERT_EVENTS = f"INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) VALUES "
EVENT_VALUES = "(?, ?, ?, ?, ?, ?)"

# --- enqueue (Django's cursor) ------------------------------------------------------------

# The jobs, from one JSON array expanded in order: rowids are handed out in array order.
# Parameters: the shared columns' values, the array.
INSERT_JOBS = (
    f"INSERT INTO {JOB} ({SHARED_COLUMNS}, input, unique_key) "
    f"SELECT {{picks}}, json_extract(value, '$[0]'), json_extract(value, '$[1]') "
    f"FROM json_each(%s) ORDER BY key RETURNING id"
)
# Their ``enqueued`` events. Parameters: data, created_at, the JSON array of the new ids.
INSERT_ENQUEUED = (
    f"INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) "
    f"SELECT value, 1, 'enqueued', '', %s, %s FROM json_each(%s)"
)

# enqueue() outside a transaction: one job and its ``enqueued`` event on the driver's
# cursor, between ``write``'s BEGIN IMMEDIATE and COMMIT (in turn with this process's
# other writers). Parameters: INSERT_FIELDS' values; job_id, data, created_at.
INSERT_JOB = (
    f"INSERT INTO {JOB} ({INSERT_COLUMNS}) VALUES ({', '.join(['?'] * len(INSERT_FIELDS))}) "
    f"RETURNING id"
)
INSERT_ENQUEUED_EVENT = (
    f"INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) "
    f"VALUES (?, 1, 'enqueued', '', ?, ?)"
)

_hot_writers = threading.Lock()  # this process's threads, in turn (SQLite.write)


def _utc_datetime(value: Any) -> Any:
    """A timestamp column's text (Django's, in UTC) as an aware datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


class _Rollback(Exception):
    """Inside ``SQLite.write``: end the transaction with ROLLBACK, raising nothing."""


class SQLite(Statements):
    vendor = "sqlite"
    queue_not_paused = QUEUE_NOT_PAUSED
    commit_unit_sql = COMMIT_UNIT
    insert_result_sql = INSERT_RESULT

    def __init__(self) -> None:
        super().__init__()
        # SQLite stores datetimes as text; Django's adapter costs more than a unit's
        # statements, so the hot path formats them itself when that is exactly what
        # Django would write (USE_TZ, the connection in UTC).
        self.utc_text = bool(settings.USE_TZ and connection.timezone == UTC)
        self._follow_on_sql: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}

    def column_reader(
        self, conn: BaseDatabaseWrapper, field: Field[Any, Any]
    ) -> Callable[[Any], Any] | None:
        """Timestamps as text Django wrote in UTC: ``fromisoformat`` reads them, without
        the generic converter's parse and ``make_aware`` (most of a claimed row's cost)."""
        if self.utc_text and isinstance(field, DateTimeField):
            return _utc_datetime
        return super().column_reader(conn, field)

    def pick(
        self,
        now: datetime | None,
        *,
        queues: Sequence[str],
        operations: Sequence[str],
        job_id: int | None = None,
        lock: bool = True,
        limit: int = 1,
    ) -> tuple[str, list[Any]]:
        """An index range scan on durable_job_due, in its order; ``lock`` changes nothing.

        The unary ``+`` keeps next_attempt_at out of the index search. With statistics
        (ANALYZE, ``PRAGMA optimize``) SQLite would otherwise skip-scan the few
        priorities to range on it, and sort every due job of the queue per claim:
        12.8 ms against 0.04 ms at 20,000 queued. Read in index order, the first due
        row ends the scan. Without statistics, SQLite prefers durable_job_per_queue
        (the Queues page's index: state, queue, next_attempt_at match three terms) and
        then sorts every due job of the queue, hence ``INDEXED BY``. An IN list of
        queues it reads in order itself.
        """
        filters, params = self._pick_filters(queues, operations, job_id, per_queue=False)
        where = " AND ".join(["state = 'queued'", "+next_attempt_at <= %s", *filters])
        indexed = "" if job_id is not None else " INDEXED BY durable_job_due"
        sql = f"SELECT id FROM {JOB}{indexed} WHERE {where} {ORDER} LIMIT {int(limit)}"
        return sql, [None if now is None else self.timestamp(connection, now), *params]

    def claim(
        self,
        now: datetime,
        *,
        owner: str,
        queues: Sequence[str],
        operations: Sequence[str],
        lease_seconds: float,
        job_id: int | None = None,
        count: int = 1,
    ) -> tuple[str, list[Any]]:
        pick, params = self.pick(
            now, queues=queues, operations=operations, job_id=job_id, limit=count
        )
        target = f"id = ({pick})" if count == 1 else f"id IN ({pick})"  # evaluated once
        later = self.timestamp(connection, now + timedelta(seconds=lease_seconds))
        stamp = self.timestamp(connection, now)
        return CLAIM.replace("{target}", target), [owner, later, stamp, stamp, *params]

    def claim_rows(
        self,
        cursor: Cursor,
        now: datetime,
        *,
        owner: str,
        queues: Sequence[str],
        operations: Sequence[str],
        lease_seconds: float,
        job_id: int | None,
        count: int,
        driver: bool,
    ) -> list[Row]:
        """The UPDATE, then one INSERT of every ``started`` event (a worker's few);
        groups keep it under SQLite's limit on bound variables for any count."""
        sql, values = self.claim(
            now,
            owner=owner,
            queues=queues,
            operations=operations,
            lease_seconds=lease_seconds,
            job_id=job_id,
            count=count,
        )
        cursor.execute(sql.replace("%s", "?") if driver else sql, values)
        rows: list[Row] = cursor.fetchall()
        if not rows:
            return rows
        stamp = self.timestamp(connection, now)
        events: list[tuple[Any, ...]] = []
        for row in rows:
            job, epoch, seq, attempts = (row[COLUMN_INDEX[name]] for name in CLAIM_FACTS)
            data = json.dumps({"worker": owner, "epoch": epoch, "attempt": attempts + 1})
            events.append((job, seq, data, stamp))
        for start in range(0, len(events), CLAIM_EVENTS_PER_INSERT):
            group = events[start : start + CLAIM_EVENTS_PER_INSERT]
            insert = INSERT_STARTED + ", ".join([STARTED_VALUES] * len(group))
            flat = [value for event in group for value in event]
            cursor.execute(insert.replace("%s", "?") if driver else insert, flat)
        return rows

    def write(self, conn: BaseDatabaseWrapper, run: Callable[[Cursor], T | None]) -> T | None:
        """BEGIN IMMEDIATE (the write lock first, as Django's own transactions take it),
        ``run``'s writes, COMMIT — or ROLLBACK on any error or a None from ``run``.

        The threads of one process queue for it on a lock of their own. SQLite's
        busy handler is no queue: a thread that finds the write lock taken sleeps
        1, 2, 5, 10 … ms before it looks again, while the claims and commits of a
        worker's other threads hold it for a fraction of a millisecond each — so
        eight threads spent more time asleep than writing. Other processes still
        meet at SQLite's lock, announced through ``durable.turns``. ``run`` must
        run no user code: a unit waiting here for a thread of its own would wait
        forever. ROLLBACK on any error, even when COMMIT itself failed: Django's
        autocommit connection is never left inside a transaction.
        """
        with conn.wrap_database_errors:
            conn.ensure_connection()
            cursor = conn.connection.cursor()
            try:
                with _hot_writers:
                    with turns.waiting(conn):  # others give way to us (durable.turns)
                        cursor.execute("BEGIN IMMEDIATE")
                    try:
                        row = run(cursor)
                        if row is None:
                            raise _Rollback
                        cursor.execute("COMMIT")
                    except _Rollback:
                        cursor.execute("ROLLBACK")
                        return None
                    except BaseException:
                        if conn.connection.in_transaction:
                            cursor.execute("ROLLBACK")
                        raise
                    return row
            finally:
                cursor.close()

    def renew(
        self, cursor: Cursor, now: datetime, fenced: Sequence[Any], seconds: float
    ) -> str | None:
        later = self.timestamp(connection, now + timedelta(seconds=seconds))
        cursor.execute(RENEW, [later, *fenced])
        row = cursor.fetchone()
        return str(row[0]) if row else None

    def renew_unless_busy(
        self, cursor: Cursor, now: datetime, fenced: Sequence[Any], seconds: float
    ) -> str | None:
        """No row locks: the writers queue for the one lock, so this waits its turn."""
        return self.renew(cursor, now, fenced, seconds)

    def timestamp(self, conn: BaseDatabaseWrapper, moment: datetime) -> Stamp:
        if self.utc_text:
            return str(moment.astimezone(UTC).replace(tzinfo=None))
        return conn.ops.adapt_datetimefield_value(moment)

    def commit_params(
        self,
        conn: BaseDatabaseWrapper,
        moment: datetime,
        fixed: tuple[str, int | None, int],
        fenced: Sequence[Any],
        lease_seconds: float | None,
    ) -> tuple[list[Any], Stamp]:
        now = self.timestamp(conn, moment)
        if lease_seconds is None:
            extend: list[Any] = [None, None]
        else:
            later = moment + timedelta(seconds=lease_seconds)
            renew_below = later - timedelta(seconds=lease_seconds / 3)
            extend = [self.timestamp(conn, renew_below), self.timestamp(conn, later)]
        checkpoint_json, units_total, n_events = fixed
        return [checkpoint_json, units_total, now, n_events, *extend, *fenced], now

    def commit_unit(self, cursor: Cursor, params: list[Any], result: list[Any]) -> Row | None:
        cursor.execute(COMMIT_UNIT, params)
        row: Row | None = cursor.fetchone()
        if row is None:
            return None
        cursor.execute(INSERT_RESULT, [params[-3], *result])
        return row

    def finish_unit(self, cursor: Cursor, params: list[Any], result: list[Any]) -> Row | None:
        """BEGIN IMMEDIATE (``write``), three writes, COMMIT."""
        head = _finish_head(cursor, params, result)
        if head is None:
            return None
        (state, seq, units_done), event = head
        if event is not None:
            cursor.execute(INSERT_EVENT, list(event))
        faults.reach("finish_before_commit")  # written, not yet committed
        return state, seq, units_done

    def finish_and_claim(
        self,
        cursor: Cursor,
        params: list[Any],
        result: list[Any],
        moment: datetime,
        then: NextClaim,
    ) -> tuple[Row, list[Row]] | None:
        """In ``write``'s one transaction: the finish's UPDATE and unit result, then the
        claim's UPDATE (only once the finish applied), then one INSERT of both events."""
        head = _finish_head(cursor, params, result)
        if head is None:
            return None
        (state, seq, units_done), event = head
        now = result[2]
        events: list[Any] = [] if event is None else [event]
        cursor.execute(*self._follow_on(then, moment, now))
        claimed: list[Row] = cursor.fetchall()
        for started in claimed:
            job, epoch, next_seq, attempts = (started[COLUMN_INDEX[name]] for name in CLAIM_FACTS)
            facts = {"worker": then.owner, "epoch": epoch, "attempt": attempts + 1}
            events.append((job, next_seq, "started", "", json.dumps(facts), now))
        if events:
            insert = INSERT_EVENTS + ", ".join([EVENT_VALUES] * len(events))
            cursor.execute(insert, [value for event in events for value in event])
        faults.reach("finish_before_commit")  # written, not yet committed
        return (state, seq, units_done), claimed

    def _follow_on(self, then: NextClaim, moment: datetime, now: Stamp) -> tuple[str, list[Any]]:
        """``claim``'s statement for one job, in the driver's placeholders, made once per
        worker's queues and operations; its parameters, ``now`` (``moment``) the finish's."""
        key = (tuple(then.queues), tuple(then.operations))
        sql = self._follow_on_sql.get(key)
        if sql is None:
            made, _ = self.claim(
                moment,
                owner=then.owner,
                queues=then.queues,
                operations=then.operations,
                lease_seconds=then.lease_seconds,
            )
            sql = self._follow_on_sql[key] = made.replace("%s", "?")
        later = self.timestamp(connection, moment + timedelta(seconds=then.lease_seconds))
        # CLAIM's owner, expiry, started_at, updated_at; the pick's now, queues, operations.
        return sql, [then.owner, later, now, now, now, *then.queues, *then.operations]

    def insert_jobs(
        self, cursor: Cursor, *, values: list[Any], payload: str, facts: str, created: Stamp
    ) -> list[int]:
        picks = ", ".join(["%s"] * len(values))
        cursor.execute(INSERT_JOBS.replace("{picks}", picks), [*values, payload])
        ids = sorted(row[0] for row in cursor.fetchall())
        cursor.execute(INSERT_ENQUEUED, [facts, created, json.dumps(ids)])
        return ids

    def insert_job(
        self, conn: BaseDatabaseWrapper, values: list[Any], facts: str, created: Stamp
    ) -> int:
        def run(cursor: Cursor) -> int:
            cursor.execute(INSERT_JOB, values)
            job_id = int(cursor.fetchone()[0])
            cursor.execute(INSERT_ENQUEUED_EVENT, [job_id, facts, created])
            return job_id

        job_id = self.write(conn, run)
        assert job_id is not None  # run never returns None
        return job_id

    def serialize_registration(self, conn: BaseDatabaseWrapper) -> None:
        """Nothing: SQLite's writers take turns for its one write lock already."""


def _finish_head(
    cursor: Cursor, params: list[Any], result: list[Any]
) -> tuple[Row, tuple[Any, ...] | None] | None:
    """The finish's UPDATE and its unit result, shared by ``finish_unit`` and
    ``finish_and_claim``: (state, seq, units_done) and the ending's event row to insert,
    or None when the lease was lost (nothing written)."""
    cursor.execute(FINISH_UNIT, params)
    row = cursor.fetchone()
    if row is None:
        return None
    job_id, state, seq, units_done = row
    key, encoded, now = result
    cursor.execute(INSERT_RESULT, [job_id, key, encoded, now])
    ending = finished(state, units_done)
    event = None
    if ending is not None:
        kind, message, data = ending.event
        event = (job_id, seq, kind, message, json.dumps(data), now)
    return (state, seq, units_done), event
