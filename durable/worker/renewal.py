"""Lease renewal: every lease this process holds, and its heartbeat, every third of a lease.

The renewal thread does nothing else, so nothing can stall it: it never waits
for a row lock (an atomic unit of ours may hold one; ``renew_unless_busy``
skips that row) and never runs signal receivers (housekeeping does). Each
round also tells each running job what an operator asked of it (pause,
cancel) and runs the watchdog. While the database is unreachable a round is
tried again every second at most, not every third of a lease, so the leases
are renewed within a second of its return, before peers may take them back.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from django.db import connection

from .. import lease as leases
from .. import rescue, transitions
from ..dbwatch import DatabaseWatch
from ..outage import OUTAGE_POLL_SECONDS
from ..states import JobState
from .execution import Executions
from .failures import settle
from .watchdog import Watchdog

log = logging.getLogger("durable.worker")


class Renewer:
    """Renews the leases of ``executions`` until ``finished``."""

    def __init__(
        self,
        worker_id: str,
        lease_seconds: float,
        executions: Executions,
        watchdog: Watchdog,
        finished: threading.Event,
        watch: DatabaseWatch | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.executions = executions
        self.watchdog = watchdog
        self.finished = finished
        self.watch = watch or DatabaseWatch(log, worker=worker_id)

    def loop(self) -> None:
        """Renew every lease and beat the heartbeat, every third of a lease; nothing else."""
        interval = max(self.lease_seconds / 3.0, 0.05)
        delay, failures = interval, 0
        try:
            while not self.finished.wait(delay):
                began = self.watch.now()
                try:
                    self.renew_all()
                    rescue.heartbeat(self.worker_id)
                    self.hand_back_strays()
                except Exception as exc:
                    failures += 1
                    unreachable = self.watch.failed(exc, "lease renewal round failed")
                    connection.close()  # the next round reconnects
                    delay = min(
                        interval,
                        self.watch.retry_delay(
                            failures, unreachable=unreachable, base=interval, cap=interval
                        ),
                    )
                    continue
                self.watch.succeeded(began)
                failures = 0
                # While another loop finds the database gone, come back within a second
                # of its return, not a third of a lease later.
                delay = min(interval, OUTAGE_POLL_SECONDS) if self.watch.down else interval
        finally:
            connection.close()

    def hand_back_strays(self) -> None:
        """After an outage: jobs leased to this worker by a claim whose answer was lost."""
        began = self.watch.outage_to_look_back_on()
        if began is None:
            return
        before = datetime.fromtimestamp(began, tz=UTC)
        for lease in leases.strays(self.worker_id, held=self.executions.held(), before=before):
            log.info(
                "handing back a job claimed as the database went away", extra={"job": lease.job_id}
            )
            settle(transitions.release, lease, "its claim was cut off by a database outage")

    def renew_all(self) -> None:
        """One round: each lease renewed, or found lost, paused or cancelling."""
        executions = self.executions.snapshot()
        for execution in executions:
            # An overrunning unit is still running: its lease is renewed like any
            # other until the unit returns or the process is gone.
            self.watchdog.watch_timeout(execution)
            if execution.in_atomic:
                continue  # its own transaction holds the row and renews on commit
            state = leases.renew_unless_busy(execution.lease, self.lease_seconds)
            if state == leases.BUSY:
                continue
            if state is None:
                if execution.finishing:
                    continue  # completed, released or failed just now: not a lost lease
                execution.lost = True
                execution.ctx.stop_requested.set()
                log.warning("lease lost", extra={"job": execution.lease.job_id})
            else:
                execution.observed_state = state
                if state in (JobState.PAUSED, JobState.CANCELLING):
                    execution.ctx.stop_requested.set()
        self.watchdog.watch_hung(executions)
