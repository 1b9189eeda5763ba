"""Claiming, renewing and committing under a lease, fenced by the lease epoch.

Every write a worker makes to a job it claimed is conditional on
``(id, lease_owner, lease_epoch)``: once a job was reclaimed (the epoch moved
on) or cancelled, the old worker's renewal, checkpoint, completion, failure
and release all match zero rows, and the worker abandons the job without
touching it. The claim is one atomic conditional update. The SQL of both
databases is in ``durable.sql`` (one module per vendor); nothing here asks
which database it runs on.

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
from collections.abc import Collection
from datetime import datetime
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from .endings import Lease as Lease  # the fencing token, decided on in durable.endings
from .endings import finished
from .errors import LeaseLost, NonRetryable
from .jobs import announce_change, log_state
from .models import Job, JobEvent, UnitResult
from .policy import truncate_utf8
from .sql import BUSY as BUSY  # renew_unless_busy's answer
from .sql import Cursor, Row, statements
from .sql.base import NextClaim as NextClaim  # finish_unit's then
from .sql.base import Stamp
from .states import LEASED_STATES, JobState

log = logging.getLogger("durable.lease")

MAX_RESULT_BYTES = 64 * 1024


def _encode(value: Any) -> str:
    return json.dumps(value, default=str)


def _checked_result(key: str, result: Any) -> str:
    """The unit's result as JSON, refused when it is too large to keep as evidence."""
    encoded = _encode(result)
    if len(encoded) > MAX_RESULT_BYTES:  # ASCII-only: characters are bytes
        raise NonRetryable(
            f"unit {key!r} returned {len(encoded)} bytes; a unit result is evidence, "
            f"keep it under {MAX_RESULT_BYTES} bytes"
        )
    return encoded


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


# --- claim -----------------------------------------------------------------------


def pick_sql(
    now: datetime | None,
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
    paused queue, say) is one more entry in its ``where`` and one more parameter.
    """
    return statements().pick(
        now, queues=queues, operations=operations, job_id=job_id, lock=lock, limit=limit
    )


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
    sql = statements(conn)

    def rows_of(cursor: Cursor, *, driver: bool) -> list[Row]:
        return sql.claim_rows(
            cursor,
            now_under_lock(),  # the lease cannot start out expired
            owner=owner,
            queues=queues,
            operations=operations,
            lease_seconds=lease_seconds,
            job_id=job_id,
            count=count,
            driver=driver,
        )

    if conn.in_atomic_block:
        # Inside a caller's transaction (tests, run_job under atomic): the same
        # statements through Django's cursor, in a savepoint.
        with transaction.atomic(), conn.cursor() as cursor:
            rows = rows_of(cursor, driver=False)
    else:
        # One transaction of its own; on SQLite the write lock is taken first, so the
        # lease's expiry is computed once it is held, never before a wait for it.
        rows = sql.write(conn, lambda cursor: rows_of(cursor, driver=True)) or []
    return _claimed(conn, owner, rows, committed=not conn.in_atomic_block)


def _claimed(
    conn: BaseDatabaseWrapper, owner: str, rows: list[Row], *, committed: bool
) -> list[tuple[Lease, Job]]:
    """Claimed rows as leases and jobs, in the pick's order, their ``started`` announced."""
    sql = statements(conn)
    claimed = []
    for row in rows:
        job = sql.job_from_row(conn, row[:-1])
        job.has_results = bool(row[-1])
        claimed.append((Lease(job.pk, owner, job.lease_epoch), job))
    # RETURNING keeps no order: the pick's, so the first thread served gets the first job.
    if len(claimed) > 1:
        claimed.sort(key=lambda pair: (-pair[1].priority, pair[1].next_attempt_at, pair[1].pk))
    for _, job in claimed:
        data = {"worker": owner, "epoch": job.lease_epoch, "attempt": job.attempts + 1}
        announce_change(job, JobState.QUEUED, "started", "", data, committed=committed)
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
    """
    return statements().claim(
        now,
        owner=owner,
        queues=queues,
        operations=operations,
        lease_seconds=lease_seconds,
        job_id=job_id,
        count=count,
    )


# --- renewal, fencing, checkpoints -----------------------------------------------


def renew(lease: Lease, lease_seconds: float) -> str | None:
    """Extend the lease; return the job's state, or None if the lease is gone."""
    conn = connections[DEFAULT_DB_ALIAS]
    sql = statements(conn)
    with transaction.atomic(), conn.cursor() as cursor:
        fenced = (lease.job_id, lease.owner, lease.epoch)
        return sql.renew(cursor, now_under_lock(), fenced, lease_seconds)


def renew_unless_busy(lease: Lease, lease_seconds: float) -> str | None:
    """``renew`` for the renewal thread: returns BUSY instead of waiting for a row lock.

    A locked row is one a transaction is changing right now — this process's
    own atomic unit (which renewed the lease in fence() and renews it again
    when it commits) or, briefly, an operator action — so skipping this round
    loses nothing. SQLite has no row locks; its writers queue for the one lock.
    """
    conn = connections[DEFAULT_DB_ALIAS]
    sql = statements(conn)
    with transaction.atomic(), conn.cursor() as cursor:
        fenced = (lease.job_id, lease.owner, lease.epoch)
        return sql.renew_unless_busy(cursor, now_under_lock(), fenced, lease_seconds)


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
    events: list[tuple[str, str, dict[str, Any]]] | None = None,
    lease_seconds: float | None = None,
) -> str:
    """Step 4 (and 5's renewal): advance the checkpoint, store the result and events.

    One transaction, conditional on the lease: returns the job's state after
    the commit (running, or paused/cancelling if an operator asked meanwhile)
    or raises LeaseLost and writes nothing. With ``lease_seconds`` the same
    statement extends the lease.
    """
    encoded = _checked_result(key, result)
    conn = connections[DEFAULT_DB_ALIAS]  # one lookup: the proxy costs one per attribute
    sql = statements(conn)
    fixed = (_encode(checkpoint), units_total, len(events or ()))
    fenced = (lease.job_id, lease.owner, lease.epoch)

    def bind() -> tuple[list[Any], Stamp]:
        """The statements' parameters, timed by ``now_under_lock``: call with the lock held."""
        return sql.commit_params(conn, now_under_lock(), fixed, fenced, lease_seconds)

    if not events and not conn.in_atomic_block:
        # The hot path: no events to number, no outer transaction (a non-atomic
        # unit), so the commit goes straight to the driver, a transaction of its own.
        def run(cursor: Cursor) -> Row | None:
            params, now = bind()
            return sql.commit_unit(cursor, params, [key, encoded, now])

        row = sql.write(conn, run)
        if row is None:
            raise LeaseLost(
                f"job {lease.job_id}: checkpoint refused, lease epoch {lease.epoch} lost"
            )
        return str(row[0])
    # Inside an atomic unit's transaction (a savepoint: a caller may catch
    # LeaseLost and carry on with its own transaction), or with events to add.
    # Either way the write lock is held once the block is entered (SQLite: the
    # unit's own BEGIN IMMEDIATE, or this block's).
    with transaction.atomic():
        conn.ensure_connection()
        params, now = bind()
        cursor = conn.connection.cursor()
        try:
            cursor.execute(sql.commit_unit_sql, params)
            row = cursor.fetchone()
            if row is None:
                raise LeaseLost(
                    f"job {lease.job_id}: checkpoint refused, lease epoch {lease.epoch} lost"
                )
            state, last_seq = row
            cursor.execute(sql.insert_result_sql, [lease.job_id, key, encoded, now])
        finally:
            cursor.close()
        if events:
            _add_unit_events(lease.job_id, last_seq, events)
    return str(state)


def _add_unit_events(
    job_id: int, last_seq: int, events: list[tuple[str, str, dict[str, Any]]]
) -> None:
    """The events a unit committed with, numbered up to ``last_seq`` (its commit's)."""
    first = last_seq - len(events) + 1
    JobEvent.objects.bulk_create(
        JobEvent(
            job_id=job_id,
            seq=first + index,
            kind=kind,
            message=truncate_utf8(message, 2048),
            data=data,
            created_at=timezone.now(),
        )
        for index, (kind, message, data) in enumerate(events)
    )


class Ended(NamedTuple):
    """What the last unit's commit left: its log line and signal need no re-read of the
    row, nor a ``Job`` built for them (``durable.jobs.JobFacts``); and the job claimed
    with it (``finish_unit``'s ``then``), if any."""

    pk: int
    operation: str
    state: str
    attempts: int
    checkpoint: Any
    units_done: int
    next: tuple[Lease, Job] | None = None


def finish_unit(
    lease: Lease,
    *,
    key: str,
    result: Any,
    checkpoint: Any,
    units_total: int | None,
    operation: str,
    attempts: int,
    then: NextClaim | None = None,
) -> Ended:
    """The last unit's commit, which also completes the job: one fenced transaction.

    Checkpoint, unit result, the ``completed`` event and the state commit
    together, or nothing does (LeaseLost). The state ends as ``complete()``
    would leave it: a cancel accepted meanwhile wins (``cancelled``), a pause
    is honoured (stays ``paused``, lease released, completes once resumed).
    PostgreSQL: one statement. SQLite: BEGIN IMMEDIATE, three writes, COMMIT.
    The caller must have no pending events (they would need numbering before
    the completion's).

    ``then``: the same transaction also claims the calling thread's next job
    (``Ended.next``) — only if the finish applied, so a lost lease claims nothing —
    and a busy worker pays one commit per one-unit job instead of two. The caller
    must start that job at once (or hand it back): it is leased. Never inside a
    caller's transaction (``then`` is ignored there): a claim must commit at once.
    """
    encoded = _checked_result(key, result)
    conn = connections[DEFAULT_DB_ALIAS]
    sql = statements(conn)
    checkpoint_json = _encode(checkpoint)
    if conn.in_atomic_block or (then is not None and not (then.queues and then.operations)):
        then = None

    def run(cursor: Cursor) -> tuple[Row, list[Row]] | None:
        moment = now_under_lock()
        now = sql.timestamp(conn, moment)
        params = [checkpoint_json, units_total, now, now, lease.job_id, lease.owner, lease.epoch]
        if then is not None:
            return sql.finish_and_claim(cursor, params, [key, encoded, now], moment, then)
        row = sql.finish_unit(cursor, params, [key, encoded, now])
        return None if row is None else (row, [])

    committed = not conn.in_atomic_block  # a transaction of its own, committed on return
    if not committed:
        with transaction.atomic():
            conn.ensure_connection()
            cursor = conn.connection.cursor()
            try:
                done = run(cursor)
            finally:
                cursor.close()
    else:
        done = sql.write(conn, run)
    if done is None:
        raise LeaseLost(f"job {lease.job_id}: completion refused, lease epoch {lease.epoch} lost")
    (state, _seq, units_done), rows = done
    ended = Ended(lease.job_id, operation, str(state), attempts, checkpoint, units_done)
    ending = finished(ended.state, units_done)
    if ending is None:
        log_state(ended, "lease_released", reason=ended.state)
    else:
        announce_change(ended, ending.old_state, *ending.event, committed=committed)
    if rows and then is not None:
        ended = ended._replace(next=_claimed(conn, then.owner, rows, committed=True)[0])
    return ended
