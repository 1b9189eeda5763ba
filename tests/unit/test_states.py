"""The operator-action table and the restart table, row by row."""

import pytest

from durable.states import (
    Action,
    JobState,
    RestartOutcome,
    decide,
    on_restart,
    worker_lost_spends_attempt,
)

Q, R, P, CG, CD, F, C = (
    JobState.QUEUED,
    JobState.RUNNING,
    JobState.PAUSED,
    JobState.CANCELLING,
    JobState.CANCELLED,
    JobState.FAILED,
    JobState.COMPLETED,
)


@pytest.mark.parametrize(
    ("action", "state", "lease_held", "expected", "refused"),
    [
        (Action.PAUSE, Q, False, P, False),  # not started yet: paused at once
        (Action.PAUSE, R, True, P, False),  # worker keeps its lease until the unit boundary
        (Action.PAUSE, P, False, None, False),  # double click: nothing changes
        (Action.PAUSE, C, False, None, True),  # finished jobs cannot be paused
        (Action.PAUSE, CG, True, None, True),  # a cancel was accepted; pause would undo it
        (Action.RESUME, P, False, Q, False),  # nobody holds it: back in the queue
        (Action.RESUME, P, True, R, False),  # the worker is still on its unit: it carries on
        (Action.RESUME, Q, False, None, False),  # already going
        (Action.RESUME, CD, False, None, True),
        (Action.CANCEL, Q, False, CD, False),  # nobody runs it: cancelled at once
        (Action.CANCEL, P, False, CD, False),
        (Action.CANCEL, R, True, CG, False),  # the worker acknowledges at a unit boundary
        (Action.CANCEL, P, True, CG, False),  # paused, but the worker has not let go yet
        (Action.CANCEL, CG, True, None, False),  # double click
        (Action.CANCEL, CD, False, None, False),
        (Action.CANCEL, C, False, None, True),  # completed stays completed
        (Action.CANCEL, F, False, None, True),
        (Action.RETRY, F, False, Q, False),
        (Action.RETRY, P, False, Q, False),
        (Action.RETRY, Q, False, None, False),  # only wakes it (skips the backoff)
        (Action.RETRY, R, True, None, False),  # already running
        (Action.RETRY, C, False, None, True),
        (Action.RETRY, CD, False, None, True),
    ],
)
def test_decide__action_table(action, state, lease_held, expected, refused):
    decision = decide(action, state, lease_held=lease_held)
    assert decision.new_state == expected
    assert decision.refused is refused


def test_decide__retry_of_failed_job_resets_attempts_and_wakes_it():
    decision = decide(Action.RETRY, F, lease_held=False)
    assert decision.reset_attempts
    assert decision.wake


def test_decide__retry_of_queued_job_only_wakes_it():
    decision = decide(Action.RETRY, Q, lease_held=False)
    assert decision.applies
    assert decision.wake
    assert decision.new_state is None


@pytest.mark.parametrize(
    ("due", "applies"),
    [
        (False, True),  # waiting out a backoff: "retry now" makes it due now
        (True, False),  # already due (or a double click): already so, no second event
    ],
)
def test_decide__retry_of_a_queued_job_wakes_it_only_if_it_is_waiting(due, applies):
    decision = decide(Action.RETRY, Q, lease_held=False, due=due)
    assert decision.applies is applies
    assert decision.new_state is None
    assert not decision.refused


def test_decide__resume_of_exhausted_pause_restores_the_attempt_budget():
    assert decide(Action.RESUME, P, lease_held=False, exhausted=True).reset_attempts
    assert not decide(Action.RESUME, P, lease_held=False, exhausted=False).reset_attempts


def test_decide__refusal_says_why():
    assert (
        decide(Action.CANCEL, C, lease_held=False).refusal == "a completed job cannot be cancelled"
    )


@pytest.mark.parametrize(
    ("state", "policy", "expected"),
    [
        (Q, "fail", RestartOutcome.FAIL),
        (Q, "retry", RestartOutcome.KEEP),
        (Q, "resume", RestartOutcome.KEEP),
        (R, "fail", RestartOutcome.FAIL),
        (R, "retry", RestartOutcome.REQUEUE_FROM_START),
        (R, "resume", RestartOutcome.RESUME),
        (CG, "fail", RestartOutcome.CANCEL),
        (CG, "retry", RestartOutcome.CANCEL),
        (CG, "resume", RestartOutcome.CANCEL),
        (P, "resume", RestartOutcome.RELEASE),  # paused stays paused; the stale lease goes
        (C, "fail", RestartOutcome.KEEP),  # finished jobs are never touched
        (F, "retry", RestartOutcome.KEEP),
    ],
)
def test_on_restart__spec_table(state, policy, expected):
    assert on_restart(state, policy) is expected


@pytest.mark.parametrize(
    ("outcome", "units_at_claim", "units_done", "spent"),
    [
        (RestartOutcome.RESUME, 7, 7, True),  # died before committing a unit: a failed attempt
        (RestartOutcome.RESUME, 0, 0, True),  # died at its very first unit
        (RestartOutcome.RESUME, 7, 8, False),  # one unit committed since the claim: progress
        (RestartOutcome.RESUME, 0, 5000, False),  # a long import killed mid-way
        (RestartOutcome.RESUME, None, 9, True),  # claimed by a release that did not record it
        (RestartOutcome.REQUEUE_FROM_START, 0, 5, True),  # retry drops the progress it made
        (RestartOutcome.FAIL, 0, 5, True),  # fails anyway; the death is its last attempt
    ],
)
def test_worker_lost_spends_attempt__only_deaths_without_progress(
    outcome, units_at_claim, units_done, spent
):
    assert (
        worker_lost_spends_attempt(outcome, units_at_claim=units_at_claim, units_done=units_done)
        is spent
    )
