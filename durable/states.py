"""Job states and every decision about moving between them, as pure functions.

Nothing here touches the database or reads the clock: callers pass in what
they observed and apply what comes back in one conditional update.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    CANCELLING = "cancelling", "Cancelling"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"
    COMPLETED = "completed", "Completed"


class OnRestart(models.TextChoices):
    FAIL = "fail", "Fail"
    RETRY = "retry", "Retry from the start"
    RESUME = "resume", "Resume from the checkpoint"


FINISHED_STATES = frozenset({JobState.CANCELLED, JobState.FAILED, JobState.COMPLETED})
UNFINISHED_STATES = frozenset(set(JobState) - FINISHED_STATES)
# States in which a worker may hold a lease; its writes are fenced by epoch.
LEASED_STATES = frozenset({JobState.RUNNING, JobState.PAUSED, JobState.CANCELLING})


class Action(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    RETRY = "retry"


@dataclass(frozen=True)
class Decision:
    """What an operator action does to a job in a given state.

    ``new_state`` None with ``refusal`` None means "already there": the action is
    acknowledged and nothing changes, so a double click is harmless.
    """

    new_state: JobState | None = None
    refusal: str | None = None
    reset_attempts: bool = False
    wake: bool = False  # make the job due now

    @property
    def applies(self) -> bool:
        return self.new_state is not None or self.wake

    @property
    def refused(self) -> bool:
        return self.refusal is not None


def decide(
    action: Action, state: str, *, lease_held: bool, exhausted: bool = False, due: bool = False
) -> Decision:
    """The operator action table.

    ``lease_held``: a live worker still holds the job (it finishes its current
    unit before it notices); ``exhausted``: attempts reached max_attempts;
    ``due``: a queued job's next attempt time has come (nothing left to skip).
    """
    state = JobState(state)
    if action is Action.PAUSE:
        if state in (JobState.QUEUED, JobState.RUNNING):
            # A running job keeps its lease: the worker commits the unit it is on,
            # sees "paused" and releases the lease at that boundary.
            return Decision(JobState.PAUSED)
        if state is JobState.PAUSED:
            return Decision()
        return Decision(refusal=f"a {state.label.lower()} job cannot be paused")
    if action is Action.RESUME:
        if state is JobState.PAUSED:
            target = JobState.RUNNING if lease_held else JobState.QUEUED
            return Decision(target, reset_attempts=exhausted, wake=not lease_held)
        if state in (JobState.QUEUED, JobState.RUNNING):
            return Decision()
        return Decision(refusal=f"a {state.label.lower()} job cannot be resumed")
    if action is Action.CANCEL:
        if state is JobState.QUEUED or (state is JobState.PAUSED and not lease_held):
            return Decision(JobState.CANCELLED)
        if state in (JobState.RUNNING, JobState.PAUSED):
            # The worker stops at its next unit boundary and records "cancelled".
            return Decision(JobState.CANCELLING)
        if state in (JobState.CANCELLING, JobState.CANCELLED):
            return Decision()
        return Decision(refusal=f"a {state.label.lower()} job cannot be cancelled")
    if action is Action.RETRY:
        if state is JobState.FAILED:
            return Decision(JobState.QUEUED, reset_attempts=True, wake=True)
        if state is JobState.PAUSED:
            if lease_held:
                return Decision(JobState.RUNNING)
            return Decision(JobState.QUEUED, reset_attempts=exhausted, wake=True)
        if state is JobState.QUEUED:
            # Skip the remaining backoff; already due, there is none (a double click).
            return Decision() if due else Decision(wake=True)
        if state is JobState.RUNNING:
            return Decision()
        return Decision(refusal=f"a {state.label.lower()} job cannot be retried")
    raise ValueError(f"unknown action {action!r}")  # pragma: no cover - enum is closed


class RestartOutcome(StrEnum):
    KEEP = "keep"  # nothing to do
    FAIL = "fail"  # failed with error code server_restarted
    REQUEUE_FROM_START = "requeue_from_start"  # checkpoint and unit results dropped
    RESUME = "resume"  # claimable again, continues from its checkpoint
    CANCEL = "cancel"  # a cancel was accepted; finish it
    RELEASE = "release"  # paused job whose worker died: just drop the stale lease


def on_restart(state: str, policy: str) -> RestartOutcome:
    """The restart table for a job left unfinished by a stopped worker
    (docs/explanation/leases-and-units.md, "After a restart: the restart policy").

    | found      | fail   | retry                | resume                  |
    | queued     | failed | queued               | queued                  |
    | running    | failed | queued, from start   | running, from checkpoint|
    | cancelling | cancelled (any policy)                                 |
    """
    state, policy = JobState(state), OnRestart(policy)
    if state is JobState.CANCELLING:
        return RestartOutcome.CANCEL
    if state is JobState.QUEUED:
        return RestartOutcome.FAIL if policy is OnRestart.FAIL else RestartOutcome.KEEP
    if state is JobState.RUNNING:
        return {
            OnRestart.FAIL: RestartOutcome.FAIL,
            OnRestart.RETRY: RestartOutcome.REQUEUE_FROM_START,
            OnRestart.RESUME: RestartOutcome.RESUME,
        }[policy]
    if state is JobState.PAUSED:
        return RestartOutcome.RELEASE
    return RestartOutcome.KEEP


def worker_lost_spends_attempt(
    outcome: RestartOutcome, *, units_at_claim: int | None, units_done: int
) -> bool:
    """Whether a job's lost worker counts as a failed attempt (``WorkerLost``).

    Only a lease that committed no unit since its claim spends one: a job that
    crashes its worker at the same unit again and again still stops after
    ``max_attempts``, while one that moves on between deaths (a deploy, the OOM
    killer, a lost node during a long import) is never failed by them — each
    such death is preceded by at least one newly committed unit, so there can
    be no more of them than the job has units. ``retry`` starts over from
    nothing, so its progress does not survive the death and always counts, as
    does ``fail``. ``units_at_claim`` None: claimed by a release that did not
    record it; counted, as that release did.
    """
    if outcome is not RestartOutcome.RESUME or units_at_claim is None:
        return True
    return units_done <= units_at_claim
