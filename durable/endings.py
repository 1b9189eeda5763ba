"""How a lease ends, decided: the fields a transition writes and the event it records.

Pure functions, as ``durable.states.decide`` is for the operator actions: the
caller locks the job, passes in what it observed (and ``now``), and writes
what comes back in one short locked statement (``durable.transitions.write``).
Nothing here touches the database or reads the clock; the table tests in
``tests/unit/test_endings.py`` go through every branch.

An ending is one of three things: a ``Write`` (new field values and the event
that records them), a ``LetGo`` (only the lease goes: a paused job, or one
whose state someone else changed) or None (nothing to write).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol, TypeAlias

from .policy import (
    MAX_ERROR_MESSAGE_BYTES,
    append_bounded,
    deaths_without_progress,
    truncate_utf8,
)
from .states import JobState, RestartOutcome, on_restart, worker_lost_spends_attempt

FINISH_CANCEL_MESSAGE = "stopped at a unit boundary"  # the cancelled event at a boundary
MAX_TURN_AWAY_REASONS = 4  # distinct reasons a coalesced "rescheduled" event lists
# Nobody holds the job any more: fencing stays exact only while a free job has no owner.
FREE: Mapping[str, None] = {"lease_owner": None, "lease_expires_at": None}


@dataclass(frozen=True)
class Lease:
    """The lease a worker holds on a job: the fencing token every write of the job is
    conditioned on. A reclaim or a cancel moves the epoch on, and the old holder's
    writes match nothing."""

    job_id: int
    owner: str
    epoch: int


class Event(NamedTuple):
    """A job event to record: its kind, message and data."""

    kind: str
    message: str
    data: dict[str, Any]


class HeldJob(Protocol):
    """What the decisions read of the locked job: a ``Job``, or any object with these."""

    @property
    def state(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def errors(self) -> Any: ...  # the JSON list of failure entries (None when unset)
    @property
    def units_done(self) -> int: ...
    @property
    def units_at_claim(self) -> int | None: ...
    @property
    def reclaims(self) -> int: ...
    @property
    def on_restart(self) -> str: ...
    @property
    def lease_owner(self) -> str | None: ...
    @property
    def checkpoint(self) -> Any: ...  # the operation's own JSON


@dataclass(frozen=True)
class Write:
    """Write ``fields`` (and ``updated_at``) and record ``event``, in one transaction."""

    fields: dict[str, Any]
    event: Event
    # Announce that the job stopped and needs a person, with this cause (its reason
    # is the job's, once written).
    attention: str | None = None
    # A turn-away the caller may fold into the previous one's event (record_failure's
    # ``coalesce``); see ``folded_turn_away``.
    fold: bool = False


@dataclass(frozen=True)
class LetGo:
    """Only the lease goes (and ``updated_at`` moves); no event is recorded."""

    logged: bool = False  # log "lease_released" (a paused job let go of at a boundary)


Ending: TypeAlias = Write | LetGo | None


# --- at a unit boundary ----------------------------------------------------------------


def cancelled(job: HeldJob, now: datetime, extra: Mapping[str, Any] | None = None) -> Write:
    """The cancel an operator asked for is done; ``extra`` fields are written with it
    (a failure's attempt and error, which stay on record)."""
    return Write(
        {
            "state": JobState.CANCELLED,
            "finished_at": now,
            "error_code": "cancelled",
            "reason": job.reason or "cancelled",
            **(extra or {}),
            **FREE,
        },
        Event("cancelled", FINISH_CANCEL_MESSAGE, {}),
    )


def completed(job: HeldJob, now: datetime) -> Ending:
    """All units done. A cancel accepted meanwhile wins: the job ends cancelled.

    A pause accepted meanwhile is honoured too: the job stays paused (lease
    released) and completes once resumed — an operator who paused it must not
    find it finished behind their back.
    """
    if job.state == JobState.CANCELLING:
        return cancelled(job, now)
    if job.state == JobState.PAUSED:
        return LetGo(logged=True)
    return Write(
        {
            "state": JobState.COMPLETED,
            "finished_at": now,
            "reason": "",
            "error_code": "",
            **FREE,
        },
        Event("completed", "", {"units_done": job.units_done}),
    )


def settled(job: HeldJob, now: datetime) -> Ending:
    """At a unit boundary after an operator paused or cancelled: let go of the job.

    Nothing to write when it was resumed meanwhile (running): the worker carries on.
    """
    if job.state == JobState.CANCELLING:
        return cancelled(job, now)
    if job.state == JobState.PAUSED:
        return LetGo(logged=True)
    return None


def released(job: HeldJob, now: datetime, *, owner: str, why: str) -> Ending:
    """Graceful stop at a unit boundary: the job back in the queue at once, no attempt spent."""
    if job.state == JobState.RUNNING:
        return Write(
            {"state": JobState.QUEUED, "next_attempt_at": now, **FREE},
            Event("released", why, {"worker": owner}),
        )
    if job.state == JobState.CANCELLING:
        return cancelled(job, now)
    return LetGo()


def paused_unavailable(job: HeldJob, now: datetime, *, reason: str) -> Write:
    """A credential or storage is missing: paused with the operator's to-do, no attempt spent."""
    if job.state == JobState.CANCELLING:
        return cancelled(job, now)
    return Write(
        {"state": JobState.PAUSED, "reason": reason, "error_code": "unavailable", **FREE},
        Event("paused", reason, {"cause": "unavailable"}),
        attention="unavailable",
    )


# --- a failed unit ------------------------------------------------------------------------


def failed(
    job: HeldJob,
    entry: dict[str, Any],
    now: datetime,
    *,
    retry_at: datetime | None,
    consume_attempt: bool = True,
    on_exhausted: str = JobState.FAILED,
    coalesce: bool = False,
) -> Ending:
    """A unit failed with ``entry`` (its error class, message, …); ``retry_at`` None
    means non-retryable: fail now.

    The retry time and the attempt count are written *with* the lease's release,
    so a restart during the backoff neither resets the wait nor retries early.
    ``consume_attempt`` False with a ``retry_at``: a gate of ours said "not yet"
    (a turn-away); nothing was tried, nothing is charged.
    """
    if not consume_attempt and retry_at is not None:
        if job.state == JobState.CANCELLING:
            return cancelled(job, now)
        if job.state == JobState.PAUSED:
            return LetGo()
        return Write(
            {"state": JobState.QUEUED, "next_attempt_at": retry_at, **FREE},
            Event(
                "rescheduled",
                entry["message"],
                {"next_attempt_at": retry_at.isoformat(), "turn_aways": 1},
            ),
            fold=coalesce,
        )
    attempts = job.attempts + 1
    common = {
        "attempts": attempts,
        "errors": append_bounded(job.errors, entry),
        "last_error_class": entry["error_class"][:200],
        **FREE,
    }
    message = entry["message"]
    facts = {"error_class": entry["error_class"], "attempt": attempts}
    if job.state == JobState.CANCELLING:
        return cancelled(job, now, common)  # the failed attempt stays on record
    if retry_at is None:
        reason = f"failed permanently: {message}"
        return Write(
            {
                "state": JobState.FAILED,
                "finished_at": now,
                "reason": reason,
                "error_code": "non_retryable",
                **common,
            },
            Event("failed", reason, facts),
            attention="non_retryable",
        )
    if attempts >= job.max_attempts:
        target = JobState(on_exhausted)
        reason = f"gave up after {attempts} attempts; last error: {message}"
        finished = {"finished_at": now} if target == JobState.FAILED else {}
        return Write(
            {"state": target, "reason": reason, "error_code": "exhausted", **common, **finished},
            Event(target.value, reason, facts),
            attention="exhausted",
        )
    if job.state == JobState.PAUSED:
        return Write(common, Event("failed_attempt", message, facts))  # stays paused
    return Write(
        {"state": JobState.QUEUED, "next_attempt_at": retry_at, **common},
        Event("retry_scheduled", message, {**facts, "next_attempt_at": retry_at.isoformat()}),
    )


class SeenEvent(Protocol):
    """What the turn-away fold reads of a recorded event (a ``JobEvent``)."""

    @property
    def kind(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def data(self) -> Any: ...  # the event's JSON object


def folded_turn_away(
    newest: SeenEvent | None,
    previous: SeenEvent | None,
    *,
    epoch: int,
    entry: Mapping[str, Any],
    retry_at: datetime,
    now: datetime,
) -> Event | None:
    """A repeated turn-away folded into the previous one's ``rescheduled`` event: that
    event as it becomes, or None when there is nothing to fold into.

    Applies when this lease did nothing but be turned away again: the ``newest``
    event is this claim's ``started`` (of lease ``epoch``) and the one before it
    the previous turn-away. The caller then withdraws that ``started`` (its seq is
    reused by the next event) and rewrites the previous one, which counts one more
    (``turn_aways``, ``last_message``, ``last_at``; its message lists the first
    few distinct reasons) — so a backlog waiting behind a gate keeps two events per
    job instead of two per try.
    """
    if not (
        newest is not None
        and newest.kind == "started"
        and newest.data.get("epoch") == epoch
        and previous is not None
        and previous.kind == "rescheduled"
    ):
        return None
    reason = truncate_utf8(entry["message"], MAX_ERROR_MESSAGE_BYTES)
    reasons = list(previous.data.get("reasons") or [previous.message])
    if reason not in reasons and len(reasons) < MAX_TURN_AWAY_REASONS:
        reasons.append(reason)
    data = {
        **previous.data,
        "next_attempt_at": retry_at.isoformat(),
        "turn_aways": int(previous.data.get("turn_aways", 1)) + 1,
        "reasons": reasons,
        "last_message": reason,
        "last_at": now.isoformat(),
    }
    return Event("rescheduled", truncate_utf8(" | ".join(reasons), MAX_ERROR_MESSAGE_BYTES), data)


# --- a worker that stopped ------------------------------------------------------------------


@dataclass(frozen=True)
class Reclaim:
    """What restart recovery does to a job whose worker stopped (``reclaimed``)."""

    outcome: RestartOutcome
    ending: Write | LetGo
    drop_results: bool = False  # on_restart=retry starts over: its unit results go
    # What the ``job_reclaimed`` signal reports besides the job: False when the lost
    # lease had committed units (no attempt spent), None for a cancel finished for it.
    facts: Mapping[str, Any] = field(default_factory=dict)


def _lost_message(previous: str | None, units_committed: int | None, spent: bool) -> str:
    if units_committed is None:
        lost = f"worker {previous} stopped while running this job"
    elif spent and units_committed == 0:
        lost = f"worker {previous} stopped while running this job, before committing a unit"
    else:
        lost = (
            f"worker {previous} stopped while running this job, after committing "
            f"{units_committed} unit(s)"
        )
    if not spent:
        lost += "; it made progress, so no attempt is spent"
    return lost


@dataclass(frozen=True)
class _Loss:
    """A lost worker's death, on the job's record: whether it spent an attempt."""

    spent: bool
    units_committed: int | None  # since the claim; None: claimed by an older release
    attempts: int  # the job's failed attempts, this death counted if it spent one
    errors: list[Any]  # the error history, with the WorkerLost entry appended


def _loss(job: HeldJob, outcome: RestartOutcome, now: datetime) -> _Loss:
    units_committed = None if job.units_at_claim is None else job.units_done - job.units_at_claim
    spent = worker_lost_spends_attempt(
        outcome, units_at_claim=job.units_at_claim, units_done=job.units_done
    )
    entry = {
        "at": now.isoformat(),
        "attempt": job.attempts + 1,  # the attempt it was on, as for any failure
        "error_class": "WorkerLost",
        "message": _lost_message(job.lease_owner, units_committed, spent),
        "retryable": outcome is not RestartOutcome.FAIL,
        "traceback": "",
        "attempt_spent": spent,
        "units_committed": units_committed,
    }
    attempts = job.attempts + 1 if spent else job.attempts
    return _Loss(spent, units_committed, attempts, append_bounded(job.errors, entry))


def _crashes_its_worker(errors: list[Any], attempts: int, checkpoint: Any) -> str:
    """Why a job whose worker kept dying stops: it may be what kills it."""
    deaths = deaths_without_progress(errors, attempts)
    times = "once" if deaths == 1 else f"{deaths} times"
    also = "" if deaths == attempts else f"; {attempts} failed attempts in all"
    return (
        f"its worker stopped {times} without committing a unit "
        f"(checkpoint {checkpoint!r}{also}); it may be what crashes the worker"
    )


def reclaimed(
    job: HeldJob,
    now: datetime,
    *,
    epoch: int,
    by: str,
    on_exhausted: str = JobState.FAILED,
    delay: float = 0.0,
) -> Reclaim:
    """The restart policy applied to a job whose worker stopped (lease ``epoch``).

    ``by``: the worker taking it back; ``on_exhausted``: the operation's (failed
    when the operation is no longer registered); ``delay``: seconds until it is
    due again (``policy.reclaim_delay``, which spreads a crashed fleet's jobs).
    A lost worker spends an attempt only if its lease committed no unit
    (``states.worker_lost_spends_attempt``); its death is on record either way.
    """
    previous = job.lease_owner
    outcome = on_restart(job.state, job.on_restart)
    if outcome is RestartOutcome.RELEASE:
        return Reclaim(outcome, LetGo())  # paused stays paused; the stale lease goes
    data: dict[str, Any] = {
        "previous_worker": previous,
        "epoch": epoch,
        "policy": job.on_restart,
        "by": by,
    }
    if outcome is RestartOutcome.CANCEL:
        fields = {"state": JobState.CANCELLED, "finished_at": now, "error_code": "cancelled"}
        message = "its worker stopped before finishing the cancel"
        return Reclaim(outcome, Write({**FREE, **fields}, Event("cancelled", message, data)))
    loss = _loss(job, outcome, now)
    data.update(attempt_spent=loss.spent, units_committed=loss.units_committed)
    facts = {"attempt_spent": loss.spent, "units_committed": loss.units_committed}
    common = {
        **FREE,
        "attempts": loss.attempts,
        "reclaims": job.reclaims + 1,
        "errors": loss.errors,
        "last_error_class": "WorkerLost",
    }
    if outcome is RestartOutcome.FAIL:
        reason = "its worker stopped while it ran and its on_restart policy is 'fail'"
        fields = {"state": JobState.FAILED, "finished_at": now, "error_code": "server_restarted"}
        ending = Write(
            {**common, **fields, "reason": reason},
            Event("failed", reason, data),
            attention="server_restarted",
        )
        return Reclaim(outcome, ending, facts=facts)
    if loss.spent and loss.attempts >= job.max_attempts:
        target = JobState(on_exhausted)
        reason = _crashes_its_worker(loss.errors, loss.attempts, job.checkpoint)
        fields = {
            "state": target,
            "error_code": "exhausted",
            "reason": reason,
            "finished_at": now if target == JobState.FAILED else None,
        }
        stopped = target in (JobState.FAILED, JobState.PAUSED)
        ending = Write(
            {**common, **fields},
            Event(target.value, reason, data),
            attention="exhausted" if stopped else None,
        )
        return Reclaim(outcome, ending, facts=facts)
    fields = {"state": JobState.QUEUED, "next_attempt_at": now + timedelta(seconds=delay)}
    from_start = outcome is RestartOutcome.REQUEUE_FROM_START
    if from_start:
        fields.update(checkpoint=None, units_done=0)
        data["from_start"] = True
    message = f"taken back from {previous}"
    if not loss.spent:
        message += f" after {loss.units_committed} committed unit(s); no attempt spent"
    ending = Write({**common, **fields}, Event("reclaimed", message, data))
    return Reclaim(outcome, ending, drop_results=from_start, facts=facts)


# --- the last unit's commit ------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """The last unit's commit ended the job: the state it left and the event of the end."""

    old_state: JobState
    event: Event


def finished(state: str, units_done: int) -> Finished | None:
    """The event of the state the last unit's commit left the job in (see ``completed``).

    ``completed`` (from running) or ``cancelled`` (a cancel accepted meanwhile
    wins); None when the job stays as it was (paused: its lease is released and
    it completes once resumed). The commit decides the state in SQL, under the
    row's lock (``durable.sql``); PostgreSQL's one statement also words this
    table in SQL, SQLite's commit writes what this returns.
    """
    if state == JobState.COMPLETED:
        return Finished(JobState.RUNNING, Event("completed", "", {"units_done": units_done}))
    if state == JobState.CANCELLED:
        return Finished(JobState.CANCELLING, Event("cancelled", FINISH_CANCEL_MESSAGE, {}))
    return None
