"""How a lease ends, decided: every branch of durable.endings, row by row."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durable.endings import (
    FINISH_CANCEL_MESSAGE,
    FREE,
    MAX_TURN_AWAY_REASONS,
    Event,
    LetGo,
    Write,
    cancelled,
    completed,
    failed,
    finished,
    folded_turn_away,
    paused_unavailable,
    reclaimed,
    released,
    settled,
)
from durable.policy import MAX_ERROR_HISTORY
from durable.states import JobState, RestartOutcome

Q, R, P, CG, CD, F, C = (
    JobState.QUEUED,
    JobState.RUNNING,
    JobState.PAUSED,
    JobState.CANCELLING,
    JobState.CANCELLED,
    JobState.FAILED,
    JobState.COMPLETED,
)
NOW = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)


@dataclass(frozen=True)
class Seen:
    """A locked job as the decisions read it."""

    state: str = R
    reason: str = ""
    attempts: int = 0
    max_attempts: int = 5
    errors: Any = field(default_factory=list)
    units_done: int = 3
    units_at_claim: int | None = 3
    reclaims: int = 0
    on_restart: str = "resume"
    lease_owner: str | None = "w1"
    checkpoint: Any = 3


@dataclass(frozen=True)
class Recorded:
    """A recorded event as the turn-away fold reads it."""

    kind: str
    message: str = ""
    data: Any = field(default_factory=dict)


def kind_of(ending: Write | LetGo | None) -> str | None:
    """The event kind a Write records; "let go" or None for the others."""
    if isinstance(ending, Write):
        return ending.event.kind
    return "let go" if isinstance(ending, LetGo) else None


# --- at a unit boundary --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decide", "state", "expected"),
    [
        (completed, R, "completed"),
        (completed, CG, "cancelled"),  # a cancel accepted meanwhile wins
        (completed, P, "let go"),  # a pause is honoured: completes once resumed
        (settled, CG, "cancelled"),
        (settled, P, "let go"),
        (settled, R, None),  # resumed meanwhile: nothing to write, the worker carries on
    ],
)
def test_boundary_endings__by_the_state_an_operator_left(decide, state, expected):
    assert kind_of(decide(Seen(state=state), NOW)) == expected


def test_completed__clears_the_reason_and_frees_the_lease():
    ending = completed(Seen(state=R, units_done=7), NOW)
    assert ending == Write(
        {"state": C, "finished_at": NOW, "reason": "", "error_code": "", **FREE},
        Event("completed", "", {"units_done": 7}),
    )


def test_boundary_endings__a_paused_job_let_go_of_is_logged():
    assert completed(Seen(state=P), NOW) == LetGo(logged=True)
    assert settled(Seen(state=P), NOW) == LetGo(logged=True)


@pytest.mark.parametrize(
    ("reason", "kept"),
    [
        ("", "cancelled"),  # no reason given: "cancelled"
        ("cancelled by ada", "cancelled by ada"),  # the operator's words stay
    ],
)
def test_cancelled__keeps_the_operators_reason(reason, kept):
    ending = cancelled(Seen(state=CG, reason=reason), NOW)
    assert ending.fields["reason"] == kept
    assert ending.fields["state"] == CD
    assert ending.fields["finished_at"] == NOW
    assert ending.event == Event("cancelled", FINISH_CANCEL_MESSAGE, {})


def test_cancelled__frees_the_lease_even_when_extra_fields_name_it():
    ending = cancelled(Seen(state=CG), NOW, {"attempts": 2, "lease_owner": "w1"})
    assert ending.fields["attempts"] == 2
    assert ending.fields["lease_owner"] is None


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (R, "released"),  # back in the queue, due now, no attempt spent
        (CG, "cancelled"),
        (P, "let go"),  # paused meanwhile: stays paused, lease dropped, no event
    ],
)
def test_released__by_state(state, expected):
    ending = released(Seen(state=state), NOW, owner="w1", why="worker shutting down")
    assert kind_of(ending) == expected
    assert ending != LetGo(logged=True)  # a release is not logged as a paused let-go


def test_released__a_running_job_is_due_at_once():
    ending = released(Seen(state=R), NOW, owner="w1", why="deploy")
    assert isinstance(ending, Write)
    assert ending.fields == {"state": Q, "next_attempt_at": NOW, **FREE}
    assert ending.event == Event("released", "deploy", {"worker": "w1"})


@pytest.mark.parametrize(
    ("state", "expected", "attention"),
    [
        (R, "paused", "unavailable"),  # the operator's to-do: a credential to add
        (CG, "cancelled", None),  # cancelled anyway: nothing to do for anyone
    ],
)
def test_paused_unavailable__asks_a_person_unless_cancelled(state, expected, attention):
    ending = paused_unavailable(Seen(state=state), NOW, reason="no credential 'smtp'")
    assert kind_of(ending) == expected
    assert ending.attention == attention


# --- a failed unit --------------------------------------------------------------------------

ENTRY = {"error_class": "ValueError", "message": "boom", "retryable": True}


@pytest.mark.parametrize(
    ("seen", "retry_at", "consume", "expected", "state", "attention"),
    [
        (Seen(attempts=0), LATER, True, "retry_scheduled", Q, None),  # backoff, then again
        (Seen(attempts=4), LATER, True, "failed", F, "exhausted"),  # the fifth of five
        (Seen(attempts=0), None, True, "failed", F, "non_retryable"),  # fail now
        (Seen(state=CG), LATER, True, "cancelled", CD, None),  # the cancel wins
        (Seen(state=P, attempts=1), LATER, True, "failed_attempt", None, None),  # stays paused
        (Seen(state=P, attempts=4), LATER, True, "failed", F, "exhausted"),  # paused, yet out
        (Seen(), LATER, False, "rescheduled", Q, None),  # turned away: nothing charged
        (Seen(state=CG), LATER, False, "cancelled", CD, None),
        (Seen(state=P), LATER, False, "let go", None, None),
    ],
)
def test_failed__the_failure_table(seen, retry_at, consume, expected, state, attention):
    ending = failed(seen, ENTRY, NOW, retry_at=retry_at, consume_attempt=consume)
    assert kind_of(ending) == expected
    if isinstance(ending, Write):
        assert ending.fields.get("state") == state
        assert ending.attention == attention
        assert ending.fields["lease_owner"] is None  # the lease goes with every failure


@pytest.mark.parametrize(
    ("consume", "attempts"),
    [
        (True, 3),  # a failure spends one
        (False, None),  # a turn-away spends none and writes no attempt count
    ],
)
def test_failed__only_a_tried_unit_spends_an_attempt(consume, attempts):
    ending = failed(Seen(attempts=2), ENTRY, NOW, retry_at=LATER, consume_attempt=consume)
    assert isinstance(ending, Write)
    assert ending.fields.get("attempts") == attempts


def test_failed__exhausted_with_a_pausing_operation_pauses_unfinished():
    ending = failed(Seen(attempts=4), ENTRY, NOW, retry_at=LATER, on_exhausted=P)
    assert isinstance(ending, Write)
    assert ending.fields["state"] == P
    assert "finished_at" not in ending.fields  # it is not over: a person decides
    assert ending.event.message == "gave up after 5 attempts; last error: boom"


def test_failed__the_retry_is_recorded_with_its_time_and_history():
    history = [{"error_class": "Old", "message": "x"}] * MAX_ERROR_HISTORY
    ending = failed(Seen(attempts=1, errors=history), ENTRY, NOW, retry_at=LATER)
    assert isinstance(ending, Write)
    assert ending.fields["next_attempt_at"] == LATER
    assert ending.fields["errors"][-1] == ENTRY
    assert len(ending.fields["errors"]) == MAX_ERROR_HISTORY  # the oldest went
    assert ending.event.data == {
        "error_class": "ValueError",
        "attempt": 2,
        "next_attempt_at": LATER.isoformat(),
    }


@pytest.mark.parametrize(("coalesce", "fold"), [(True, True), (False, False)])
def test_failed__a_turn_away_may_fold_only_when_asked(coalesce, fold):
    ending = failed(Seen(), ENTRY, NOW, retry_at=LATER, consume_attempt=False, coalesce=coalesce)
    assert isinstance(ending, Write)
    assert ending.fold is fold


STARTED = Recorded("started", data={"epoch": 4})
TURNED_AWAY = Recorded("rescheduled", "closed", {"turn_aways": 1, "next_attempt_at": "x"})


@pytest.mark.parametrize(
    ("newest", "previous", "folds"),
    [
        (STARTED, TURNED_AWAY, True),  # turned away again, nothing else in between
        (Recorded("started", data={"epoch": 3}), TURNED_AWAY, False),  # another claim's
        (Recorded("unit_note"), TURNED_AWAY, False),  # the lease did something
        (STARTED, Recorded("retry_scheduled"), False),  # the previous was a failure
        (STARTED, None, False),  # the first turn-away
        (None, None, False),
    ],
)
def test_folded_turn_away__only_a_bare_repeat_folds(newest, previous, folds):
    event = folded_turn_away(
        newest, previous, epoch=4, entry={"message": "closed"}, retry_at=LATER, now=NOW
    )
    assert (event is not None) is folds


def test_folded_turn_away__counts_and_lists_distinct_reasons():
    entry = {"message": "rate limited"}
    event = folded_turn_away(STARTED, TURNED_AWAY, epoch=4, entry=entry, retry_at=LATER, now=NOW)
    assert event is not None
    assert event.message == "closed | rate limited"
    assert event.data["turn_aways"] == 2
    assert event.data["reasons"] == ["closed", "rate limited"]
    assert event.data["last_message"] == "rate limited"
    assert event.data["last_at"] == NOW.isoformat()
    assert event.data["next_attempt_at"] == LATER.isoformat()


def test_folded_turn_away__lists_at_most_a_few_reasons():
    reasons = [f"r{n}" for n in range(MAX_TURN_AWAY_REASONS)]
    previous = Recorded("rescheduled", " | ".join(reasons), {"reasons": reasons, "turn_aways": 9})
    event = folded_turn_away(
        STARTED, previous, epoch=4, entry={"message": "new"}, retry_at=LATER, now=NOW
    )
    assert event is not None
    assert event.data["reasons"] == reasons  # full: the new reason is only the last one
    assert event.data["last_message"] == "new"
    assert event.data["turn_aways"] == 10


# --- a worker that stopped -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "outcome", "expected", "state", "attention"),
    [
        (Seen(state=P), RestartOutcome.RELEASE, "let go", None, None),  # paused stays paused
        (Seen(state=CG), RestartOutcome.CANCEL, "cancelled", CD, None),  # finish the cancel
        (Seen(on_restart="fail"), RestartOutcome.FAIL, "failed", F, "server_restarted"),
        (Seen(), RestartOutcome.RESUME, "reclaimed", Q, None),  # from its checkpoint
        (Seen(on_restart="retry"), RestartOutcome.REQUEUE_FROM_START, "reclaimed", Q, None),
        (Seen(attempts=4), RestartOutcome.RESUME, "failed", F, "exhausted"),  # died again
        # at its last attempt, but it moved on: a death after progress never fails a job
        (
            Seen(attempts=4, max_attempts=4, units_done=4),
            RestartOutcome.RESUME,
            "reclaimed",
            Q,
            None,
        ),
    ],
)
def test_reclaimed__the_restart_table(seen, outcome, expected, state, attention):
    decided = reclaimed(seen, NOW, epoch=2, by="w2")
    assert decided.outcome is outcome
    assert kind_of(decided.ending) == expected
    if isinstance(decided.ending, Write):
        assert decided.ending.fields["state"] == state
        assert decided.ending.attention == attention
        assert decided.ending.fields["lease_owner"] is None


@pytest.mark.parametrize(
    ("units_at_claim", "units_done", "attempts", "spent", "message"),
    [
        (
            3,
            3,
            1,
            True,
            "worker w1 stopped while running this job, before committing a unit",
        ),
        (
            3,
            5,
            0,
            False,
            "worker w1 stopped while running this job, after committing 2 unit(s); "
            "it made progress, so no attempt is spent",
        ),
        (None, 5, 1, True, "worker w1 stopped while running this job"),  # an old claim
    ],
)
def test_reclaimed__a_death_spends_an_attempt_only_without_progress(
    units_at_claim, units_done, attempts, spent, message
):
    seen = Seen(units_at_claim=units_at_claim, units_done=units_done)
    decided = reclaimed(seen, NOW, epoch=2, by="w2")
    assert isinstance(decided.ending, Write)
    assert decided.ending.fields["attempts"] == attempts
    assert decided.ending.fields["reclaims"] == 1
    entry = decided.ending.fields["errors"][-1]
    assert entry["message"] == message
    assert entry["attempt_spent"] is spent
    assert entry["attempt"] == 1  # the attempt it was on, whether spent or not
    assert decided.facts["attempt_spent"] is spent


def test_reclaimed__retry_starts_over_and_drops_its_results():
    decided = reclaimed(Seen(on_restart="retry"), NOW, epoch=2, by="w2", delay=1.5)
    assert isinstance(decided.ending, Write)
    assert decided.drop_results
    assert decided.ending.fields["checkpoint"] is None
    assert decided.ending.fields["units_done"] == 0
    assert decided.ending.fields["next_attempt_at"] == NOW + timedelta(seconds=1.5)
    assert decided.ending.event.data["from_start"] is True
    assert decided.ending.event.message == "taken back from w1"


def test_reclaimed__resume_keeps_its_checkpoint_and_results():
    decided = reclaimed(Seen(units_done=5), NOW, epoch=2, by="w2")
    assert isinstance(decided.ending, Write)
    assert not decided.drop_results
    assert "checkpoint" not in decided.ending.fields
    assert decided.ending.event.message == (
        "taken back from w1 after 2 committed unit(s); no attempt spent"
    )
    assert decided.ending.event.data == {
        "previous_worker": "w1",
        "epoch": 2,
        "policy": "resume",
        "by": "w2",
        "attempt_spent": False,
        "units_committed": 2,
    }


@pytest.mark.parametrize(
    ("on_exhausted", "state", "finished_at", "attention"),
    [
        (F, F, NOW, "exhausted"),
        (P, P, None, "exhausted"),  # the operation pauses instead: a person decides
    ],
)
def test_reclaimed__a_job_that_keeps_killing_its_worker_stops(
    on_exhausted, state, finished_at, attention
):
    history = [{"error_class": "WorkerLost", "attempt_spent": True}] * 4
    seen = Seen(attempts=4, errors=history, checkpoint={"row": 12})
    decided = reclaimed(seen, NOW, epoch=2, by="w2", on_exhausted=on_exhausted)
    assert isinstance(decided.ending, Write)
    assert decided.ending.fields["state"] == state
    assert decided.ending.fields["finished_at"] == finished_at
    assert decided.ending.attention == attention
    assert decided.ending.fields["reason"] == (
        "its worker stopped 5 times without committing a unit (checkpoint {'row': 12}); "
        "it may be what crashes the worker"
    )


def test_reclaimed__a_cancel_is_finished_without_touching_the_attempts():
    decided = reclaimed(replace(Seen(state=CG), attempts=2), NOW, epoch=2, by="w2")
    assert isinstance(decided.ending, Write)
    assert "attempts" not in decided.ending.fields
    assert decided.facts == {}  # the signal reports attempt_spent None


# --- the last unit's commit --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "old_state", "event"),
    [
        (C, R, Event("completed", "", {"units_done": 4})),
        (CD, CG, Event("cancelled", FINISH_CANCEL_MESSAGE, {})),  # a cancel won
        (P, None, None),  # paused: the lease is released, no event
    ],
)
def test_finished__the_event_of_the_state_the_commit_left(state, old_state, event):
    ending = finished(state, 4)
    assert (ending and ending.old_state) == old_state
    assert (ending and ending.event) == event
