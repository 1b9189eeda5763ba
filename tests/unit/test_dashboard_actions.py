"""Which buttons a job's row offers and how an action's outcome is worded."""

from __future__ import annotations

import pytest

from recovery.dashboard.actions import ACTIONS, describe, row_actions, summarize

EVERYTHING = set(ACTIONS)


@pytest.mark.parametrize(
    ("state", "waiting", "allowed", "shown"),
    [
        ("queued", False, EVERYTHING, ("pause", "cancel")),  # due now: "retry now" does nothing
        ("queued", True, EVERYTHING, ("pause", "cancel", "retry")),  # backing off: skip the wait
        ("running", False, EVERYTHING, ("pause", "cancel")),
        ("paused", False, EVERYTHING, ("resume", "cancel")),
        ("cancelling", False, EVERYTHING, ()),  # the worker finishes the cancel
        ("failed", False, EVERYTHING, ("retry", "discard")),
        ("completed", False, EVERYTHING, ("discard",)),
        ("cancelled", False, EVERYTHING, ("discard",)),
        # permissions remove buttons
        ("running", False, {"cancel"}, ("cancel",)),
        ("failed", False, {"pause", "cancel"}, ()),
        ("queued", True, set(), ()),  # read-only staff: no buttons
        ("mystery", False, EVERYTHING, ()),  # unknown state: nothing offered
    ],
)  # fmt: skip
def test_row_actions(state, waiting, allowed, shown):
    assert row_actions(state, waiting=waiting, allowed=allowed) == shown


@pytest.mark.parametrize(
    ("applied", "state", "refusal", "level", "text"),
    [
        (True, "paused", None, "success", "Job 7 paused (now paused)."),
        (False, "paused", None, "info", "Job 7 is already paused: nothing to do."),
        (False, "completed", "a completed job cannot be paused", "error",
         "Job 7: not paused — a completed job cannot be paused."),
    ],
)  # fmt: skip
def test_describe(applied, state, refusal, level, text):
    said = describe(7, "pause", applied=applied, state=state, refusal=refusal)
    assert (said.level, said.text) == (level, text)


def test_summarize__counts_and_groups_refusals():
    outcomes = (
        [(True, None)] * 3 + [(False, None)] + [(False, "a completed job cannot be paused")] * 2
    )
    said = summarize("pause", outcomes)
    assert said.level == "success"
    assert said.text == (
        "3 paused, 1 already so, 2 refused (2 x a completed job cannot be paused)."
    )


def test_summarize__all_refused_is_an_error_and_reasons_are_capped():
    outcomes = [(False, f"reason {n}") for n in range(5)]
    said = summarize("cancel", outcomes)
    assert said.level == "error"
    assert said.text.startswith("0 cancelled, 5 refused (1 x reason 0; 1 x reason 1; 1 x reason 2;")
    assert said.text.endswith("; 2 other reasons).")


def test_summarize__nothing_to_do_is_info():
    assert summarize("resume", [(False, None)]).level == "info"
