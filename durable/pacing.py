"""Units bounded in time: how much the next unit of a batching operation should hold.

A unit is the grain of progress: a worker that dies keeps only what it
committed. An operation that cuts its work into a fixed count (10,000 lines,
1,000 rows) makes a unit that takes a tenth of a second on one database and
several seconds on another, or under load; a worker that lives less than
that (a crash-looping deploy, an OOM killer) never commits anything, however
often it is restarted. So a batching operation sizes each unit from the rate
it measured on the units before, aiming at ``DURABLE_UNIT_TARGET_SECONDS`` of
work, never above its own cap (its line, row or byte limit), and starts every
claim with a small unit, so a worker that lives one second still commits.

``next_size`` is the decision, pure and table-tested; ``Pacer`` is the
stopwatch an operation's ``units()`` generator holds: it times each unit from
the moment its size was asked for (reading, running and committing it) to
the moment the generator is resumed for the next one::

    pacer = Pacer(cap=ctx.input["batch_size"])
    while True:
        size = pacer.size()            # small at first, then from the rate
        rows = read_after(position, size)
        if not rows:
            break
        yield Unit(key=f"rows:{position}", payload=..., checkpoint={"after": rows[-1]})
        pacer.done(len(rows))          # the unit just yielded has been run
        position = rows[-1]

Restart safety does not depend on the sizes: each unit's extent is decided
before it is yielded and written into the unit itself (its key, its payload
and the checkpoint it commits), so nothing has to remember the pace. A
resumed job starts at the last committed checkpoint and cuts the rest
afresh, starting small again; the uncommitted unit's extent is re-done from
its start, possibly cut shorter. What an operation must ensure is what it
already must for a crash: a unit's effects follow from its extent alone and
are safe to repeat over work a crashed run began (atomic units, upserts,
a file rewritten under the unit's own name).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

# A unit never more than doubles the one before: one fast measurement (a cached
# read, an idle moment) must not produce a unit ten times too long.
MAX_GROWTH = 2.0
# With no measurement yet, a unit is this fraction of the cap (the first after a claim).
FIRST_FRACTION = 1 / 32
# The setting's bounds (a system check reports a value outside them).
MIN_TARGET_SECONDS = 0.05
MAX_TARGET_SECONDS = 60.0


@dataclass(frozen=True)
class Measure:
    """What the last unit held (lines, rows, bytes…), how long it took, what it was given."""

    size: int
    seconds: float
    asked: int = 0  # the size it was cut to; 0: the same as ``size``


def first_size(cap: int, floor: int = 1) -> int:
    """The first unit after a claim: a small share of the cap, at least ``floor``."""
    return max(floor, min(cap, math.ceil(cap * FIRST_FRACTION)))


def next_size(
    last: Measure | None, *, target: float, cap: int, floor: int = 1, first: int | None = None
) -> int:
    """How much the next unit should hold to take about ``target`` seconds.

    From the rate the last unit ran at (the fixed cost of a unit counts in
    it, so small units look slow and the next one grows), never more than
    ``MAX_GROWTH`` times the last unit, never below ``floor`` nor above ``cap``.
    Without a measurement (the first unit after a claim): ``first``, by
    default ``first_size(cap, floor)``.
    """
    if cap < 1 or floor < 1:
        raise ValueError("a unit holds at least one item: cap and floor must be at least 1")
    floor = min(floor, cap)
    if last is None or last.size < 1:
        start = first_size(cap, floor) if first is None else first
        return max(floor, min(cap, start))
    if last.size < last.asked and last.seconds <= target:
        # Cut short by the end of the data (a table's last rows) and quick: its
        # fixed costs say little about the rate. Keep the pace it was given.
        return max(floor, min(cap, last.asked))
    grown = last.size * MAX_GROWTH
    wanted = grown if last.seconds <= 0 else min(grown, last.size * target / last.seconds)
    return max(floor, min(cap, int(wanted)))


def target_seconds() -> float:
    """The site's ``DURABLE_UNIT_TARGET_SECONDS``."""
    return float(settings.DURABLE_UNIT_TARGET_SECONDS)


class Pacer:
    """Sizes the units of one ``units()`` generator, one claim at a time.

    Create it inside ``units()``: the engine calls that once per claim, so
    every claim starts with a small unit. ``size()`` before cutting a unit,
    ``done(n)`` once the generator is resumed after yielding it (``n``: what
    the unit actually held, when the end of the data or another limit cut it
    shorter). A unit not followed by ``done`` (nothing was left to cut) is
    simply not measured.
    """

    def __init__(
        self,
        cap: int,
        *,
        floor: int = 1,
        first: int | None = None,
        target: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cap = cap
        self.floor = floor
        self.first = first
        self.target = target_seconds() if target is None else target
        self.clock = clock
        self.last: Measure | None = None
        self._started: float | None = None
        self._size = 0

    def size(self) -> int:
        """How much the next unit should hold; starts its stopwatch."""
        self._size = next_size(
            self.last, target=self.target, cap=self.cap, floor=self.floor, first=self.first
        )
        self._started = self.clock()
        return self._size

    def done(self, held: int | None = None) -> None:
        """The unit sized last has run: measure it (``held`` items; default: its size)."""
        if self._started is None:
            return
        held = self._size if held is None else held
        self.last = Measure(size=held, seconds=self.clock() - self._started, asked=self._size)
        self._started = None

    def units_for(self, remaining: int) -> int:
        """About how many more units ``remaining`` items take at the current pace.

        For ``ctx.set_total``: an estimate (the pace keeps changing), at least 1.
        """
        if remaining <= 0:
            return 0
        size = self._size or next_size(
            self.last, target=self.target, cap=self.cap, floor=self.floor, first=self.first
        )
        return max(1, math.ceil(remaining / size))
