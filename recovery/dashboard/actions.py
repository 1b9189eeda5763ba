"""Which action buttons a job's row offers, and how an action's outcome is worded. Pure.

The engine (``durable.jobs``) decides what an action does; the buttons are
only the sensible choices per state. A stale page may still send any action:
the engine answers "already so" or refuses, and the message says which.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

ACTIONS = ("pause", "resume", "cancel", "retry", "discard")
LABELS = {
    "pause": "Pause",
    "resume": "Resume",
    "cancel": "Cancel",
    "retry": "Retry now",
    "discard": "Discard",
}
PAST = {
    "pause": "paused",
    "resume": "resumed",
    "cancel": "cancelled",
    "retry": "retried",
    "discard": "discarded",
}

# state -> the actions offered on its row (retry on a queued job only while it waits)
_OFFERED = {
    "queued": ("pause", "cancel", "retry"),
    "running": ("pause", "cancel"),
    "paused": ("resume", "cancel"),
    "failed": ("retry", "discard"),
    "completed": ("discard",),  # deleted for good, with its events: its own permission
    "cancelled": ("discard",),
}


def row_actions(state: str, *, waiting: bool, allowed: Iterable[str]) -> tuple[str, ...]:
    """Actions to show for a job in ``state`` to a user allowed ``allowed``.

    ``waiting``: a queued job whose next attempt is in the future (backing
    off): "Retry now" skips the wait; for a due job it would do nothing.
    """
    permitted = set(allowed)
    offered = _OFFERED.get(state, ())
    return tuple(
        action
        for action in offered
        if action in permitted and not (action == "retry" and state == "queued" and not waiting)
    )


@dataclass(frozen=True)
class Said:
    level: str  # "success", "info", "error" (Django message levels by name)
    text: str


def describe(job_id: int, action: str, *, applied: bool, state: str, refusal: str | None) -> Said:
    """The message for one action's outcome (``durable.jobs.Outcome``'s fields)."""
    if refusal:
        return Said("error", f"Job {job_id}: not {PAST.get(action, action)} — {refusal}.")
    if applied and action == "discard":
        return Said("success", f"Job {job_id} discarded: deleted with its events.")
    if applied:
        return Said("success", f"Job {job_id} {PAST.get(action, action)} (now {state}).")
    return Said("info", f"Job {job_id} is already {state}: nothing to do.")


def summarize(action: str, outcomes: Iterable[tuple[bool, str | None]]) -> Said:
    """One message for many outcomes (``(applied, refusal)`` pairs), refusals grouped by reason."""
    applied = already = 0
    refusals: Counter[str] = Counter()
    for did, refusal in outcomes:
        if refusal:
            refusals[refusal] += 1
        elif did:
            applied += 1
        else:
            already += 1
    parts = [f"{applied:,} {PAST.get(action, action)}"]
    if already:
        parts.append(f"{already:,} already so")
    if refusals:
        reasons = "; ".join(f"{n:,} x {reason}" for reason, n in refusals.most_common(3))
        more = len(refusals) - 3
        if more > 0:
            reasons += f"; {more} other reason{'s' if more > 1 else ''}"
        parts.append(f"{sum(refusals.values()):,} refused ({reasons})")
    level = "error" if refusals and not applied else ("success" if applied else "info")
    return Said(level, ", ".join(parts) + ".")
