"""The executor threads: each claims a job at the claim desk, runs it, and claims again.

``concurrency`` threads run ``Executors.loop``. An idle thread waits on the
wake-up (a notification, or its poll interval); with ``max_jobs`` each thread
reserves one of the remaining jobs before it claims, so the worker never runs
more than that. While the database is unreachable a claim is tried again every
second at most (the process's ``DatabaseWatch`` says so once, not per claim), so
work resumes within a second of its return; any other claim error backs off.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from django.db import connection

from .. import wakeup
from ..dbwatch import DatabaseWatch
from ..lease import Lease, NextClaim
from ..models import Job
from .desk import ClaimDesk
from .runner import JobRunner

log = logging.getLogger("durable.worker")


class Executors:
    """What the executor threads of one worker share: the desk, the runner, the counts."""

    def __init__(
        self,
        worker_id: str,
        desk: ClaimDesk,
        runner: JobRunner,
        wake: wakeup.Wakeup,
        stopping: threading.Event,
        watch: DatabaseWatch,
        *,
        burst: bool,
        poll_interval: float,
        max_jobs: int | None,
        next_claim: Callable[[], NextClaim],
    ) -> None:
        self.worker_id = worker_id
        self.desk = desk
        self.runner = runner
        self.wakeup = wake
        self.stopping = stopping
        self.watch = watch
        self.burst = burst
        self.poll_interval = poll_interval
        self.max_jobs = max_jobs
        # The claim a finishing job makes for its thread's next one (lease.finish_unit).
        self.next_claim = next_claim
        self._lock = threading.Lock()
        self._reserved = 0
        self.jobs_done = 0

    def loop(self) -> None:
        """One executor thread, until the worker stops (or, with ``burst``, nothing is due)."""
        # No start-up jitter: jobs taken back after a restart already come due
        # gradually (rescue.reclaim_delay), and everything else should start now.
        # The thread keeps its connection for its whole life (SQLite included: a
        # reconnect costs a WAL checkpoint's fsync on the last close); it is
        # dropped only after an error, and the next claim reconnects.
        failures = 0
        # The job the last one's finishing commit claimed for this thread, if any.
        claimed: tuple[Lease, Job] | None = None
        try:
            while True:
                if claimed is not None and self.stopping.is_set():
                    self.runner.hand_back(claimed[0])  # claimed as the worker stopped
                    self._unreserve()
                    return
                if claimed is None:
                    if self.stopping.is_set() or not self._reserve():
                        return
                    began = self.watch.now()
                    try:
                        claimed = self.desk.take()
                    except Exception as exc:
                        failures += 1
                        unreachable = self.watch.failed(exc, "claim failed; retrying")
                        connection.close()
                        self._unreserve()
                        self.stopping.wait(
                            self.watch.retry_delay(
                                failures, unreachable=unreachable, base=self.poll_interval, cap=30.0
                            )
                        )
                        continue
                    failures = 0
                    self.watch.succeeded(began)
                    if claimed is None:
                        self._unreserve()
                        if self.burst:
                            return
                        self.wakeup.wait(self.poll_interval * random.uniform(0.8, 1.2))
                        continue
                if self.wakeup.idle:
                    # There may be more: let one idle thread look too (a burst
                    # reaches every thread; a lone job costs one empty claim).
                    self.wakeup.signal()
                claimed = self._run(*claimed)
                with self._lock:
                    self.jobs_done += 1
        finally:
            connection.close()

    def _run(self, lease: Lease, job: Job) -> tuple[Lease, Job] | None:
        """Run a job; the job its finishing commit claimed for this thread, if any.

        The follow-on claim is asked for only while the worker is not stopping and,
        with ``max_jobs``, a slot is left (reserved here, released if nothing came)."""
        asked = False

        def follow() -> NextClaim | None:
            nonlocal asked
            if self.stopping.is_set() or not self._reserve():
                return None
            asked = True
            return self.next_claim()

        claimed: tuple[Lease, Job] | None = None
        try:
            claimed = self.runner.execute(lease, job, follow)
        except Exception as exc:
            connection.close()
            if self.watch.failed(exc, "job left to lease expiry", job=lease.job_id):
                # The database went away under the job: once it is back, the job is
                # handed back at once (no attempt spent) instead of waiting for its
                # lease to expire and being taken back as after a crash.
                self.runner.hand_back_after_outage(lease)
        finally:
            self.runner.executions.let_go(lease.job_id)
            if asked and claimed is None:
                self._unreserve()
        return claimed

    def _reserve(self) -> bool:
        """With ``max_jobs``, hold one of the remaining claims for this thread."""
        if self.max_jobs is None:
            return True
        with self._lock:
            if self._reserved >= self.max_jobs:
                return False
            self._reserved += 1
            return True

    def _unreserve(self) -> None:
        if self.max_jobs is not None:
            with self._lock:
                self._reserved -= 1
