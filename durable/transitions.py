"""The final transitions of a leased job: complete, settle, release, pause, fail.

Each locks the job under the lease it was claimed with (``(id, lease_owner,
lease_epoch)``: a reclaimed or cancelled job raises LeaseLost and is left
alone), has ``durable.endings`` decide what to write, writes it with its
event in the same transaction (``write``), and reports the state it left the
job in. A new transition is a pure function in ``durable.endings`` (with its
table test) and a few lines here. Claiming, renewing and the unit commits are
``durable.lease``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from .endings import (
    FREE,
    Ending,
    Lease,
    LetGo,
    Write,
    completed,
    failed,
    folded_turn_away,
    paused_unavailable,
    released,
    settled,
)
from .errors import LeaseLost
from .jobs import add_events, announce_change, log_state, needs_attention
from .models import Job, JobEvent
from .states import JobState


def write(job: Job, ending: Ending, now: datetime) -> str:
    """Write a decided ending to ``job``, whose row the caller holds locked; announce it.

    Returns the state it leaves the job in. A ``Write``'s fields and event
    commit together (the event numbered after the job's last); a ``LetGo``
    only drops the lease; None writes nothing.
    """
    if ending is None:
        return job.state
    if isinstance(ending, LetGo):
        Job.objects.filter(pk=job.pk).update(updated_at=now, **FREE)
        if ending.logged:
            log_state(job, "lease_released", reason=job.state)
        return job.state
    old_state = job.state
    for name, value in ending.fields.items():
        setattr(job, name, value)
    job.updated_at = now
    add_events(job, [ending.event], now)
    job.save(update_fields=[*ending.fields, "updated_at", "event_seq"])
    announce_change(job, old_state, *ending.event)
    return job.state


def attend(job: Job, ending: Ending) -> None:
    """After ``write``: announce (on commit) that the job needs a person, if it does."""
    if isinstance(ending, Write) and ending.attention is not None:
        needs_attention(job, ending.attention, job.reason)


def _locked(lease: Lease) -> Job:
    job: Job | None = (
        Job.objects.select_for_update()
        .filter(pk=lease.job_id, lease_owner=lease.owner, lease_epoch=lease.epoch)
        .first()
    )
    if job is None:
        raise LeaseLost(f"job {lease.job_id}: lease epoch {lease.epoch} lost")
    return job


def _end(lease: Lease, decide: Callable[[Job, datetime], Ending]) -> str:
    """Lock the leased job, decide its ending, write it: one transaction."""
    now = timezone.now()
    with transaction.atomic():
        job = _locked(lease)
        ending = decide(job, now)
        state = write(job, ending, now)
        attend(job, ending)
        return state


def complete(lease: Lease) -> str:
    """All units done: completed — or cancelled, or left paused (``endings.completed``)."""
    return _end(lease, completed)


def settle(lease: Lease) -> str:
    """At a unit boundary after an operator paused or cancelled: let go of the job.

    Returns the state the job is left in; "running" means it was resumed
    meanwhile and the worker should carry on.
    """
    return _end(lease, settled)


def release(lease: Lease, why: str = "worker shutting down") -> str:
    """Graceful stop at a unit boundary: hand the job back at once, no attempt spent."""
    return _end(lease, lambda job, now: released(job, now, owner=lease.owner, why=why))


def pause_unavailable(lease: Lease, reason: str) -> None:
    """A credential or storage is missing: paused with the operator's to-do, no attempt spent."""
    _end(lease, lambda job, now: paused_unavailable(job, now, reason=reason))


def record_failure(
    lease: Lease,
    entry: dict[str, Any],
    *,
    retry_at: datetime | None,
    consume_attempt: bool = True,
    on_exhausted: str = JobState.FAILED,
    coalesce: bool = False,
) -> str:
    """A unit failed. ``retry_at`` None means non-retryable: fail now (``endings.failed``).

    The retry time and the attempt count are committed *before* the lease is
    released, so a restart during the backoff neither resets the wait nor
    retries early. ``coalesce``: the lease committed no unit, so a repeated
    turn-away may be folded into the previous one's event. Returns the
    resulting state.
    """
    now = timezone.now()
    with transaction.atomic():
        job = _locked(lease)
        ending = failed(
            job,
            entry,
            now,
            retry_at=retry_at,
            consume_attempt=consume_attempt,
            on_exhausted=on_exhausted,
            coalesce=coalesce,
        )
        if _fold_turn_away(job, lease, ending, entry, retry_at, now):
            return job.state
        state = write(job, ending, now)
        attend(job, ending)
        return state


def _fold_turn_away(
    job: Job,
    lease: Lease,
    ending: Ending,
    entry: dict[str, Any],
    retry_at: datetime | None,
    now: datetime,
) -> bool:
    """Write a repeated turn-away into the previous one's event, if ``ending`` may fold
    and it does (``endings.folded_turn_away``): this claim's ``started`` event is
    withdrawn, the job takes ``ending``'s fields, and no event is added."""
    if not (isinstance(ending, Write) and ending.fold and retry_at is not None):
        return False
    newest = {
        event.seq: event
        for event in JobEvent.objects.filter(job_id=job.pk, seq__gte=job.event_seq - 1)
    }
    started, previous = newest.get(job.event_seq), newest.get(job.event_seq - 1)
    event = folded_turn_away(
        started, previous, epoch=lease.epoch, entry=entry, retry_at=retry_at, now=now
    )
    if event is None or started is None or previous is None:
        return False
    started.delete()
    previous.message, previous.data = event.message, event.data
    previous.save(update_fields=["message", "data"])
    old_state = job.state
    for name, value in ending.fields.items():
        setattr(job, name, value)
    job.updated_at = now
    job.event_seq -= 1  # the withdrawn started event's seq is the next event's
    job.save(update_fields=[*ending.fields, "updated_at", "event_seq"])
    announce_change(job, old_state, "rescheduled", entry["message"], previous.data)
    return True
