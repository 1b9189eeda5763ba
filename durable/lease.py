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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from .endings import FINISH_CANCEL_MESSAGE, finished
from .errors import LeaseLost, NonRetryable
from .jobs import add_events, announce_change, log_state, needs_attention
from .models import Job, JobEvent, UnitResult
from .policy import MAX_ERROR_MESSAGE_BYTES, append_bounded, truncate_utf8
from .sql import BUSY, Cursor, Row, statements
from .states import JobState

log = logging.getLogger("durable.lease")

MAX_RESULT_BYTES = 64 * 1024
MAX_TURN_AWAY_REASONS = 4  # distinct reasons a coalesced "rescheduled" event lists

__all__ = ["BUSY", "Lease"]  # BUSY: renew_unless_busy's answer, from durable.sql


@dataclass(frozen=True)
class Lease:
    job_id: int
    owner: str
    epoch: int


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
    claimed = []
    for row in rows:
        job = sql.job_from_row(conn, row[:-1])
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

    def bind() -> tuple[list[Any], Any]:
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
    encoded = _checked_result(key, result)
    conn = connections[DEFAULT_DB_ALIAS]
    sql = statements(conn)
    checkpoint_json = _encode(checkpoint)

    def run(cursor: Cursor) -> Row | None:
        now = sql.timestamp(conn, now_under_lock())
        params = [checkpoint_json, units_total, now, now, lease.job_id, lease.owner, lease.epoch]
        return sql.finish_unit(cursor, params, [key, encoded, now])

    if conn.in_atomic_block:
        with transaction.atomic():
            conn.ensure_connection()
            cursor = conn.connection.cursor()
            try:
                row = run(cursor)
            finally:
                cursor.close()
    else:
        row = sql.write(conn, run)
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
    ending = finished(state, units_done)
    if ending is None:
        log_state(job, "lease_released", reason=state)
    else:
        announce_change(job, ending.old_state, *ending.event)
    return str(state)


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
