"""Enqueue and the operator actions (pause, resume, cancel, retry), one function each.

Each action locks the rows it touches, decides with the pure table in
``durable.states``, writes the new state and its event in the same
transaction, and reports per job whether it applied. The dashboard, the API
and the management commands all call these; nothing else changes ``state``.
"""

from __future__ import annotations

import copy
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from . import signals, tracing
from .errors import InputRejected
from .models import Job, JobEvent
from .operations import Operation, get_operation, max_input_bytes
from .policy import MAX_ERROR_MESSAGE_BYTES, truncate_utf8
from .rules import UNIQUE_KEY_MAX, priority_from, queue_name_problem
from .sanitize import clean_and_encode, clean_input
from .sql import statements
from .sql.base import SHARED_FIELDS
from .states import FINISHED_STATES, Action, Decision, JobState, OnRestart, decide

log = logging.getLogger("durable.jobs")

BULK_BATCH_SIZE = 500
ENQUEUE_BATCH_SIZE = 2000  # jobs per pair of INSERTs in enqueue_many


@dataclass(frozen=True)
class Outcome:
    """What an action did to one job. ``applied`` False + ``refusal`` None = already so."""

    job_id: int
    action: str
    applied: bool
    state: str
    refusal: str | None = None

    @property
    def refused(self) -> bool:
        return self.refusal is not None


# --- events -------------------------------------------------------------------


def add_events(
    job: Job, events: Sequence[tuple[str, str, dict[str, Any]]], now: datetime
) -> list[JobEvent]:
    """Append events to a job whose row the caller holds locked.

    Bumps ``job.event_seq`` in memory; the caller saves it with the state change,
    so the sequence and the state commit together and ``seq`` has no gaps.
    """
    rows = []
    for kind, message, data in events:
        job.event_seq += 1
        rows.append(
            JobEvent(
                job_id=job.pk,
                seq=job.event_seq,
                kind=kind,
                message=truncate_utf8(message, MAX_ERROR_MESSAGE_BYTES),
                data=data,
                created_at=now,
            )
        )
    JobEvent.objects.bulk_create(rows)
    return rows


class JobFacts(Protocol):
    """What a state change's log line and signal say of the job: a ``Job``, or the
    facts a commit returned (``durable.lease.Ended``) when there is no row to read."""

    @property
    def pk(self) -> Any: ...
    @property
    def operation(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def checkpoint(self) -> Any: ...


def log_state(job: JobFacts, kind: str, **extra: Any) -> None:
    if not log.isEnabledFor(logging.INFO):
        return  # a busy worker logs thousands of these a second: skip building the record
    log.info(
        kind,
        extra={
            "job": job.pk,
            "operation": job.operation,
            "state": job.state,
            "attempt": job.attempts,
            "checkpoint": job.checkpoint,
            **extra,
        },
    )


def announce_change(
    job: JobFacts,
    old_state: str,
    kind: str,
    message: str,
    data: dict[str, Any],
    *,
    committed: bool = False,
) -> None:
    """Log the change and send ``job_state_changed`` once it has committed.

    ``committed``: the caller's own write already committed (the hot path's claims
    and finishes, their own transactions), so the signal goes now, without asking
    the connection whether a transaction is open (a thread-local lookup per job).
    """
    log_state(job, kind, previous=old_state)
    send = signals.send_now if committed else signals.send_on_commit
    send(
        signals.job_state_changed,
        job_id=job.pk,
        operation=job.operation,
        old_state=old_state,
        new_state=job.state,
        kind=kind,
        message=message,
        data=data,
    )


def needs_attention(job: Job, cause: str, reason: str) -> None:
    """Announce (after commit) that ``job`` stopped and needs a person.

    ``next_attempt_at`` is the job's own when it will run again by itself
    (queued), else None: a paused or failed job has no next attempt until
    someone acts.
    """
    signals.send_on_commit(
        signals.job_needs_attention,
        job_id=job.pk,
        operation=job.operation,
        state=job.state,
        cause=cause,
        reason=reason,
        checkpoint=job.checkpoint,
        attempt=job.attempts,
        next_attempt_at=job.next_attempt_at if job.state == JobState.QUEUED else None,
    )


# --- enqueue --------------------------------------------------------------------


def clean_job_input(op: Operation, data: Any) -> dict[str, Any]:
    """The input as ``enqueue`` stores it: safe JSON (no secrets, bounded), the
    operation's own ``clean_input``, and safe again — it may have normalised it.

    Also for whoever must know beforehand what ``enqueue`` will make of an input
    (a schedule checking it, a command comparing it with an unfinished job's).
    """
    return clean_and_encode_input(op, data)[0]


def clean_and_encode_input(op: Operation, data: Any) -> tuple[dict[str, Any], str]:
    """``clean_job_input`` and the JSON text of the result, encoded once (the last
    check's measure is what the row stores). An operation without a ``clean_input``
    of its own has its input checked once: nothing can have changed it."""
    limit = max_input_bytes()
    if type(op).clean_input is Operation.clean_input:
        return clean_and_encode(data, max_bytes=limit)
    data = clean_input(data, max_bytes=limit)
    return clean_and_encode(op.clean_input(data), max_bytes=limit)


def enqueue(
    operation: str,
    input: dict[str, Any] | None = None,
    *,
    owner: str = "",
    tenant: str = "",
    queue: str | None = None,
    priority: int | None = None,
    on_restart: str | None = None,
    max_attempts: int | None = None,
    run_after: datetime | None = None,
    unique_key: str | None = None,
) -> Job:
    """Validate and persist a job with its ``enqueued`` event.

    Inside the caller's transaction the job commits (or not) with the caller's
    own writes — the job row lives in the same database, so there is no
    enqueue-before-commit race to guard against.

    With ``unique_key`` (or, when it is None, the operation's own
    ``Operation.unique_key(input)``), an unfinished job with the same key is
    returned instead of creating a second one (``job.created`` tells which
    happened); the database's partial unique index settles races between processes.

    The queue (``queue`` or the operation's) and the priority obey the rules every
    way into the engine shares (``durable.rules``): 1 to 64 letters, digits,
    ``_ . : -`` starting with a letter or digit, and a whole number from -100 to
    100; anything else raises ``InputRejected``.
    """
    op = get_operation(operation)
    data, encoded = clean_and_encode_input(op, input)
    common = _common_fields(
        op,
        owner,
        tenant,
        queue,
        op.priority if priority is None else priority,
        on_restart or op.on_restart,
        max_attempts,
    )
    common["trace_context"] = tracing.context_for_enqueue(op.name, common["queue"])
    now = timezone.now()
    if unique_key is None:
        unique_key = op.unique_key(data)
    _check_unique_key(unique_key)
    # Outside any transaction the job is its own: one statement on PostgreSQL, one
    # write turn on SQLite, on the driver's cursor. Inside the caller's, it joins it.
    alone = not connection.in_atomic_block and connection.get_autocommit()
    for _ in range(3):
        try:
            if alone:
                return _create_alone(
                    op.name, data, encoded, now=now, run_after=run_after, unique_key=unique_key,
                    **common,
                )  # fmt: skip
            return _create(
                op.name, data, now=now, run_after=run_after, unique_key=unique_key, **common
            )
        except IntegrityError:
            if unique_key is None:
                raise  # not a unique-key race: some other constraint refused the row
            existing = _key_holders([unique_key]).get(unique_key)
            if existing is not None:
                existing.created = False
                return existing
            # The other job finished between our insert and this read: try again.
    raise RuntimeError(f"could not enqueue with unique_key {unique_key!r}")  # pragma: no cover


def _create(
    operation: str,
    data: dict[str, Any],
    *,
    now: datetime,
    run_after: datetime | None,
    **fields: Any,
) -> Job:
    # enqueue_many's INSERT for one job: the job with its first event already
    # counted (event_seq=1) and that event — one statement on PostgreSQL, two on
    # SQLite — where two ORM creates cost a round trip and ~0.6 ms of Python more.
    # With a unique key it is a savepoint, so a caller's transaction survives a
    # lost race (enqueue returns the winner); without one, an IntegrityError is
    # a real error and needs none.
    job = Job(
        operation=operation,
        input=data,
        next_attempt_at=run_after or now,
        created_at=now,
        updated_at=now,
        event_seq=1,
        **fields,
    )
    with transaction.atomic(savepoint=fields.get("unique_key") is not None):
        _insert_many([job], fields, now)
        announce_change(job, "", "enqueued", "", {})
    job.created = True
    return job


def _create_alone(
    operation: str,
    data: dict[str, Any],
    encoded: str,
    *,
    now: datetime,
    run_after: datetime | None,
    **fields: Any,
) -> Job:
    """``_create`` outside any transaction: ``insert_job`` commits the job and its event
    (no ORM, no savepoint: nothing else is in the transaction to protect), then the
    state log and the signal, after the commit as ``_create``'s are."""
    values = _template_values()
    values[_POSITION["operation"]], values[_INPUT], values[_ERRORS] = operation, data, []
    for name, value in fields.items():
        values[_POSITION[name]] = value
    values[_POSITION["next_attempt_at"]] = run_after or now
    values[_POSITION["created_at"]] = values[_POSITION["updated_at"]] = now
    job = _by_position(*values)
    sql = statements(connection)
    facts = json.dumps({"owner": fields["owner"], "queue": fields["queue"]})
    job.pk = sql.insert_job(
        connection, sql.job_values(connection, job, encoded), facts, sql.timestamp(connection, now)
    )
    job._state.adding = False
    job.created = True
    log_state(job, "enqueued", previous="")
    _announce_enqueued([job])
    return job


def enqueue_many(
    operation: str,
    inputs: Iterable[dict[str, Any] | None],
    *,
    owner: str = "",
    tenant: str = "",
    queue: str | None = None,
    priority: int | None = None,
    on_restart: str | None = None,
    max_attempts: int | None = None,
    run_after: datetime | None = None,
    unique_keys: Sequence[str | None] | None = None,
    batch_size: int = ENQUEUE_BATCH_SIZE,
) -> list[Job]:
    """``enqueue`` for many inputs of one operation: all validated first, then a few statements.

    Nothing is written unless every input is valid: the first bad one raises
    ``InputRejected`` with its position in ``field`` (``inputs[3].units``).
    Jobs and their ``enqueued`` events are then inserted in batches of
    ``batch_size`` (two multi-row INSERTs each), all in one transaction — the
    caller's if there is one — so either every job is queued or none is.

    Unique keys (``unique_keys[i]``, else the operation's ``unique_key(input)``)
    are honoured as by ``enqueue``: an unfinished job with the key, or an
    earlier input of this call with it, is returned instead of a new job
    (``job.created`` False). Returns one job per input, in input order.
    """
    op = get_operation(operation)
    rows: list[dict[str, Any]] = []
    policy_value = on_restart or op.on_restart
    prio = op.priority if priority is None else priority
    common = _common_fields(op, owner, tenant, queue, prio, policy_value, max_attempts)
    common["trace_context"] = tracing.context_for_enqueue(op.name, common["queue"])
    inputs = list(inputs)
    if unique_keys is not None and len(unique_keys) != len(inputs):
        raise InputRejected("unique_keys", "must have one entry per input")
    for index, raw in enumerate(inputs):
        try:
            data = clean_job_input(op, raw)
            key = unique_keys[index] if unique_keys is not None else None
            if key is None:
                key = op.unique_key(data)
            _check_unique_key(key)
        except InputRejected as exc:
            raise InputRejected(f"inputs[{index}].{exc.field}", exc.reason) from None
        rows.append({"input": data, "unique_key": key})
    now = timezone.now()
    jobs: list[Job] = []
    with transaction.atomic():
        for start in range(0, len(rows), max(1, batch_size)):
            jobs.extend(
                _create_many(op.name, rows[start : start + batch_size], now, run_after, common)
            )
        created = [job for job in jobs if job.created]
        if created:
            log.info("enqueued", extra={"operation": op.name, "jobs": len(created)})
            transaction.on_commit(lambda: _announce_enqueued(created), robust=True)
    return jobs


def _common_fields(
    op: Operation,
    owner: str,
    tenant: str,
    queue: str | None,
    priority: Any,
    on_restart: str,
    max_attempts: int | None,
) -> dict[str, Any]:
    """The fields every job of one enqueue shares, checked once."""
    try:
        policy = OnRestart(on_restart)
    except ValueError:
        raise InputRejected("on_restart", f"must be one of {', '.join(OnRestart.values)}") from None
    try:
        prio = priority_from(priority)
    except ValueError as exc:
        raise InputRejected("priority", str(exc)) from None
    queue = queue or op.queue
    problem = queue_name_problem(queue)
    if problem is not None:
        raise InputRejected("queue", problem)
    return {
        "owner": owner,
        "tenant": tenant,
        "queue": queue,
        "priority": prio,
        "on_restart": policy,
        "max_attempts": max(1, int(max_attempts or op.max_attempts)),
    }


def _check_unique_key(key: str | None) -> None:
    if key is not None and not 0 < len(key) <= UNIQUE_KEY_MAX:
        raise InputRejected("unique_key", f"must be 1 to {UNIQUE_KEY_MAX} characters")


_FIELDS = Job._meta.concrete_fields
# Job(*values): Model.__init__'s positional path, which django-stubs knows only by keyword.
_by_position: Callable[..., Job] = Job
_POSITION = {f.attname: n for n, f in enumerate(_FIELDS)}
_INPUT, _KEY, _ERRORS = (_POSITION[name] for name in ("input", "unique_key", "errors"))
_template: list[Any] = []


def _template_values() -> list[Any]:
    """A new job's field values by position, the model's defaults (``_create_alone``
    overwrites the ones enqueue sets, and gives each job its own ``errors`` list)."""
    if not _template:
        job = Job(event_seq=1)
        _template.extend(getattr(job, f.attname) for f in _FIELDS)
    return list(_template)


def _create_many(
    operation: str,
    rows: list[dict[str, Any]],
    now: datetime,
    run_after: datetime | None,
    common: dict[str, Any],
) -> list[Job]:
    """One batch: existing unfinished jobs for its keys, then two bulk INSERTs.

    A peer may insert a job with one of the keys between the lookup and the
    INSERT; the partial unique index refuses the batch, the savepoint undoes
    it, and the lookup runs again (then finds the peer's job).
    """
    keys = {row["unique_key"] for row in rows if row["unique_key"] is not None}
    for _ in range(3):
        existing = _key_holders(sorted(keys)) if keys else {}
        fresh: list[Job] = []
        result: list[Job] = []
        repeats: list[int] = []  # positions of a key an earlier input of this batch created
        # One job built the usual way; the others copy its field values and go
        # through Model.__init__'s positional path (keywords cost ~5x as much).
        template = Job(
            operation=operation,
            next_attempt_at=run_after or now,
            created_at=now,
            updated_at=now,
            event_seq=1,
            **common,
        )
        values = [getattr(template, f.attname) for f in _FIELDS]
        for row in rows:
            key = row["unique_key"]
            if key is not None and key in existing:
                if existing[key].created:
                    repeats.append(len(result))
                result.append(existing[key])
                continue
            values[_INPUT], values[_KEY], values[_ERRORS] = row["input"], key, []
            job = _by_position(*values)
            job.created = True
            fresh.append(job)
            result.append(job)
            if key is not None:
                existing[key] = job  # a later input with this key gets this job
        try:
            with transaction.atomic(savepoint=bool(keys)):
                _insert_many(fresh, common, now)
        except IntegrityError:
            if not keys:
                raise
            continue
        for position in repeats:  # the same job, but not created for this input
            result[position] = copy.copy(result[position])
            result[position].created = False
        return result
    raise RuntimeError("could not enqueue: unique keys kept colliding")  # pragma: no cover


def _key_holders(keys: Sequence[str]) -> dict[str, Job]:
    """The unfinished job holding each of ``keys`` that one does, by key, each with
    ``created`` False: an index lookup on both databases (``Statements.key_holders``)."""
    sql, params = statements(connection).key_holders(keys)
    found: dict[str, Job] = {}
    for job in Job.objects.raw(sql, params):
        job.created = False
        found[str(job.unique_key)] = job
    return found


def _insert_many(jobs: list[Job], common: dict[str, Any], now: datetime) -> None:
    """Insert ``jobs`` and their ``enqueued`` events, setting each job's pk.

    Set-based: the inputs travel as one JSON array parameter and the database
    expands it (``jsonb_array_elements`` / ``json_each``); every other column
    is one shared value. PostgreSQL does jobs and events in one statement,
    SQLite in two. Ids are handed out in array order (an identity column /
    rowid filled by one ordered INSERT … SELECT), so the sorted ids map back
    onto the inputs.
    """
    if not jobs:
        return
    conn = connection
    template = jobs[0]
    values = [f.get_db_prep_save(f.pre_save(template, True), conn) for f in SHARED_FIELDS]
    payload = json.dumps([[job.input, job.unique_key] for job in jobs])
    facts = json.dumps({"owner": common["owner"], "queue": common["queue"]})
    created = conn.ops.adapt_datetimefield_value(now)
    with conn.cursor() as cursor:
        ids = statements(conn).insert_jobs(
            cursor, values=values, payload=payload, facts=facts, created=created
        )
    if len(ids) != len(jobs):  # pragma: no cover - the database broke its promise
        raise RuntimeError(f"inserted {len(ids)} jobs for {len(jobs)} inputs")
    for job, pk in zip(jobs, ids, strict=True):
        job.pk = pk
        job._state.adding = False


def _announce_enqueued(jobs: list[Job]) -> None:
    if not signals.job_state_changed.receivers:
        return
    for job in jobs:
        signals.send_now(
            signals.job_state_changed,
            job_id=job.pk,
            operation=job.operation,
            old_state="",
            new_state=job.state,
            kind="enqueued",
            message="",
            data={},
        )


# --- operator actions -------------------------------------------------------------

_EVENT_KIND = {
    (Action.PAUSE, JobState.PAUSED): "paused",
    (Action.RESUME, JobState.QUEUED): "resumed",
    (Action.RESUME, JobState.RUNNING): "resumed",
    (Action.CANCEL, JobState.CANCELLED): "cancelled",
    (Action.CANCEL, JobState.CANCELLING): "cancel_requested",
    (Action.RETRY, JobState.QUEUED): "retried",
    (Action.RETRY, JobState.RUNNING): "resumed",
    (Action.RETRY, None): "retried",
}


def _fields_for(decision: Decision, action: Action, actor: str, now: datetime) -> dict[str, Any]:
    fields: dict[str, Any] = {"updated_at": now}
    target = decision.new_state
    if target is not None:
        fields["state"] = target
    if decision.wake:
        fields["next_attempt_at"] = now
    if decision.reset_attempts:
        fields["attempts"] = 0
    if target in (JobState.QUEUED, JobState.CANCELLED):
        # Nobody works on it any more: drop a stale lease so fencing stays exact.
        fields.update(lease_owner=None, lease_expires_at=None)
    if target is JobState.QUEUED:
        fields.update(reason="", error_code="", finished_at=None)
    if target is JobState.RUNNING:
        # Resumed while its worker still holds it: "paused by …" is no longer true.
        fields.update(reason="", error_code="")
    if target is JobState.PAUSED:
        fields["reason"] = f"paused by {actor}" if actor else "paused by an operator"
    if target is JobState.CANCELLED:
        fields.update(
            finished_at=now,
            error_code="cancelled",
            reason=f"cancelled by {actor}" if actor else "cancelled",
        )
    return fields


def _apply_batch(action: Action, ids: Sequence[int], actor: str) -> list[Outcome]:
    now = timezone.now()
    outcomes: list[Outcome] = []
    with transaction.atomic():
        # "Is the lease live?" and "is it due?" are answered in SQL, on the clock
        # leases are written with: on PostgreSQL a web server whose clock runs
        # ahead would otherwise see a worker's live lease as expired (and, say,
        # requeue a paused job its worker is still running).
        jobs = list(Job.objects.select_for_update().filter(pk__in=ids).with_clock().order_by("pk"))
        groups: dict[tuple[JobState | None, bool, bool], list[Job]] = defaultdict(list)
        decisions: dict[int, Decision] = {}
        for job in jobs:
            decision = decide(
                action,
                job.state,
                lease_held=bool(job.lease_held),
                exhausted=job.attempts >= job.max_attempts,
                due=bool(job.due),
            )
            decisions[job.pk] = decision
            if decision.refused:
                outcomes.append(Outcome(job.pk, action, False, job.state, decision.refusal))
            elif not decision.applies:
                outcomes.append(Outcome(job.pk, action, False, job.state))
            else:
                groups[(decision.new_state, decision.wake, decision.reset_attempts)].append(job)
        events = []
        for group in groups.values():
            decision = decisions[group[0].pk]
            fields = _fields_for(decision, action, actor, now)
            Job.objects.filter(pk__in=[j.pk for j in group]).update(
                event_seq=F("event_seq") + 1, **fields
            )
            kind = _EVENT_KIND[(action, decision.new_state)]
            for job in group:
                old_state = job.state
                job.event_seq += 1
                for name, value in fields.items():
                    setattr(job, name, value)
                data: dict[str, Any] = {"actor": actor, "from": old_state, "to": job.state}
                if decision.reset_attempts:
                    data["attempts_reset"] = True
                events.append(
                    JobEvent(job_id=job.pk, seq=job.event_seq, kind=kind, data=data, created_at=now)
                )
                outcomes.append(Outcome(job.pk, action, True, job.state))
                announce_change(job, old_state, kind, "", data)
        JobEvent.objects.bulk_create(events)
    found = {job.pk for job in jobs}
    outcomes.extend(Outcome(i, action, False, "", "no such job") for i in ids if i not in found)
    return outcomes


def act(
    action: Action | str,
    job_ids: Iterable[int],
    *,
    actor: str = "",
    batch_size: int = BULK_BATCH_SIZE,
) -> list[Outcome]:
    """Apply an operator action to many jobs, one short transaction per batch.

    Batches keep each transaction (and, on SQLite, the write lock) short, so a
    bulk action over 100,000 jobs never stalls the workers for its duration.
    """
    action = Action(action)
    outcomes: list[Outcome] = []
    batch: list[int] = []
    for job_id in job_ids:
        batch.append(int(job_id))
        if len(batch) >= batch_size:
            outcomes.extend(_apply_batch(action, batch, actor))
            batch = []
    if batch:
        outcomes.extend(_apply_batch(action, batch, actor))
    return outcomes


def pause(job_id: int, *, actor: str = "") -> Outcome:
    return _apply_batch(Action.PAUSE, [job_id], actor)[0]


def resume(job_id: int, *, actor: str = "") -> Outcome:
    return _apply_batch(Action.RESUME, [job_id], actor)[0]


def cancel(job_id: int, *, actor: str = "") -> Outcome:
    return _apply_batch(Action.CANCEL, [job_id], actor)[0]


def retry_now(job_id: int, *, actor: str = "") -> Outcome:
    return _apply_batch(Action.RETRY, [job_id], actor)[0]


DISCARD = "discard"
NOT_FINISHED = "not finished: only completed, failed or cancelled jobs are discarded"


def discard(job_ids: Iterable[int], *, batch_size: int = BULK_BATCH_SIZE) -> list[Outcome]:
    """Delete finished jobs (with their events and unit results) now, as retention would.

    Never an unfinished job: the state is checked in the same DELETE, so a job that
    was retried a moment ago stays. One short transaction per batch.
    """
    ids = sorted({int(i) for i in job_ids})
    outcomes: list[Outcome] = []
    for start in range(0, len(ids), batch_size):
        batch = ids[start : start + batch_size]
        with transaction.atomic():
            states = dict(
                Job.objects.select_for_update().filter(pk__in=batch).values_list("id", "state")
            )
            finished = [i for i, state in states.items() if state in FINISHED_STATES]
            Job.objects.filter(pk__in=finished, state__in=FINISHED_STATES).delete()
        for job_id in batch:
            state = states.get(job_id)
            if state is None:
                outcomes.append(Outcome(job_id, DISCARD, False, "", "no such job"))
            elif state in FINISHED_STATES:
                outcomes.append(Outcome(job_id, DISCARD, True, "discarded"))
            else:
                outcomes.append(Outcome(job_id, DISCARD, False, state, NOT_FINISHED))
    if outcomes:
        log.info(
            "discarded",
            extra={"jobs": sum(o.applied for o in outcomes), "asked": len(outcomes)},
        )
    return outcomes
