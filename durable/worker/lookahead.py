"""The look-ahead: is the unit just run the job's last? Then its commit completes the job.

One transaction instead of two for the last unit, which is most of what a
one-unit job costs. Asked only when the operation's ``total_units`` says the
unit should be the last.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from ..operations import Unit
from .execution import Execution


class _Finished(enum.Enum):
    FINISHED = "finished"


# The last unit's commit also completed the job.
FINISHED: Final = _Finished.FINISHED
Finished: TypeAlias = Literal[_Finished.FINISHED]


@dataclass(frozen=True)
class Raised:
    """The look-ahead's generator raised; re-raised once the unit is committed."""

    error: Exception


# What the look-ahead found: nothing to do (None), the job's end, the next unit, or an error.
Ahead: TypeAlias = Unit | Finished | Raised | None


def look_ahead(execution: Execution, unit: Unit, pending: Iterator[Unit]) -> Ahead:
    """Is the unit just run the job's last? Asked only when ``total_units`` says so.

    Then the generator is asked for one more unit before the commit: none
    means the commit completes the job too (``FINISHED``: one transaction
    instead of two); a unit means the total was an estimate, and it is run
    next as usual. A generator that raises is committed past first, then
    its error is raised (``Raised``). Never for atomic units (the look-ahead
    would run inside their transaction, holding the lock while it reads),
    nor when the unit added events (they are numbered before completion), nor
    for an operation whose ``look_ahead`` is False (its generator reads the
    results of the unit just run, which are not committed yet).
    """
    ctx = execution.ctx
    if (
        not execution.op.look_ahead
        or ctx.units_total is None
        or ctx.units_done + 1 < ctx.units_total
        or ctx.pending_events
    ):
        return None
    # The generator resumes after the unit just run, so it sees the context as
    # the commit will leave it (a scan that sets its final total from units_done
    # would otherwise count one unit short).
    checkpoint = ctx.checkpoint
    ctx.units_done, ctx.checkpoint = ctx.units_done + 1, unit.checkpoint
    try:
        ahead = next(pending, None)
    except Exception as exc:
        return Raised(exc)
    finally:
        ctx.units_done, ctx.checkpoint = ctx.units_done - 1, checkpoint
    if ahead is None:
        return None if ctx.pending_events else FINISHED
    return ahead
