"""The watchdog: units that overrun their operation's ``unit_timeout``.

Past the timeout a unit is asked to stop (``ctx.should_stop()``). One still
running a grace period later cannot be interrupted — it runs in a thread — so
the process drains its other jobs and exits with ``EXIT_UNIT_TIMEOUT``, and
its job is taken back as after a crash. The renewal thread runs the watchdog
once per round (``durable.worker.renewal``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from django.db import connection

from .. import rescue
from ..models import WorkerProcess
from .execution import Execution

log = logging.getLogger("durable.worker")

# The exit status of a worker that had to leave because a unit overran its
# operation's unit_timeout and would not stop (os.EX_SOFTWARE): restart it.
EXIT_UNIT_TIMEOUT = 70
EXIT_RECORD_SECONDS = 2.0  # how long exit 70 waits to record itself (Workers page)


class Watchdog:
    """Asks overrunning units to stop, and ends the process when one does not."""

    def __init__(self, worker_id: str, grace_seconds: float, stop: Callable[[], None]) -> None:
        self.worker_id = worker_id
        self.grace_seconds = grace_seconds
        self._stop = stop  # the worker's stop(): no new claims, units asked to stop
        # When a unit that overran its unit_timeout was found still running a
        # grace period later: from then on the process drains and exits.
        self.hung_since: float | None = None

    def watch_timeout(self, execution: Execution) -> None:
        """Past ``unit_timeout``: ask the unit to stop (once per unit)."""
        timeout = execution.op.unit_timeout
        started = execution.unit_started
        if not timeout or started is None or execution.timed_out:
            return
        if time.monotonic() - started <= timeout:
            return
        execution.overrun_at = time.monotonic()
        execution.ctx.stop_requested.set()
        log.error(
            "unit exceeded unit_timeout; asking it to stop",
            extra={
                "job": execution.lease.job_id,
                "unit": execution.unit_key,
                "unit_timeout": timeout,
                "grace_seconds": self.grace_seconds,
            },
        )

    def watch_hung(self, executions: list[Execution]) -> None:
        """A unit still running a grace period after its timeout: drain, then exit.

        A thread cannot be interrupted, so the only way to be sure the unit has
        stopped before anyone else may take its job is to end the process. Its
        other jobs first get a grace period to reach a unit boundary and be
        released; then ``os._exit`` — without marking the worker stopped, so
        peers take the jobs back exactly as after a crash (PID gone, or lease
        expired), and the overrun counts as a failed attempt (``WorkerLost``).
        """
        now = time.monotonic()
        hung = [
            e
            for e in executions
            if e.overrun_at is not None
            and e.unit_started is not None
            and now - e.overrun_at > self.grace_seconds
        ]
        if not hung:
            return  # nothing stuck (any more): an ordinary shutdown, if one began, goes on
        if self.hung_since is None:
            self.hung_since = now
            log.critical(
                "a unit did not stop after its unit_timeout; draining this worker, then exiting",
                extra={"worker": self.worker_id, "jobs": [e.lease.job_id for e in hung]},
            )
            self._stop()
        others = [e for e in executions if all(e is not h for h in hung)]
        if not others or now - self.hung_since > self.grace_seconds:
            log.critical(
                "exiting with a unit still running; its job is taken back as after a crash",
                extra={"worker": self.worker_id, "jobs": [e.lease.job_id for e in hung]},
            )
            # For the Workers page. The exit must not wait on the database (on SQLite the
            # hung unit may hold the write lock): at most EXIT_RECORD_SECONDS, then leave.
            recorder = threading.Thread(target=self._record_unit_timeout, daemon=True)
            recorder.start()
            recorder.join(timeout=EXIT_RECORD_SECONDS)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_UNIT_TIMEOUT)

    def _record_unit_timeout(self) -> None:
        try:
            rescue.record_exit_reason(self.worker_id, WorkerProcess.EXIT_UNIT_TIMEOUT)
        except Exception:
            log.exception("could not record the exit reason")
        finally:
            connection.close()
