"""The final transitions of a leased job: complete, settle, release, pause, fail.

Each is one function that locks the job under the lease it was claimed with
(``(id, lease_owner, lease_epoch)``: a reclaimed or cancelled job raises
LeaseLost and is left alone), writes the new state and its event in the same
transaction, and reports the state it left the job in. Claiming, renewing and
the unit commits are ``durable.lease``'s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from .endings import FINISH_CANCEL_MESSAGE, Lease
from .errors import LeaseLost
from .jobs import add_events, announce_change, log_state, needs_attention
from .models import Job, JobEvent
from .policy import MAX_ERROR_MESSAGE_BYTES, append_bounded, truncate_utf8
from .states import JobState

MAX_TURN_AWAY_REASONS = 4  # distinct reasons a coalesced "rescheduled" event lists


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
