"""A claimed job as the worker's threads share it: its lease, its context, its progress.

The executor thread running the job writes its ``Execution``; the renewal
thread and the watchdog read it, and may mark the lease lost or ask the unit to
stop. ``Executions`` are the jobs a process holds at the moment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..lease import Lease, NextClaim
from ..models import Job
from ..operations import JobContext, Operation
from ..states import JobState


@dataclass
class Execution:
    """One claimed job as the renewer sees it."""

    lease: Lease
    ctx: JobContext
    op: Operation
    unit_started: float | None = None
    # Inside an atomic unit: its transaction holds the job's row (PostgreSQL: the
    # row lock; SQLite: the write lock) and renewed the lease in fence(); the
    # commit renews it again, so the renewal thread leaves it alone.
    in_atomic: bool = False
    # Settling the job (complete, release, failure): a renewal that finds the
    # lease gone now is the settlement, not a lost lease.
    finishing: bool = False
    observed_state: str = JobState.RUNNING
    lost: bool = False
    # When (time.monotonic()) the current unit overran unit_timeout and was asked to stop.
    overrun_at: float | None = None
    unit_key: str = ""
    committed: int = 0  # units this lease committed
    # False when the job had no unit results at claim: only this lease holder
    # can add any, so step 2's lookup can be skipped (one query less per unit).
    results_possible: bool = True
    # Asked as the job's last unit commits: the claim of this thread's next job to make
    # in that transaction, or None (stopping, no --max-jobs slot left, no follow-on).
    follow: Callable[[], NextClaim | None] | None = None
    # The job that commit claimed: the thread runs it next.
    next: tuple[Lease, Job] | None = None

    @property
    def timed_out(self) -> bool:
        """The current unit overran unit_timeout and was asked to stop."""
        return self.overrun_at is not None


class Executions:
    """The jobs this process holds right now, by job id; shared by all its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[int, Execution] = {}
        # Claimed and handed to a thread that has not finished with it (it may not
        # have built its Execution yet, or be waiting to hand it back after an outage).
        self._in_hand: set[int] = set()

    def hold(self, job_ids: list[int]) -> None:
        with self._lock:
            self._in_hand.update(job_ids)

    def let_go(self, job_id: int) -> None:
        with self._lock:
            self._in_hand.discard(job_id)

    def held(self) -> set[int]:
        """Every job a thread of this process has claimed and not finished with."""
        with self._lock:
            return self._in_hand | set(self._by_job)

    def add(self, execution: Execution) -> None:
        with self._lock:
            self._by_job[execution.lease.job_id] = execution

    def remove(self, job_id: int) -> None:
        with self._lock:
            self._by_job.pop(job_id, None)

    def snapshot(self) -> list[Execution]:
        """The executions of this moment, to go through without holding the lock."""
        with self._lock:
            return list(self._by_job.values())

    def job_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._by_job)

    def ask_to_stop(self) -> None:
        """Tell every running unit (which may poll ``ctx.should_stop()``) to stop."""
        with self._lock:
            for execution in self._by_job.values():
                execution.ctx.stop_requested.set()
