"""The engine's SQL on PostgreSQL: every statement by name, and the class that runs them.

Lease times are on the database's clock (``clock_timestamp()``): workers on
several machines with skewed clocks still agree on when a lease expired.
``clock_timestamp()``, not ``now()``: it is read as the statement forms the
row, after any wait for the row's lock, where ``now()`` would be as old as
the transaction. A fenced write takes the row lock first, in a subquery
(``id = (SELECT id … FOR UPDATE)``): evaluated in the UPDATE's own WHERE, the
clock would be read for a row another transaction merely locked before the
wait, and the expiry written would be as old as the wait.

Where SQLite needs two or three statements, PostgreSQL runs one
(data-modifying CTEs), which in autocommit mode is its own transaction: one
round trip per claim and per unit commit instead of BEGIN, the writes and
COMMIT. A CTE's INSERT sees only the rows its UPDATE returned, so a lost
lease writes nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from .. import faults
from ..endings import FINISH_CANCEL_MESSAGE
from .base import (
    BUSY,
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

# The lease a worker holds: every write of a claimed job is conditioned on it.
HELD = f"id = %s AND lease_owner = %s AND lease_epoch = %s AND state IN ({LEASED})"
# The row lock first, then the clock (see the module's docstring).
HELD_LOCKED = f"id = (SELECT id FROM {JOB} WHERE {HELD} FOR UPDATE)"
LATER = "clock_timestamp() + make_interval(secs => %s)"

# --- claim ---------------------------------------------------------------------------

# ``NOT IN``, not a correlated ``NOT EXISTS``, which PostgreSQL made an anti-join it
# guessed would leave one row of the queue (the table is rarely analyzed, and guessed
# to hold the one queue every job is in), then read and sorted the whole queue per
# claim; ``NOT IN`` is read once, a hashed filter on the in-order index scan
# (``queue`` is NOT NULL, so NOT IN's NULL rule never bites).
QUEUE_NOT_PAUSED = f"queue NOT IN (SELECT queue FROM {PAUSED})"
# The claim's UPDATE; ``{target}`` is the pick. The rows are found by primary key only:
# no ``AND state = 'queued'``. The pick locked them (FOR UPDATE, rechecking its
# conditions on the newest row versions) earlier in the same statement, so it could
# not fail, and all it did was let the planner read the partial ``durable_job_due``
# index (``state = 'queued'``) in full for an id, its last column — every queued job
# per claim, whenever the statistics still described a short queue.
# Parameters: owner, lease seconds, now, now, *pick's.
CLAIM_UPDATE = (
    f"UPDATE {JOB} SET state = 'running', lease_owner = %s, lease_expires_at = {LATER}, "
    f"lease_epoch = lease_epoch + 1, started_at = COALESCE(started_at, %s), "
    f"units_at_claim = units_done, "  # a death after progress spends no attempt
    f"updated_at = %s, event_seq = event_seq + 1 WHERE {{target}}"
)
# The whole claim: the UPDATE, the ``started`` events, the rows with ``has_results``.
# Parameters: CLAIM_UPDATE's, then the events' created_at.
CLAIM = (
    f"WITH claimed AS ({CLAIM_UPDATE} RETURNING {JOB_COLUMNS}), "
    f"started AS (INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) "
    f"SELECT id, event_seq, 'started', '', jsonb_build_object('worker', lease_owner, "
    f"'epoch', lease_epoch, 'attempt', attempts + 1), %s FROM claimed) "
    f"SELECT {JOB_COLUMNS}, EXISTS (SELECT 1 FROM {RESULTS} r "
    f"WHERE r.job_id = claimed.id) FROM claimed"
)

# --- renewal ---------------------------------------------------------------------------

# Parameters: seconds, *fenced.
RENEW = f"UPDATE {JOB} SET lease_expires_at = {LATER} WHERE {HELD_LOCKED} RETURNING state"
# The renewal thread's form: never waits for a row lock. The one lock it could meet is
# its own process's atomic unit holding the row (fence()); waiting for it would stall
# every other lease and the heartbeat.
RENEW_NOWAIT = (
    f"UPDATE {JOB} SET lease_expires_at = {LATER} WHERE id = "
    f"(SELECT id FROM {JOB} WHERE {HELD} FOR UPDATE SKIP LOCKED) RETURNING state"
)
# Is the lease still ours? A plain read, which never waits. Parameters: *fenced.
STILL_HELD = f"SELECT state FROM {JOB} WHERE {HELD}"

# --- unit commits ----------------------------------------------------------------------

# The commit also extends the lease (one statement instead of a commit plus a renewal):
# a unit that ran for most of a lease, or an atomic unit whose fence() renewal was
# invisible to peers until now, leaves with a full lease. Only once less than two
# thirds of it is left, though: lease_expires_at is indexed, and an unchanged value
# keeps the update HOT (no index writes) for the many short units in between. NULL
# seconds keep the expiry as it is. Parameters: seconds, seconds, seconds.
EXTEND = (
    f"CASE WHEN lease_expires_at < {LATER} - make_interval(secs => %s / 3.0) "
    f"THEN {LATER} ELSE lease_expires_at END"
)
_COMMIT_UNIT_UPDATE = (
    f"UPDATE {JOB} SET checkpoint = %s::jsonb, units_done = units_done + 1, "
    f"units_total = COALESCE(%s, units_total), updated_at = %s, "
    f"event_seq = event_seq + %s, lease_expires_at = COALESCE({EXTEND}, "
    f"lease_expires_at) WHERE {HELD_LOCKED} "
)
# Parameters: checkpoint, units_total, now, number of events, *EXTEND's, *fenced.
COMMIT_UNIT = f"{_COMMIT_UNIT_UPDATE}RETURNING state, event_seq"
# Parameters: job_id, key, result, now.
INSERT_RESULT = (
    f"INSERT INTO {RESULTS} (job_id, key, result, created_at) "
    f"VALUES (%s, %s, %s::jsonb, %s) ON CONFLICT (job_id, key) DO NOTHING"
)
# Both in one statement. Parameters: COMMIT_UNIT's, then key, result, now.
COMMIT_UNIT_ALONE = (
    f"WITH moved AS ({_COMMIT_UNIT_UPDATE}RETURNING id, state, event_seq), "
    f"evidence AS (INSERT INTO {RESULTS} (job_id, key, result, created_at) "
    f"SELECT id, %s, %s::jsonb, %s FROM moved ON CONFLICT (job_id, key) DO NOTHING) "
    f"SELECT state, event_seq FROM moved"
)
# The last unit's commit, which also ends the job as ``complete()`` would: running ->
# completed, cancelling -> cancelled (a cancel accepted meanwhile wins), paused stays
# paused; the lease is released and the event numbered. SET reads the row's values
# before the update. Parameters: checkpoint, units_total, now, now, *fenced.
_ENDING = "state IN ('running', 'cancelling')"
FINISH_UNIT_UPDATE = (
    f"UPDATE {JOB} SET checkpoint = %s::jsonb, units_done = units_done + 1, "
    f"units_total = COALESCE(%s, units_total), updated_at = %s, "
    f"state = CASE state WHEN 'running' THEN 'completed' "
    f"WHEN 'cancelling' THEN 'cancelled' ELSE state END, "
    f"finished_at = CASE WHEN {_ENDING} THEN %s ELSE finished_at END, "
    f"reason = CASE state WHEN 'running' THEN '' WHEN 'cancelling' THEN "
    f"CASE WHEN reason = '' THEN 'cancelled' ELSE reason END ELSE reason END, "
    f"error_code = CASE state WHEN 'running' THEN '' "
    f"WHEN 'cancelling' THEN 'cancelled' ELSE error_code END, "
    f"event_seq = event_seq + CASE WHEN {_ENDING} THEN 1 ELSE 0 END, "
    f"lease_owner = NULL, lease_expires_at = NULL "
    f"WHERE {HELD_LOCKED} RETURNING id, state, event_seq, units_done"
)
# All of it in one statement: the update, the unit result, and the event of the state
# it ended in — ``durable.endings.finished``'s table, in SQL.
# Parameters: FINISH_UNIT_UPDATE's, then key, result, now, and the event's now.
_FINISH = (
    f"moved AS ({FINISH_UNIT_UPDATE}), "
    f"evidence AS (INSERT INTO {RESULTS} (job_id, key, result, created_at) "
    f"SELECT id, %s, %s::jsonb, %s FROM moved ON CONFLICT (job_id, key) DO NOTHING), "
    f"ended AS (INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) "
    f"SELECT id, event_seq, state, CASE state WHEN 'cancelled' THEN "
    f"'{FINISH_CANCEL_MESSAGE}' ELSE '' END, CASE state WHEN 'completed' THEN "
    f"jsonb_build_object('units_done', units_done) ELSE '{{}}'::jsonb END, %s "
    f"FROM moved WHERE state IN ('completed', 'cancelled'))"
)
FINISH_UNIT = f"WITH {_FINISH} SELECT state, event_seq, units_done FROM moved"
# The finish, then the finishing thread's next job claimed in the same statement (one
# commit per one-unit job). The claim is gated on the finish: ``EXISTS (SELECT 1 FROM
# moved)`` is a one-time filter, so a lost lease picks and claims nothing. All of the
# statement's parts read one snapshot, in which the finishing job is still running: the
# pick never sees it. One row when the finish applied, with the claimed job's columns
# (NULL when nothing was due); none for a lost lease. ``{target}``: the pick.
# Parameters: FINISH_UNIT's, then CLAIM's.
_CLAIMED_COLUMNS = ", ".join(f"c.{column}" for column in JOB_COLUMNS.split(", "))
FINISH_AND_CLAIM = (
    f"WITH {_FINISH}, "
    f"claimed AS ({CLAIM_UPDATE.replace('{target}', 'EXISTS (SELECT 1 FROM moved) AND {target}')}"
    f" RETURNING {JOB_COLUMNS}), "
    f"started AS (INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) "
    f"SELECT id, event_seq, 'started', '', jsonb_build_object('worker', lease_owner, "
    f"'epoch', lease_epoch, 'attempt', attempts + 1), %s FROM claimed) "
    f"SELECT m.state, m.event_seq, m.units_done, {_CLAIMED_COLUMNS}, "
    f"EXISTS (SELECT 1 FROM {RESULTS} r WHERE r.job_id = c.id) "
    f"FROM moved m LEFT JOIN claimed c ON true"
)

# --- enqueue, registration ------------------------------------------------------------

# Jobs and their ``enqueued`` events in one statement: the inputs travel as one JSON
# array, expanded in order so that the identity column hands out ids in array order.
# Parameters: the array, the shared columns' values, the events' data and created_at.
INSERT_JOBS = (
    f"WITH source AS (SELECT e.value, e.n FROM jsonb_array_elements(%s::jsonb) "
    f"WITH ORDINALITY AS e(value, n)), "
    f"added AS (INSERT INTO {JOB} ({SHARED_COLUMNS}, input, unique_key) "
    f"SELECT {{picks}}, value -> 0, value ->> 1 FROM source ORDER BY n RETURNING id) "
    f"INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) "
    f"SELECT id, 1, 'enqueued', '', %s::jsonb, %s FROM added RETURNING job_id"
)
# enqueue() outside a transaction: one job and its ``enqueued`` event, one statement on
# the driver's cursor in autocommit mode — its own transaction, one round trip (the
# ORM path costs the statement and a COMMIT). Not prepared: PgBouncer's transaction
# pooling forbids server-side prepared statements. Parameters: INSERT_FIELDS' values
# (the input as JSON text), the event's data and created_at.
INSERT_JOB = (
    f"WITH added AS (INSERT INTO {JOB} ({INSERT_COLUMNS}) VALUES ("
    + ", ".join("%s::jsonb" if field.name == "input" else "%s" for field in INSERT_FIELDS)
    + f") RETURNING id) INSERT INTO {EVENTS} (job_id, seq, kind, message, data, created_at) "
    f"SELECT id, 1, 'enqueued', '', %s::jsonb, %s FROM added RETURNING job_id"
)
# Workers register one at a time: a transaction-scoped advisory lock ("durable").
REGISTRATION_LOCK = "SELECT pg_advisory_xact_lock(%s)"
REGISTRATION_KEY = 0x64757261626C65


class PostgreSQL(Statements):
    vendor = "postgresql"
    queue_not_paused = QUEUE_NOT_PAUSED
    commit_unit_sql = COMMIT_UNIT
    insert_result_sql = INSERT_RESULT

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
        """An index range scan on durable_job_due, in its order.

        PostgreSQL reads one queue of durable_job_due in order, but several only by
        reading and sorting all their due jobs (11 ms per claim at 20,000). So each
        queue is read in order on its own (a LATERAL pick per queue, each locking at
        most ``limit``: the claim commits at once, which frees the extra locks) and
        the few rows merged. ``now``: unused, the database's clock decides.
        """
        names = list(dict.fromkeys(queues))  # each queue once, in the order given
        per_queue = job_id is None and len(names) > 1
        filters, params = self._pick_filters(queues, operations, job_id, per_queue=per_queue)
        where = " AND ".join(["state = 'queued'", "next_attempt_at <= clock_timestamp()", *filters])
        columns = "id, priority, next_attempt_at" if per_queue else "id"
        locking = " FOR UPDATE SKIP LOCKED" if lock else ""
        sql = f"SELECT {columns} FROM {JOB} WHERE {where} {ORDER} LIMIT {int(limit)}{locking}"
        if not per_queue:
            return sql, params
        sql = (
            f"SELECT id FROM unnest(%s::text[]) AS q(name) CROSS JOIN LATERAL ({sql}) AS j "
            f"{ORDER} LIMIT {int(limit)}"
        )
        return sql, [names, *params]

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
        """The whole claim, one statement. The pick locks before the UPDATE forms the
        rows, so ``clock_timestamp()`` is read after any wait; ``now`` only stamps times."""
        target, params = self._target(now, queues, operations, job_id, count)
        return CLAIM.replace("{target}", target), [owner, lease_seconds, now, now, *params, now]

    def _target(
        self,
        now: datetime,
        queues: Sequence[str],
        operations: Sequence[str],
        job_id: int | None,
        count: int,
    ) -> tuple[str, list[Any]]:
        """The claim UPDATE's WHERE: the rows the pick locked, and the pick's parameters."""
        pick, params = self.pick(
            now, queues=queues, operations=operations, job_id=job_id, limit=count
        )
        # Several: the array is built once, before the update, then each id looked up;
        # as ``id IN (subquery)`` the planner may join instead, and run the pick again —
        # claiming more than LIMIT.
        return (f"id = ({pick})" if count == 1 else f"id = ANY (ARRAY ({pick}))"), params

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
        sql, values = self.claim(
            now,
            owner=owner,
            queues=queues,
            operations=operations,
            lease_seconds=lease_seconds,
            job_id=job_id,
            count=count,
        )
        cursor.execute(sql, values)  # psycopg's placeholder is Django's
        rows: list[Row] = cursor.fetchall()
        return rows

    def write(self, conn: BaseDatabaseWrapper, run: Callable[[Cursor], T | None]) -> T | None:
        """The statement ``run`` executes is its own transaction (autocommit)."""
        with conn.wrap_database_errors:
            conn.ensure_connection()
            cursor = conn.connection.cursor()
            try:
                return run(cursor)
            finally:
                cursor.close()

    def renew(
        self, cursor: Cursor, now: datetime, fenced: Sequence[Any], seconds: float
    ) -> str | None:
        cursor.execute(RENEW, [seconds, *fenced])
        row = cursor.fetchone()
        return str(row[0]) if row else None

    def renew_unless_busy(
        self, cursor: Cursor, now: datetime, fenced: Sequence[Any], seconds: float
    ) -> str | None:
        """A locked row is one a transaction is changing right now — this process's own
        atomic unit (which renewed the lease in fence() and renews it again when it
        commits) or, briefly, an operator action — so skipping this round loses nothing."""
        cursor.execute(RENEW_NOWAIT, [seconds, *fenced])
        row = cursor.fetchone()
        if row is not None:
            return str(row[0])
        # Not renewed: lost, or merely locked? A plain read never waits.
        cursor.execute(STILL_HELD, fenced)
        return BUSY if cursor.fetchone() is not None else None

    def timestamp(self, conn: BaseDatabaseWrapper, moment: datetime) -> Stamp:
        return moment  # psycopg adapts datetimes itself, as Django would

    def commit_params(
        self,
        conn: BaseDatabaseWrapper,
        moment: datetime,
        fixed: tuple[str, int | None, int],
        fenced: Sequence[Any],
        lease_seconds: float | None,
    ) -> tuple[list[Any], Stamp]:
        checkpoint_json, units_total, n_events = fixed
        # CASE WHEN expiry < later - lease/3 THEN later: seconds, seconds, seconds
        extend = [lease_seconds, lease_seconds, lease_seconds]
        return [checkpoint_json, units_total, moment, n_events, *extend, *fenced], moment

    def commit_unit(self, cursor: Cursor, params: list[Any], result: list[Any]) -> Row | None:
        cursor.execute(COMMIT_UNIT_ALONE, params + result)
        row: Row | None = cursor.fetchone()
        return row

    def finish_unit(self, cursor: Cursor, params: list[Any], result: list[Any]) -> Row | None:
        faults.reach("finish_before_commit")  # the statement is its own transaction
        cursor.execute(FINISH_UNIT, [*params, *result, result[-1]])
        row: Row | None = cursor.fetchone()
        return row

    def finish_and_claim(
        self,
        cursor: Cursor,
        params: list[Any],
        result: list[Any],
        moment: datetime,
        then: NextClaim,
    ) -> tuple[Row, list[Row]] | None:
        """One statement (``FINISH_AND_CLAIM``), its own transaction."""
        target, pick = self._target(moment, then.queues, then.operations, None, 1)
        claim = [then.owner, then.lease_seconds, moment, moment, *pick, moment]
        faults.reach("finish_before_commit")  # the statement is its own transaction
        sql = FINISH_AND_CLAIM.replace("{target}", target)
        cursor.execute(sql, [*params, *result, result[-1], *claim])
        row = cursor.fetchone()
        if row is None:
            return None
        ended, claimed = row[:3], row[3:]
        return ended, ([] if claimed[0] is None else [claimed])

    def insert_jobs(
        self, cursor: Cursor, *, values: list[Any], payload: str, facts: str, created: Stamp
    ) -> list[int]:
        picks = ", ".join(["%s"] * len(values))
        cursor.execute(INSERT_JOBS.replace("{picks}", picks), [payload, *values, facts, created])
        return sorted(row[0] for row in cursor.fetchall())

    def insert_job(
        self, conn: BaseDatabaseWrapper, values: list[Any], facts: str, created: Stamp
    ) -> int:
        def run(cursor: Cursor) -> int:
            cursor.execute(INSERT_JOB, [*values, facts, created])
            return int(cursor.fetchone()[0])

        job_id = self.write(conn, run)
        assert job_id is not None  # run never returns None
        return job_id

    def serialize_registration(self, conn: BaseDatabaseWrapper) -> None:
        with conn.cursor() as cursor:
            cursor.execute(REGISTRATION_LOCK, [REGISTRATION_KEY])
