"""The claim desk: threads that want a job at the same moment share one claim statement.

Threading only, no database: the claim itself is the callable the worker
hands in (``durable.lease.claim_many`` with its queues and operations).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..lease import Lease
from ..models import Job


class ClaimFailed(Exception):
    """The claim another thread made for this one failed (its error is the cause)."""


@dataclass(eq=False)
class _Seat:
    """A thread waiting at the claim desk, and what the claim brought it."""

    ready: threading.Event = field(default_factory=threading.Event)
    claimed: tuple[Lease, Job] | None = None
    error: BaseException | None = None
    lead: bool = False


class ClaimDesk:
    """One claim statement for every thread of a worker that wants a job at that moment.

    A thread that wants a job takes a seat. If no claim is on its way, it
    leads: it claims as many jobs as there are seats (its own first, at most
    ``limit``), hands each seated thread its job or None, and the first thread
    seated meanwhile leads the next claim. Under a deep queue, the threads
    that finished a job while one claim was on its way share the next one —
    one round trip and one commit for the group instead of one each, which is
    what small jobs spend their time on. Under a light load every claim serves
    one thread, as before. Every job claimed goes to a thread that is waiting
    for it right now: nothing is leased ahead for a thread that is busy, so a
    lease never covers a job that will not start at once (a death between
    claim and start would spend its attempt).
    """

    def __init__(self, claim: Callable[[int], list[tuple[Lease, Job]]], limit: int) -> None:
        self._claim = claim
        self.limit = max(1, limit)
        self._lock = threading.Lock()
        self._seats: deque[_Seat] = deque()
        # One claim on its way at a time. Measured (bench/jobs.py, 8 threads):
        # letting two or three go at once formed smaller groups and drained
        # slower on both databases than one.
        self._claiming = False
        self.claims = 0  # statements made, for tests and benchmarks
        self.served = 0  # seats those statements served

    @property
    def waiting(self) -> int:
        """Threads seated for a later claim (not those a claim on its way serves)."""
        with self._lock:
            return len(self._seats)

    def take(self) -> tuple[Lease, Job] | None:
        """A claimed job for the calling thread, or None when nothing was due."""
        seat = _Seat()
        with self._lock:
            if not self._claiming:  # then nobody is seated
                self._claiming = seat.lead = True
            else:
                self._seats.append(seat)
        if not seat.lead:
            seat.ready.wait()
        if seat.lead:  # ours from the start, or handed on by a leader done claiming
            self._serve(seat)
        if seat.error is not None:
            if seat.lead:
                raise seat.error
            raise ClaimFailed("the claim made for this thread failed") from seat.error
        return seat.claimed

    def _serve(self, own: _Seat) -> None:
        """Claim for the leader's own seat and the seats waiting behind it."""
        with self._lock:
            more = min(self.limit - 1, len(self._seats))
            group = [own, *(self._seats.popleft() for _ in range(more))]
        claimed: list[tuple[Lease, Job]] = []
        try:
            claimed = self._claim(len(group))
        except Exception as exc:
            for seat in group:
                seat.error = exc
        finally:
            # Whatever happened, every seat of the group is answered and the
            # lead handed on: a thread left waiting here would wait forever.
            for seat, job in zip(group, claimed, strict=False):
                seat.claimed = job
            with self._lock:
                self.claims += 1
                self.served += len(group)
                successor = self._seats.popleft() if self._seats else None
                if successor is not None:
                    successor.lead = True
                else:
                    self._claiming = False
            for seat in group[1:]:
                seat.ready.set()
            if successor is not None:
                successor.ready.set()
