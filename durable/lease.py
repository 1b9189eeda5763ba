"""Claiming, renewing and committing under a lease, fenced by the lease epoch.

Every write a worker makes to a job it claimed is conditional on
``(id, lease_owner, lease_epoch)``: once a job was reclaimed (the epoch moved
on) or cancelled, the old worker's renewal, checkpoint, completion, failure
and release all match zero rows, and the worker abandons the job without
touching it. The claim is one atomic conditional update; SQLite and
PostgreSQL differ only in the few lines of ``_Dialect``.

Lease times use the database's clock on PostgreSQL (workers on several
machines with skewed clocks still agree on when a lease expired) and the
process clock on SQLite (one machine, one clock). On SQLite that clock is read
only once the write lock is held (``now_under_lock``): a writer can wait for
the lock longer than a lease, and an expiry computed before the wait would be
written already past.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from . import faults, turns
from .errors import LeaseLost, NonRetryable
from .jobs import add_events, announce_change, log_state, needs_attention
from .models import Job, JobEvent, PausedQueue, UnitResult
from .policy import MAX_ERROR_MESSAGE_BYTES, append_bounded, truncate_utf8
from .states import LEASED_STATES, JobState

log = logging.getLogger("durable.lease")

MAX_RESULT_BYTES = 64 * 1024
CLAIM_EVENTS_PER_INSERT = 200  # SQLite binds 4 values per started event
MAX_TURN_AWAY_REASONS = 4  # distinct reasons a coalesced "rescheduled" event lists
_LEASED = tuple(str(state) for state in LEASED_STATES)
FINISH_CANCEL_MESSAGE = "stopped at a unit boundary"  # the cancelled event at a boundary


@dataclass(frozen=True)
class Lease:
    job_id: int
    owner: str
    epoch: int


class _Dialect:
    """The only vendor branches of the engine: SQL for "now", "now + s", JSON, the claim lock."""

    def __init__(self, vendor: str) -> None:
        self.pg = vendor == "postgresql"
        ops = connection.ops
        self.table = ops.quote_name(Job._meta.db_table)
        # One extra condition of the claim (durable.queues): no query per claim, and
        # the paused-queue table holds a row per paused queue only. PostgreSQL:
        # ``NOT IN``, not a correlated ``NOT EXISTS``, which it made an anti-join
        # it guessed would leave one row of the queue (the table is rarely
        # analyzed, and guessed to hold the one queue every job is in), then read
        # and sorted the whole queue per claim; ``NOT IN`` is read once, a hashed
        # filter on the in-order index scan (``queue`` is NOT NULL, so NOT IN's
        # NULL rule never bites). SQLite turns ``NOT IN`` into an index lookup
        # per paused queue and then sorts, so it keeps ``NOT EXISTS``, a
        # per-row probe of the in-order scan.
        paused = ops.quote_name(PausedQueue._meta.db_table)
        self.queue_not_paused = (
            f"queue NOT IN (SELECT queue FROM {paused})"
            if self.pg
            else f"NOT EXISTS (SELECT 1 FROM {paused} WHERE {paused}.queue = {self.table}.queue)"
        )
        self.results = ops.quote_name(UnitResult._meta.db_table)
        # JSON is encoded once in Python and cast on the way in.
        self.json = "%s::jsonb" if self.pg else "%s"
        leased = ", ".join(f"'{state}'" for state in sorted(_LEASED))
        # The two statements of every unit commit run on the DB-API cursor with
        # the driver's own placeholder: Django's cursor wrapper costs about as
        # much as the statements themselves on SQLite. Django's transaction
        # (atomic) still brackets them.
        p = "%s" if self.pg else "?"
        pj = f"{p}::jsonb" if self.pg else p
        # The commit also extends the lease (one statement instead of a commit
        # plus a renewal): a unit that ran for most of a lease, or an atomic unit
        # whose fence() renewal was invisible to peers until now, leaves with a
        # full lease. Only once less than two thirds of it is left, though:
        # lease_expires_at is indexed, and an unchanged value keeps PostgreSQL's
        # update HOT (no index writes) for the many short units in between.
        # NULL seconds keep the expiry as it is.
        later = f"clock_timestamp() + make_interval(secs => {p})" if self.pg else p
        third = f"make_interval(secs => {p} / 3.0)" if self.pg else None
        extend = (
            f"CASE WHEN lease_expires_at < {later} - {third} THEN {later} ELSE lease_expires_at END"
            if self.pg
            # SQLite: text timestamps; ``later`` and ``later - lease/3`` come as values.
            else f"CASE WHEN lease_expires_at < {p} THEN {p} ELSE lease_expires_at END"
        )
        # PostgreSQL evaluates clock_timestamp() as it forms the new row, which for
        # a row another transaction merely locked (FOR UPDATE, unchanged) is before
        # waiting for it: such an UPDATE would write an expiry as old as its wait.
        # Taking the row lock first, in a subquery, puts the clock after the wait.
        # (SQLite: the values are computed once the write lock is held.)
        fenced = f"id = {p} AND lease_owner = {p} AND lease_epoch = {p} AND state IN ({leased})"
        commit_where = (
            f"id = (SELECT id FROM {self.table} WHERE {fenced} FOR UPDATE)" if self.pg else fenced
        )
        self.commit_sql = (
            f"UPDATE {self.table} SET checkpoint = {pj}, units_done = units_done + 1, "
            f"units_total = COALESCE({p}, units_total), updated_at = {p}, "
            f"event_seq = event_seq + {p}, lease_expires_at = COALESCE({extend}, "
            f"lease_expires_at) WHERE {commit_where} RETURNING state, event_seq"
        )
        self.result_sql = (
            f"INSERT INTO {self.results} (job_id, key, result, created_at) "
            f"VALUES ({p}, {p}, {pj}, {p}) ON CONFLICT (job_id, key) DO NOTHING"
        )
        # PostgreSQL: both writes in one statement (data-modifying CTEs), which
        # in autocommit mode is its own transaction — one round trip per unit
        # instead of BEGIN, UPDATE, INSERT, COMMIT. The INSERT sees only the
        # row the UPDATE returned, so a lost lease writes nothing at all.
        self.commit_one_sql = (
            f"WITH moved AS ({self.commit_sql.replace('RETURNING state, event_seq', '')}"
            f"RETURNING id, state, event_seq), "
            f"evidence AS (INSERT INTO {self.results} (job_id, key, result, created_at) "
            f"SELECT id, {p}, {pj}, {p} FROM moved ON CONFLICT (job_id, key) DO NOTHING) "
            f"SELECT state, event_seq FROM moved"
        )
        # SQLite stores datetimes as text; Django's adapter costs more than a
        # unit's statements, so the hot path formats them itself when that is
        # exactly what Django would write (USE_TZ, the connection in UTC).
        self.utc_text = not self.pg and settings.USE_TZ and connection.timezone == UTC
        held = f"id = %s AND lease_owner = %s AND lease_epoch = %s AND state IN ({leased})"
        self.renew_sql = (
            f"UPDATE {self.table} SET lease_expires_at = {self.later_sql} WHERE id = "
            f"(SELECT id FROM {self.table} WHERE {held} FOR UPDATE) RETURNING state"
            if self.pg  # the row lock first, then the clock (see commit_sql)
            else f"UPDATE {self.table} SET lease_expires_at = {self.later_sql} "
            f"WHERE {held} RETURNING state"
        )
        # The renewal thread's form: never waits for a row lock. The one lock it
        # could meet is its own process's atomic unit holding the row (fence());
        # waiting for it would stall every other lease and the heartbeat.
        self.renew_nowait_sql = (
            f"UPDATE {self.table} SET lease_expires_at = {self.later_sql} WHERE id = "
            f"(SELECT id FROM {self.table} WHERE {held} FOR UPDATE SKIP LOCKED) RETURNING state"
            if self.pg
            else self.renew_sql
        )
        self.held_sql = f"SELECT state FROM {self.table} WHERE {held}"
        # The last unit's commit that also completes the job (finish_unit): the
        # checkpoint and units_done move, and the state ends as complete() would
        # have it — running -> completed, cancelling -> cancelled (a cancel
        # accepted meanwhile wins), paused stays paused — the lease is released,
        # and the event is numbered. SET reads the row's values before the update.
        ending = "state IN ('running', 'cancelling')"
        self.finish_sql = (
            f"UPDATE {self.table} SET checkpoint = {pj}, units_done = units_done + 1, "
            f"units_total = COALESCE({p}, units_total), updated_at = {p}, "
            f"state = CASE state WHEN 'running' THEN 'completed' "
            f"WHEN 'cancelling' THEN 'cancelled' ELSE state END, "
            f"finished_at = CASE WHEN {ending} THEN {p} ELSE finished_at END, "
            f"reason = CASE state WHEN 'running' THEN '' WHEN 'cancelling' THEN "
            f"CASE WHEN reason = '' THEN 'cancelled' ELSE reason END ELSE reason END, "
            f"error_code = CASE state WHEN 'running' THEN '' "
            f"WHEN 'cancelling' THEN 'cancelled' ELSE error_code END, "
            f"event_seq = event_seq + CASE WHEN {ending} THEN 1 ELSE 0 END, "
            f"lease_owner = NULL, lease_expires_at = NULL "
            f"WHERE {commit_where} RETURNING id, state, event_seq, units_done"
        )
        self.finish_event_sql = (
            f"INSERT INTO {ops.quote_name(JobEvent._meta.db_table)} "
            f"(job_id, seq, kind, message, data, created_at) VALUES ({p}, {p}, {p}, {p}, {pj}, {p})"
        )
        # PostgreSQL: all of it in one statement, its own transaction.
        self.finish_one_sql = (
            f"WITH moved AS ({self.finish_sql}), "
            f"evidence AS (INSERT INTO {self.results} (job_id, key, result, created_at) "
            f"SELECT id, {p}, {pj}, {p} FROM moved ON CONFLICT (job_id, key) DO NOTHING), "
            f"ended AS (INSERT INTO {ops.quote_name(JobEvent._meta.db_table)} "
            f"(job_id, seq, kind, message, data, created_at) "
            f"SELECT id, event_seq, state, CASE state WHEN 'cancelled' THEN "
            f"'{FINISH_CANCEL_MESSAGE}' ELSE '' END, CASE state WHEN 'completed' THEN "
            f"jsonb_build_object('units_done', units_done) ELSE '{{}}'::jsonb END, {p} "
            f"FROM moved WHERE state IN ('completed', 'cancelled')) "
            f"SELECT state, event_seq, units_done FROM moved"
        )
        self.events = ops.quote_name(JobEvent._meta.db_table)
        # The claim returns the whole row; these turn it into a Job as the ORM would.
        self.job_fields = list(Job._meta.concrete_fields)
        self.job_columns = ", ".join(ops.quote_name(f.column) for f in self.job_fields)
        self.job_attnames = [f.attname for f in self.job_fields]
        self.column_index = {name: n for n, name in enumerate(self.job_attnames)}
        self.claim_facts = ("id", "lease_epoch", "event_seq", "attempts")
        self._converters: list | None = None

    def job_from_row(self, conn: Any, row: tuple) -> Job:
        if self._converters is None:
            converters = []
            for f in self.job_fields:
                col = f.get_col(Job._meta.db_table)
                found = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
                converters.append((col, found))
            self._converters = converters
        values = []
        for value, (col, converters) in zip(row, self._converters, strict=True):
            for convert in converters:
                value = convert(value, col, conn)
            values.append(value)
        return Job.from_db(DEFAULT_DB_ALIAS, self.job_attnames, values)

    @property
    def now_sql(self) -> str:
        return "clock_timestamp()" if self.pg else "%s"

    @property
    def later_sql(self) -> str:
        return "clock_timestamp() + make_interval(secs => %s)" if self.pg else "%s"

    def now(self, now: datetime) -> list:
        return [] if self.pg else [connection.ops.adapt_datetimefield_value(now)]

    def later(self, now: datetime, seconds: float) -> list:
        if self.pg:
            return [seconds]
        return [connection.ops.adapt_datetimefield_value(now + timedelta(seconds=seconds))]

    @property
    def skip_locked(self) -> str:
        # SQLite has one writer at a time (BEGIN IMMEDIATE), so nothing is locked to skip.
        return " FOR UPDATE SKIP LOCKED" if self.pg else ""


_dialects: dict[str, _Dialect] = {}


def _dialect() -> _Dialect:
    vendor = connection.vendor
    if vendor not in _dialects:
        _dialects[vendor] = _Dialect(vendor)
    return _dialects[vendor]


def _placeholders(values: list) -> str:
    return ", ".join(["%s"] * len(values))


def _encode(value: Any) -> str:
    return json.dumps(value, default=str)


def now_under_lock() -> datetime:
    """The moment a lease write starts from; call it only once the write lock is held.

    SQLite lease expiries are computed in Python from this moment. Read before
    ``BEGIN IMMEDIATE`` returned, it would be as old as the wait for the lock —
    and another process (an atomic unit, a large import batch) can hold the lock
    for longer than a lease, so the renewal that finally commits would write an
    expiry already past and a peer could take back the job of a live worker.
    PostgreSQL computes expiries in SQL (``clock_timestamp()``) when the
    statement has its row, so there the value only stamps ``updated_at``.
    """
    return timezone.now()


_hot_writers = threading.Lock()  # this process's threads, in turn (_sqlite_write)


@contextmanager
def _sqlite_write(conn: Any, cursor: Any) -> Iterator[None]:
    """SQLite: one hot-path write transaction (BEGIN IMMEDIATE … COMMIT) on the DB-API cursor.

    The threads of one process queue for it on a lock of their own. SQLite's
    busy handler is no queue: a thread that finds the write lock taken sleeps
    1, 2, 5, 10 … ms before it looks again, while the claims and commits of a
    worker's other threads hold it for a fraction of a millisecond each — so
    eight threads spent more time asleep than writing. Other processes still
    meet at SQLite's lock, announced through ``durable.turns``. The body must
    run no user code: a unit waiting here for a thread of its own would wait
    forever. ROLLBACK on any error, even when COMMIT itself failed: Django's
    autocommit connection is never left inside a transaction. Raise
    ``_Rollback`` in the body to roll back quietly (a lost lease).
    """
    with _hot_writers:
        with turns.waiting(conn):  # others give way to us (durable.turns)
            cursor.execute("BEGIN IMMEDIATE")
        try:
            yield
            cursor.execute("COMMIT")
        except _Rollback:
            cursor.execute("ROLLBACK")
        except BaseException:
            if conn.connection.in_transaction:
                cursor.execute("ROLLBACK")
            raise


class _Rollback(Exception):
    """Inside ``_sqlite_write``: end the transaction with ROLLBACK, raising nothing."""


# --- claim -----------------------------------------------------------------------


def pick_sql(
    now: datetime,
    *,
    queues: list[str],
    operations: list[str],
    job_id: int | None = None,
    lock: bool = True,
    limit: int = 1,
) -> tuple[str, list[Any]]:
    """The SELECT that picks the next ``limit`` due jobs; an index range scan on durable_job_due.

    ``lock=False``: a plain read (the wake-up's "is anything due?"). Both claim
    statements and that read use this one SELECT, so a further condition (a
    paused queue, say) is one more entry in ``where`` and one more parameter.
    """
    d = _dialect()
    # SQLite: the unary ``+`` keeps next_attempt_at out of the index search. With
    # statistics (ANALYZE, ``PRAGMA optimize``) SQLite would otherwise skip-scan
    # the few priorities to range on it, and sort every due job of the queue per
    # claim: 12.8 ms against 0.04 ms at 20,000 queued. Read in index order, the
    # first due row ends the scan.
    due = f"{'' if d.pg else '+'}next_attempt_at <= {d.now_sql}"
    where = ["state = 'queued'", due]
    params: list[Any] = d.now(now)
    # PostgreSQL reads one queue of durable_job_due in order, but several only by
    # reading and sorting all their due jobs (11 ms per claim at 20,000). So each
    # queue is read in order on its own (a LATERAL pick per queue, each locking
    # at most ``limit``: the claim commits at once, which frees the extra locks)
    # and the few rows merged. SQLite reads an IN list of queues in order itself.
    names = list(dict.fromkeys(queues))  # each queue once, in the order given
    per_queue = d.pg and job_id is None and len(names) > 1
    if job_id is not None:
        where.append("id = %s")
        params.append(job_id)
    else:
        if per_queue:
            where.append("queue = q.name")
        else:
            where.append(f"queue IN ({_placeholders(queues)})")
            params.extend(queues)
        where.append(d.queue_not_paused)  # a paused queue is not claimed from
    where.append(f"operation IN ({_placeholders(operations)})")
    params.extend(operations)
    # SQLite, without statistics, prefers durable_job_per_queue (the Queues page's
    # index: state, queue, next_attempt_at match three terms) and then sorts every
    # due job of the queue; the partial durable_job_due index reads them in order.
    indexed = "" if d.pg or job_id is not None else " INDEXED BY durable_job_due"
    order = "ORDER BY priority DESC, next_attempt_at, id"
    columns = "id, priority, next_attempt_at" if per_queue else "id"
    sql = (
        f"SELECT {columns} FROM {d.table}{indexed} WHERE {' AND '.join(where)} "
        f"{order} LIMIT {int(limit)}{d.skip_locked if lock else ''}"
    )
    if per_queue:
        sql = (
            f"SELECT id FROM unnest(%s::text[]) AS q(name) CROSS JOIN LATERAL ({sql}) AS j "
            f"{order} LIMIT {int(limit)}"
        )
        params = [names, *params]
    return sql, params


def claim(
    owner: str,
    *,
    queues: list[str],
    operations: list[str],
    lease_seconds: float,
    job_id: int | None = None,
) -> tuple[Lease, Job] | None:
    """Claim the next due job (or job ``job_id`` if it is due); None if there is none.

    Ordered by priority (higher first), then ``next_attempt_at``, then id. The
    claim increments the lease epoch — the fencing token every later write of
    this worker is conditioned on. One round trip: the conditional UPDATE
    returns the whole row (and whether the job has unit results, so the worker
    can skip step 2's lookups), and the ``started`` event is written with it —
    on PostgreSQL in the same statement, on SQLite in the same transaction.
    The returned job's ``has_results`` says whether any unit result exists.
    """
    claimed = claim_many(
        owner,
        1,
        queues=queues,
        operations=operations,
        lease_seconds=lease_seconds,
        job_id=job_id,
    )
    return claimed[0] if claimed else None


def claim_many(
    owner: str,
    count: int,
    *,
    queues: list[str],
    operations: list[str],
    lease_seconds: float,
    job_id: int | None = None,
) -> list[tuple[Lease, Job]]:
    """Claim up to ``count`` due jobs in the one round trip ``claim`` takes for one.

    For a worker whose threads want ``count`` jobs at the same moment
    (``durable.worker``'s claim desk): the statements are those of a single
    claim with ``LIMIT count``, so a deep queue costs one commit per group of
    threads instead of one per thread. Each job gets its own epoch and
    ``started`` event, exactly as if claimed alone. Highest priority first.
    The caller must start every job it gets now: each is leased, and a death
    before its first unit spends an attempt.
    """
    if count < 1 or not operations or (not queues and job_id is None):
        return []
    conn = connections[DEFAULT_DB_ALIAS]
    d = _dialect()
    args = (d, owner, queues, operations, lease_seconds, job_id, count)
    if conn.in_atomic_block:
        # Inside a caller's transaction (tests, run_job under atomic): the same
        # statements through Django's cursor, in a savepoint.
        with transaction.atomic(), conn.cursor() as cursor:
            rows = _claim_rows(cursor, *args)
    else:
        with conn.wrap_database_errors:
            conn.ensure_connection()
            cursor = conn.connection.cursor()
            try:
                if d.pg:
                    rows = _claim_rows(cursor, *args)
                else:
                    # BEGIN IMMEDIATE first: the lease's expiry is computed once
                    # the write lock is held, never before a wait for it.
                    with _sqlite_write(conn, cursor):
                        rows = _claim_rows(cursor, *args, raw=True)
            finally:
                cursor.close()
    claimed = []
    for row in rows:
        job = d.job_from_row(conn, row[:-1])
        job.has_results = bool(row[-1])
        claimed.append((Lease(job.pk, owner, job.lease_epoch), job))
    # RETURNING keeps no order: the pick's, so the first thread served gets the first job.
    claimed.sort(key=lambda pair: (-pair[1].priority, pair[1].next_attempt_at, pair[1].pk))
    for _, job in claimed:
        data = {"worker": owner, "epoch": job.lease_epoch, "attempt": job.attempts + 1}
        announce_change(job, JobState.QUEUED, "started", "", data)
    return claimed


def claim_sql(
    now: datetime,
    *,
    owner: str,
    queues: list[str],
    operations: list[str],
    lease_seconds: float,
    job_id: int | None = None,
    count: int = 1,
) -> tuple[str, list[Any]]:
    """The claim's UPDATE with its parameters (``%s`` placeholders), ``now`` read under the lock.

    PostgreSQL: the whole claim, one statement — the UPDATE, the ``started``
    events, the rows with ``has_results``. SQLite: the UPDATE returning the
    rows with ``has_results``; the events follow in the same transaction.

    The rows are found by primary key only. PostgreSQL's UPDATE has no
    ``AND state = 'queued'``: the pick locked the rows (FOR UPDATE, rechecking
    its conditions on the newest row versions) earlier in the same statement,
    so it could not fail, and all it did was let the planner read the partial
    ``durable_job_due`` index (``state = 'queued'``) in full for an id, its
    last column — every queued job per claim, whenever the statistics still
    described a short queue. The pick locks before the UPDATE forms the rows,
    so ``clock_timestamp()`` is read after any wait; ``now`` only stamps times.
    """
    d = _dialect()
    pick, params = pick_sql(now, queues=queues, operations=operations, job_id=job_id, limit=count)
    if count == 1:
        target = f"id = ({pick})"
    else:
        # PostgreSQL builds the array once, before the update, then looks each
        # id up; as ``id IN (subquery)`` the planner may join instead, and run
        # the pick again — claiming more than LIMIT. SQLite evaluates an IN
        # list once.
        target = f"id = ANY (ARRAY ({pick}))" if d.pg else f"id IN ({pick})"
    expiry = "clock_timestamp() + make_interval(secs => %s)" if d.pg else "%s"
    update = (
        f"UPDATE {d.table} SET state = 'running', lease_owner = %s, lease_expires_at = {expiry}, "
        f"lease_epoch = lease_epoch + 1, started_at = COALESCE(started_at, %s), "
        f"units_at_claim = units_done, "  # a death after progress spends no attempt
        f"updated_at = %s, event_seq = event_seq + 1 WHERE {target}"
    )
    if not d.pg:
        adapt = connection.ops.adapt_datetimefield_value
        later = adapt(now + timedelta(seconds=lease_seconds))
        sql = (
            f"{update} AND state = 'queued' RETURNING {d.job_columns}, "
            f"EXISTS (SELECT 1 FROM {d.results} r WHERE r.job_id = {d.table}.id)"
        )
        return sql, [owner, later, adapt(now), adapt(now), *params]
    sql = (
        f"WITH claimed AS ({update} RETURNING {d.job_columns}), "
        f"started AS (INSERT INTO {d.events} (job_id, seq, kind, message, data, created_at) "
        f"SELECT id, event_seq, 'started', '', jsonb_build_object('worker', lease_owner, "
        f"'epoch', lease_epoch, 'attempt', attempts + 1), %s FROM claimed) "
        f"SELECT {d.job_columns}, EXISTS (SELECT 1 FROM {d.results} r "
        f"WHERE r.job_id = claimed.id) FROM claimed"
    )
    return sql, [owner, lease_seconds, now, now, *params, now]


def _claim_rows(
    cursor: Any,
    d: _Dialect,
    owner: str,
    queues: list[str],
    operations: list[str],
    lease_seconds: float,
    job_id: int | None,
    count: int,
    *,
    raw: bool = False,
) -> list[tuple]:
    """The claimed rows, each with ``has_results``, and their ``started`` events.

    PostgreSQL: ``claim_sql`` is all of it. SQLite (inside the write
    transaction): its UPDATE, then the events. ``raw``: on the DB-API cursor,
    whose placeholder is ``?``.
    """
    now = now_under_lock()  # the lease cannot start out expired
    sql, values = claim_sql(
        now,
        owner=owner,
        queues=queues,
        operations=operations,
        lease_seconds=lease_seconds,
        job_id=job_id,
        count=count,
    )
    cursor.execute(sql.replace("%s", "?") if raw else sql, values)
    rows = cursor.fetchall()
    if d.pg or not rows:
        return rows
    stamp = connection.ops.adapt_datetimefield_value(now)
    events: list[tuple] = []
    for row in rows:
        job_id, epoch, seq, attempts = (row[d.column_index[name]] for name in d.claim_facts)
        data = _encode({"worker": owner, "epoch": epoch, "attempt": attempts + 1})
        events.append((job_id, seq, data, stamp))
    # One INSERT for every event (a worker's few); groups keep it under SQLite's
    # limit on bound variables for any count.
    for start in range(0, len(events), CLAIM_EVENTS_PER_INSERT):
        group = events[start : start + CLAIM_EVENTS_PER_INSERT]
        insert = (
            f"INSERT INTO {d.events} (job_id, seq, kind, message, data, created_at) VALUES "
            + ", ".join(["(%s, %s, 'started', '', %s, %s)"] * len(group))
        )
        values = [value for event in group for value in event]
        cursor.execute(insert.replace("%s", "?") if raw else insert, values)
    return rows


# --- renewal, fencing, checkpoints -----------------------------------------------


def renew(lease: Lease, lease_seconds: float) -> str | None:
    """Extend the lease; return the job's state, or None if the lease is gone."""
    d = _dialect()
    with transaction.atomic(), connection.cursor() as cursor:
        later = d.later(now_under_lock(), lease_seconds)
        params = [*later, lease.job_id, lease.owner, lease.epoch]
        cursor.execute(d.renew_sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


BUSY = "busy"  # renew_unless_busy: the row is locked; the lease is still ours


def renew_unless_busy(lease: Lease, lease_seconds: float) -> str | None:
    """``renew`` for the renewal thread: returns BUSY instead of waiting for a row lock.

    A locked row is one a transaction is changing right now — this process's
    own atomic unit (which renewed the lease in fence() and renews it again
    when it commits) or, briefly, an operator action — so skipping this round
    loses nothing. SQLite has no row locks; its writers queue for the one lock.
    """
    d = _dialect()
    with transaction.atomic(), connection.cursor() as cursor:
        later = d.later(now_under_lock(), lease_seconds)
        params = [*later, lease.job_id, lease.owner, lease.epoch]
        cursor.execute(d.renew_nowait_sql, params)
        row = cursor.fetchone()
        if row is None and d.pg:
            # Not renewed: lost, or merely locked? A plain read never waits.
            cursor.execute(d.held_sql, [lease.job_id, lease.owner, lease.epoch])
            if cursor.fetchone() is not None:
                return BUSY
    return row[0] if row else None


def fence(lease: Lease, lease_seconds: float) -> str:
    """Inside a transaction: renew and lock the job row, or raise LeaseLost.

    Used before the side effects of an atomic unit so that they commit only
    if this worker still holds the job when they do.
    """
    state = renew(lease, lease_seconds)
    if state is None:
        raise LeaseLost(f"job {lease.job_id}: lease epoch {lease.epoch} is no longer ours")
    return state


def strays(owner: str, *, held: Collection[int], before: datetime) -> list[Lease]:
    """Jobs leased to ``owner`` that it is not running, last written before ``before``.

    A claim whose commit went through while the connection was cut never told its
    worker: the job sits leased to a worker that does not know it has it, until the
    lease expires and a peer takes it back as after a crash (spending an attempt).
    Asked after an outage (``before``: when it began), so that the worker hands
    such jobs back at once; a job claimed since has a later ``updated_at``.
    """
    rows = (
        Job.objects.filter(lease_owner=owner, state__in=LEASED_STATES, updated_at__lt=before)
        .exclude(pk__in=list(held))
        .values_list("pk", "lease_epoch")
    )
    return [Lease(job_id=pk, owner=owner, epoch=epoch) for pk, epoch in rows]


def has_results(job_id: int) -> bool:
    return UnitResult.objects.filter(job_id=job_id).exists()


def result_exists(job_id: int, key: str) -> tuple[bool, Any]:
    found = UnitResult.objects.filter(job_id=job_id, key=key).values_list("result", flat=True)
    for result in found:
        return True, result
    return False, None


def commit_unit(
    lease: Lease,
    *,
    key: str,
    result: Any,
    checkpoint: Any,
    units_total: int | None,
    events: list[tuple[str, str, dict]] | None = None,
    lease_seconds: float | None = None,
) -> str:
    """Step 4 (and 5's renewal): advance the checkpoint, store the result and events.

    One transaction, conditional on the lease: returns the job's state after
    the commit (running, or paused/cancelling if an operator asked meanwhile)
    or raises LeaseLost and writes nothing. With ``lease_seconds`` the same
    statement extends the lease.
    """
    encoded = _encode(result)
    if len(encoded) > MAX_RESULT_BYTES:  # ASCII-only: characters are bytes
        raise NonRetryable(
            f"unit {key!r} returned {len(encoded)} bytes; a unit result is evidence, "
            f"keep it under {MAX_RESULT_BYTES} bytes"
        )
    conn = connections[DEFAULT_DB_ALIAS]  # one lookup: the proxy costs one per attribute
    d = _dialect()
    fixed = (_encode(checkpoint), units_total, len(events or ()))

    def bind() -> tuple[list, list]:
        """The statements' parameters, timed by ``now_under_lock``: call with the lock held."""
        params, now = _commit_params(conn, d, lease, fixed, lease_seconds)
        return params, [key, encoded, now]

    if not events and not conn.in_atomic_block:
        # The hot path: no events to number, no outer transaction (a non-atomic
        # unit), so the commit goes straight to the driver.
        row = _commit_direct(conn, d, bind)
        if row is None:
            raise LeaseLost(
                f"job {lease.job_id}: checkpoint refused, lease epoch {lease.epoch} lost"
            )
        return row[0]
    # Inside an atomic unit's transaction (a savepoint: a caller may catch
    # LeaseLost and carry on with its own transaction), or with events to add.
    # Either way the write lock is held once the block is entered (SQLite: the
    # unit's own BEGIN IMMEDIATE, or this block's).
    with transaction.atomic():
        conn.ensure_connection()
        params, result_params = bind()
        cursor = conn.connection.cursor()
        try:
            cursor.execute(d.commit_sql, params)
            row = cursor.fetchone()
            if row is None:
                raise LeaseLost(
                    f"job {lease.job_id}: checkpoint refused, lease epoch {lease.epoch} lost"
                )
            state, last_seq = row
            cursor.execute(d.result_sql, [lease.job_id, *result_params])
        finally:
            cursor.close()
        if events:
            first = last_seq - len(events) + 1
            JobEvent.objects.bulk_create(
                JobEvent(
                    job_id=lease.job_id,
                    seq=first + index,
                    kind=kind,
                    message=truncate_utf8(message, 2048),
                    data=data,
                    created_at=timezone.now(),
                )
                for index, (kind, message, data) in enumerate(events)
            )
    return state


def _commit_params(
    conn: Any,
    d: _Dialect,
    lease: Lease,
    fixed: tuple[str, int | None, int],
    lease_seconds: float | None,
) -> tuple[list, str]:
    """``commit_sql``'s parameters and the commit's timestamp, from ``now_under_lock``.

    ``fixed`` is (checkpoint JSON, units_total, number of events).
    """
    moment = now_under_lock()
    if d.utc_text:
        now = str(moment.astimezone(UTC).replace(tzinfo=None))
    else:
        now = conn.ops.adapt_datetimefield_value(moment)
    if d.pg:
        # CASE WHEN expiry < later - lease/3 THEN later: seconds, seconds, seconds
        extend = [lease_seconds] * 3
    elif lease_seconds is None:
        extend = [None, None]
    else:
        later = moment + timedelta(seconds=lease_seconds)
        renew_below = later - timedelta(seconds=lease_seconds / 3)
        if d.utc_text:
            extend = [str(t.astimezone(UTC).replace(tzinfo=None)) for t in (renew_below, later)]
        else:
            extend = [conn.ops.adapt_datetimefield_value(t) for t in (renew_below, later)]
    checkpoint_json, units_total, n_events = fixed
    params = [checkpoint_json, units_total, now, n_events, *extend]
    params += [lease.job_id, lease.owner, lease.epoch]
    return params, now


def _commit_direct(conn: Any, d: _Dialect, bind: Any) -> tuple | None:
    """A unit commit on the DB-API connection, Django's being in autocommit mode.

    PostgreSQL: one statement, atomic by itself. SQLite: BEGIN IMMEDIATE (the
    write lock first, as Django's own transactions take it), the two writes,
    COMMIT — or ROLLBACK on any error or a lost lease. ``bind()`` gives the
    parameters once the lock is held. Errors still come out as Django's
    database exceptions.
    """
    with conn.wrap_database_errors:
        conn.ensure_connection()
        cursor = conn.connection.cursor()
        try:
            if d.pg:
                params, result = bind()
                cursor.execute(d.commit_one_sql, params + result)
                return cursor.fetchone()
            row = None
            with _sqlite_write(conn, cursor):
                params, result = bind()
                cursor.execute(d.commit_sql, params)
                row = cursor.fetchone()
                if row is None:
                    raise _Rollback
                cursor.execute(d.result_sql, [params[-3], *result])
            return row
        finally:
            cursor.close()


def finish_unit(
    lease: Lease,
    *,
    key: str,
    result: Any,
    checkpoint: Any,
    units_total: int | None,
    operation: str,
    attempts: int,
) -> str:
    """The last unit's commit, which also completes the job: one fenced transaction.

    Checkpoint, unit result, the ``completed`` event and the state commit
    together, or nothing does (LeaseLost). The state ends as ``complete()``
    would leave it: a cancel accepted meanwhile wins (``cancelled``), a pause
    is honoured (stays ``paused``, lease released, completes once resumed).
    PostgreSQL: one statement. SQLite: BEGIN IMMEDIATE, three writes, COMMIT.
    Returns the job's state after the commit. The caller must have no pending
    events (they would need numbering before the completion's).
    """
    encoded = _encode(result)
    if len(encoded) > MAX_RESULT_BYTES:
        raise NonRetryable(
            f"unit {key!r} returned {len(encoded)} bytes; a unit result is evidence, "
            f"keep it under {MAX_RESULT_BYTES} bytes"
        )
    conn = connections[DEFAULT_DB_ALIAS]
    d = _dialect()
    fenced = [lease.job_id, lease.owner, lease.epoch]

    def bind() -> tuple[list, str]:
        moment = now_under_lock()
        if d.utc_text:
            now = str(moment.astimezone(UTC).replace(tzinfo=None))
        else:
            now = conn.ops.adapt_datetimefield_value(moment)
        return [_encode(checkpoint), units_total, now, now, *fenced], now

    def run(cursor: Any) -> tuple | None:
        params, now = bind()
        if d.pg:
            faults.reach("finish_before_commit")  # the statement is its own transaction
            cursor.execute(d.finish_one_sql, [*params, key, encoded, now, now])
            return cursor.fetchone()
        cursor.execute(d.finish_sql, params)
        row = cursor.fetchone()
        if row is None:
            return None
        job_id, state, seq, units_done = row
        cursor.execute(d.result_sql, [job_id, key, encoded, now])
        if state in (JobState.COMPLETED, JobState.CANCELLED):
            message = FINISH_CANCEL_MESSAGE if state == JobState.CANCELLED else ""
            data = {"units_done": units_done} if state == JobState.COMPLETED else {}
            cursor.execute(d.finish_event_sql, [job_id, seq, state, message, _encode(data), now])
        faults.reach("finish_before_commit")  # written, not yet committed
        return state, seq, units_done

    if conn.in_atomic_block:
        with transaction.atomic():
            conn.ensure_connection()
            cursor = conn.connection.cursor()
            try:
                row = run(cursor)
            finally:
                cursor.close()
    else:
        row = _run_direct(conn, d, run)
    if row is None:
        raise LeaseLost(f"job {lease.job_id}: completion refused, lease epoch {lease.epoch} lost")
    state, _seq, units_done = row
    job = Job(
        pk=lease.job_id,
        operation=operation,
        state=state,
        attempts=attempts,
        checkpoint=checkpoint,
        units_done=units_done,
    )
    if state == JobState.COMPLETED:
        announce_change(job, JobState.RUNNING, "completed", "", {"units_done": units_done})
    elif state == JobState.CANCELLED:
        announce_change(job, JobState.CANCELLING, "cancelled", FINISH_CANCEL_MESSAGE, {})
    else:
        log_state(job, "lease_released", reason=state)
    return state


def _run_direct(conn: Any, d: _Dialect, run: Any) -> tuple | None:
    """``run(cursor)`` on the DB-API connection (Django's in autocommit mode), as one
    transaction: PostgreSQL's single statement, or SQLite's BEGIN IMMEDIATE … COMMIT
    (ROLLBACK on an error or when ``run`` returns None)."""
    with conn.wrap_database_errors:
        conn.ensure_connection()
        cursor = conn.connection.cursor()
        try:
            if d.pg:
                return run(cursor)
            row = None
            with _sqlite_write(conn, cursor):
                row = run(cursor)
                if row is None:
                    raise _Rollback
            return row
        finally:
            cursor.close()


# --- fenced transitions ------------------------------------------------------------


def _locked(lease: Lease) -> Job:
    job = (
        Job.objects.select_for_update()
        .filter(pk=lease.job_id, lease_owner=lease.owner, lease_epoch=lease.epoch)
        .first()
    )
    if job is None:
        raise LeaseLost(f"job {lease.job_id}: lease epoch {lease.epoch} lost")
    return job


def _save(job: Job, now: datetime, event: tuple[str, str, dict], **fields: Any) -> None:
    """Apply ``fields`` to the locked job and append ``event`` (kind, message, data)."""
    old_state = job.state
    kind, message, data = event
    for name, value in fields.items():
        setattr(job, name, value)
    job.updated_at = now
    add_events(job, [(kind, message, data)], now)
    job.save(update_fields=[*fields, "updated_at", "event_seq"])
    announce_change(job, old_state, kind, message, data)


_FREE = {"lease_owner": None, "lease_expires_at": None}


def _cancelled(job: Job, now: datetime, **fields: Any) -> None:
    """The cancel is done; ``fields`` are saved with it (a failure's attempt and error)."""
    _save(
        job,
        now,
        ("cancelled", FINISH_CANCEL_MESSAGE, {}),
        state=JobState.CANCELLED,
        finished_at=now,
        error_code="cancelled",
        reason=job.reason or "cancelled",
        **{**fields, **_FREE},
    )


def complete(lease: Lease) -> str:
    """All units done. A cancel accepted meanwhile wins: the job ends cancelled.

    A pause accepted meanwhile is honoured too: the job stays paused (lease
    released) and completes once resumed — an operator who paused it must not
    find it finished behind their back.
    """
    now = timezone.now()
    with transaction.atomic():
        job = _locked(lease)
        if job.state == JobState.CANCELLING:
            _cancelled(job, now)
        elif job.state == JobState.PAUSED:
            Job.objects.filter(pk=job.pk).update(updated_at=now, **_FREE)
            log_state(job, "lease_released", reason="paused")
        else:
            _save(
                job,
                now,
                ("completed", "", {"units_done": job.units_done}),
                state=JobState.COMPLETED,
                finished_at=now,
                reason="",
                error_code="",
                **_FREE,
            )
        return job.state


def settle(lease: Lease) -> str:
    """At a unit boundary after an operator paused or cancelled: let go of the job.

    Returns the state the job is left in; "running" means it was resumed
    meanwhile and the worker should carry on.
    """
    now = timezone.now()
    with transaction.atomic():
        job = _locked(lease)
        if job.state == JobState.CANCELLING:
            _cancelled(job, now)
        elif job.state == JobState.PAUSED:
            Job.objects.filter(pk=job.pk).update(updated_at=now, **_FREE)
            log_state(job, "lease_released", reason="paused")
        return job.state


def release(lease: Lease, why: str = "worker shutting down") -> str:
    """Graceful stop at a unit boundary: hand the job back at once, no attempt spent."""
    now = timezone.now()
    with transaction.atomic():
        job = _locked(lease)
        if job.state == JobState.RUNNING:
            _save(
                job,
                now,
                ("released", why, {"worker": lease.owner}),
                state=JobState.QUEUED,
                next_attempt_at=now,
                **_FREE,
            )
        elif job.state == JobState.CANCELLING:
            _cancelled(job, now)
        else:
            Job.objects.filter(pk=job.pk).update(updated_at=now, **_FREE)
        return job.state


def pause_unavailable(lease: Lease, reason: str) -> None:
    """A credential or storage is missing: paused with the operator's to-do, no attempt spent."""
    now = timezone.now()
    with transaction.atomic():
        job = _locked(lease)
        if job.state == JobState.CANCELLING:
            _cancelled(job, now)
            return
        _save(
            job,
            now,
            ("paused", reason, {"cause": "unavailable"}),
            state=JobState.PAUSED,
            reason=reason,
            error_code="unavailable",
            **_FREE,
        )
        needs_attention(job, "unavailable", reason)


def _coalesce_turn_away(
    job: Job, lease: Lease, entry: dict[str, Any], retry_at: datetime, now: datetime
) -> bool:
    """Fold a repeated turn-away into the previous one's ``rescheduled`` event.

    Applies when this lease did nothing but be turned away again: the newest
    event is this claim's ``started`` and the one before it the previous
    turn-away. Then that ``started`` is withdrawn (its seq is reused by the
    next event) and the ``rescheduled`` event counts one more (``turn_aways``,
    ``last_message``, ``last_at``; its message lists the first few distinct
    reasons), so a backlog waiting behind a gate keeps two events per job
    instead of two per try.
    """
    newest = {
        event.seq: event
        for event in JobEvent.objects.filter(job_id=job.pk, seq__gte=job.event_seq - 1)
    }
    started, previous = newest.get(job.event_seq), newest.get(job.event_seq - 1)
    if not (
        started is not None
        and started.kind == "started"
        and started.data.get("epoch") == lease.epoch
        and previous is not None
        and previous.kind == "rescheduled"
    ):
        return False
    started.delete()
    reason = truncate_utf8(entry["message"], MAX_ERROR_MESSAGE_BYTES)
    reasons = list(previous.data.get("reasons") or [previous.message])
    if reason not in reasons and len(reasons) < MAX_TURN_AWAY_REASONS:
        reasons.append(reason)
    previous.message = truncate_utf8(" | ".join(reasons), MAX_ERROR_MESSAGE_BYTES)
    previous.data = {
        **previous.data,
        "next_attempt_at": retry_at.isoformat(),
        "turn_aways": int(previous.data.get("turn_aways", 1)) + 1,
        "reasons": reasons,
        "last_message": reason,
        "last_at": now.isoformat(),
    }
    previous.save(update_fields=["message", "data"])
    old_state = job.state
    job.event_seq -= 1
    job.state, job.next_attempt_at, job.updated_at = JobState.QUEUED, retry_at, now
    job.lease_owner = job.lease_expires_at = None
    job.save(
        update_fields=[
            "state",
            "next_attempt_at",
            "updated_at",
            "lease_owner",
            "lease_expires_at",
            "event_seq",
        ]
    )
    announce_change(job, old_state, "rescheduled", entry["message"], previous.data)
    return True


def record_failure(
    lease: Lease,
    entry: dict[str, Any],
    *,
    retry_at: datetime | None,
    consume_attempt: bool = True,
    on_exhausted: str = JobState.FAILED,
    coalesce: bool = False,
) -> str:
    """A unit failed. ``retry_at`` None means non-retryable: fail now.

    The retry time and the attempt count are committed *before* the lease is
    released, so a restart during the backoff neither resets the wait nor
    retries early. ``coalesce``: the lease committed no unit, so a repeated
    turn-away may be folded into the previous one's event. Returns the
    resulting state.
    """
    now = timezone.now()
    with transaction.atomic():
        job = _locked(lease)
        if not consume_attempt and retry_at is not None:
            # A gate of ours said "not yet": nothing was tried, nothing is charged.
            if job.state == JobState.CANCELLING:
                _cancelled(job, now)
            elif job.state == JobState.PAUSED:
                Job.objects.filter(pk=job.pk).update(updated_at=now, **_FREE)
            elif not (coalesce and _coalesce_turn_away(job, lease, entry, retry_at, now)):
                facts = {"next_attempt_at": retry_at.isoformat(), "turn_aways": 1}
                _save(
                    job,
                    now,
                    ("rescheduled", entry["message"], facts),
                    state=JobState.QUEUED,
                    next_attempt_at=retry_at,
                    **_FREE,
                )
            return job.state
        attempts = job.attempts + 1
        history = append_bounded(job.errors, entry)
        common = {
            "attempts": attempts,
            "errors": history,
            "last_error_class": entry["error_class"][:200],
            **_FREE,
        }
        message = entry["message"]
        facts = {"error_class": entry["error_class"], "attempt": attempts}
        if job.state == JobState.CANCELLING:
            _cancelled(job, now, **common)  # the failed attempt stays on record
            return job.state
        if retry_at is None:
            reason = f"failed permanently: {message}"
            _save(
                job,
                now,
                ("failed", reason, facts),
                state=JobState.FAILED,
                finished_at=now,
                reason=reason,
                error_code="non_retryable",
                **common,
            )
            needs_attention(job, "non_retryable", reason)
            return job.state
        if attempts >= job.max_attempts:
            target = JobState(on_exhausted)
            reason = f"gave up after {attempts} attempts; last error: {message}"
            extra = {"finished_at": now} if target == JobState.FAILED else {}
            _save(
                job,
                now,
                (target.value, reason, facts),
                state=target,
                reason=reason,
                error_code="exhausted",
                **common,
                **extra,
            )
            needs_attention(job, "exhausted", reason)
            return job.state
        if job.state == JobState.PAUSED:
            _save(job, now, ("failed_attempt", message, facts), **common)
            return job.state
        facts["next_attempt_at"] = retry_at.isoformat()
        _save(
            job,
            now,
            ("retry_scheduled", message, facts),
            state=JobState.QUEUED,
            next_attempt_at=retry_at,
            **common,
        )
        return job.state
