"""How a lease ends, decided: the fields a final transition writes and the event it records.

Pure functions, as ``durable.states`` decides the operator actions: the caller
locks the job, passes in what it observed (and ``now``), and writes what comes
back in one short locked statement. Nothing here touches the database or
reads the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from .states import JobState

FINISH_CANCEL_MESSAGE = "stopped at a unit boundary"  # the cancelled event at a boundary


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


@dataclass(frozen=True)
class Finished:
    """The last unit's commit ended the job: the state it left and the event of the end."""

    old_state: JobState
    event: Event


def finished(state: str, units_done: int) -> Finished | None:
    """The event of the state the last unit's commit left the job in (see ``complete``).

    ``completed`` (from running) or ``cancelled`` (a cancel accepted meanwhile
    wins); None when the job stays as it was (paused: its lease is released and
    it completes once resumed). PostgreSQL's one-statement commit words the same
    table in SQL.
    """
    if state == JobState.COMPLETED:
        return Finished(JobState.RUNNING, Event("completed", "", {"units_done": units_done}))
    if state == JobState.CANCELLED:
        return Finished(JobState.CANCELLING, Event("cancelled", FINISH_CANCEL_MESSAGE, {}))
    return None
