"""One process's watch on its database: what its loops report, said once, not once per loop.

A worker's loops (claims, lease renewals, housekeeping, the wake-up listener) all
lose the database at the same moment. Each reports its failures and successes
here; the decisions (``durable.outage``) turn them into one warning when the
database is lost, at most one reminder a minute, and one line when it is back —
for the whole process, however many threads fail meanwhile.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from . import outage


class DatabaseWatch:
    """Shared by every thread of a process; each call takes a lock for a moment."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        **context: Any,
    ) -> None:
        self.log = logger
        self.context = context  # fields on every line (the worker's id)
        self._clock = clock
        self._wall_clock = wall_clock
        self._lost_at_wall: float | None = None  # when (time.time()) the outage began
        self._to_sweep: float | None = None  # the start of an outage not looked back on yet
        self._lock = threading.Lock()
        self._state = outage.Reachability()
        self._returned_at: float | None = None  # when the database was last back

    @property
    def down(self) -> bool:
        return self._state.down

    def failed(self, exc: BaseException, message: str, **fields: Any) -> bool:
        """A loop's statement raised ``exc``. True when the database is unreachable: then
        the outage is tracked here and nothing more is logged; otherwise ``message``
        is logged with the traceback and False returned."""
        if not outage.is_unreachable(exc):
            self.log.error(message, exc_info=exc, extra={**self.context, **fields})
            return False
        with self._lock:
            if not self._state.down:
                self._lost_at_wall = self._wall_clock()
            self._state, note = outage.on_failure(self._state, self._clock(), outage.describe(exc))
        self._write(note)
        return True

    def now(self) -> float:
        """The watch's clock: read before a statement, passed to ``succeeded`` after it."""
        return self._clock()

    def succeeded(self, began: float | None = None) -> None:
        """A loop's statement, sent at ``began`` (``now()``), went through: the database
        is reachable — unless it was sent before the outage began (see ``on_success``)."""
        if not self._state.down:  # the common case, read without the lock
            return
        with self._lock:
            now = self._clock()
            self._state, note = outage.on_success(self._state, now, began=began)
            if note is not None:
                self._returned_at = now
                self._to_sweep = self._lost_at_wall
        self._write(note)

    def outage_to_look_back_on(self) -> float | None:
        """When (``time.time()``) the outage that just ended began; once per outage.

        For the renewer, which then hands back the claims the outage may have
        swallowed (``durable.lease.strays``).
        """
        with self._lock:
            began, self._to_sweep = self._to_sweep, None
        return began

    def returned_within(self, seconds: float) -> bool:
        """Whether the database came back from an outage less than ``seconds`` ago."""
        back = self._returned_at
        return back is not None and self._clock() - back < seconds

    def retry_delay(self, failures: int, *, unreachable: bool, base: float, cap: float) -> float:
        return outage.retry_delay(
            failures, unreachable=unreachable, base=base, cap=cap, spread=random.random()
        )

    def _write(self, note: outage.Note | None) -> None:
        if note is not None:
            self.log.log(note.level, note.message, extra={**self.context, **note.fields})
