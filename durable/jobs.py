"""Enqueue and the operator actions (pause, resume, cancel, retry), one function each.

Each action locks the rows it touches, decides with the pure table in
``durable.states``, writes the new state and its event in the same
transaction, and reports per job whether it applied. The dashboard, the API
and the management commands all call these; nothing else changes ``state``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from . import signals
from .errors import InputRejected
from .models import Job, JobEvent
from .operations import Operation, get_operation, max_input_bytes
from .policy import MAX_ERROR_MESSAGE_BYTES, truncate_utf8
from .sanitize import clean_input
from .states import FINISHED_STATES, Action, Decision, JobState, OnRestart, decide

log = logging.getLogger("durable.jobs")

BULK_BATCH_SIZE = 500


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


def add_events(job: Job, events: Sequence[tuple[str, str, dict]], now: datetime) -> list[JobEvent]:
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


def log_state(job: Job, kind: str, **extra: Any) -> None:
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


def announce_change(job: Job, old_state: str, kind: str, message: str, data: dict) -> None:
    log_state(job, kind, previous=old_state)
    signals.send_on_commit(
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
    data = clean_input(data, max_bytes=max_input_bytes())
    data = op.clean_input(data)
    return clean_input(data, max_bytes=max_input_bytes())


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
    """
    op = get_operation(operation)
    data = clean_job_input(op, input)
    policy = OnRestart(on_restart or op.on_restart)
    prio = op.priority if priority is None else int(priority)
    if not -100 <= prio <= 100:
        raise InputRejected("priority", "must be between -100 and 100")
    now = timezone.now()
    if unique_key is None:
        unique_key = op.unique_key(data)
    if unique_key is not None and not 0 < len(unique_key) <= 255:
        raise InputRejected("unique_key", "must be 1 to 255 characters")
    for _ in range(3):
        try:
            return _create(
                op.name,
                data,
                now=now,
                owner=owner,
                tenant=tenant,
                queue=queue or op.queue,
                priority=prio,
                on_restart=policy,
                max_attempts=max(1, int(max_attempts or op.max_attempts)),
                run_after=run_after,
                unique_key=unique_key,
            )
        except IntegrityError:
            if unique_key is None:
                raise  # not a unique-key race: some other constraint refused the row
            existing = Job.objects.unfinished().filter(unique_key=unique_key).first()
            if existing is not None:
                existing.created = False
                return existing
            # The other job finished between our insert and this read: try again.
    raise RuntimeError(f"could not enqueue with unique_key {unique_key!r}")  # pragma: no cover


def _create(
    operation: str, data: dict, *, now: datetime, run_after: datetime | None, **fields: Any
) -> Job:
    with transaction.atomic():
        job = Job.objects.create(
            operation=operation,
            input=data,
            next_attempt_at=run_after or now,
            created_at=now,
            updated_at=now,
            **fields,
        )
        add_events(job, [("enqueued", "", {"owner": job.owner, "queue": job.queue})], now)
        Job.objects.filter(pk=job.pk).update(event_seq=job.event_seq)
        announce_change(job, "", "enqueued", "", {})
    job.created = True
    return job


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
        groups: dict[tuple, list[Job]] = defaultdict(list)
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
                data = {"actor": actor, "from": old_state, "to": job.state}
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
