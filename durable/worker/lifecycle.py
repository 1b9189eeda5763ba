"""The worker's life: start (recovery, threads), run until stopped, stop on a signal.

``Worker`` is what ``python manage.py runworker`` builds: its settings, and the
parts it starts in ``run()`` — the executor threads, the renewal thread (with
the watchdog), the housekeeping thread, on SQLite the pulse, and the wake-up
listener. A stop (a signal, ``stop()``, a unit that would not stop) ends the
claims, lets running units reach a boundary within the grace period, and
marks the worker stopped so its peers know.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from .. import lease as leases
from .. import rescue, signals, wakeup
from ..dbwatch import DatabaseWatch
from ..lease import Lease
from ..models import Job, WorkerProcess
from ..operations import get_operation, registered
from ..states import JobState
from .desk import ClaimDesk
from .execution import Executions
from .executors import Executors
from .housekeeping import housekeeping_loop
from .identity import default_worker_id
from .pulse import start_pulse
from .renewal import Renewer
from .runner import JobRunner
from .watchdog import EXIT_UNIT_TIMEOUT, Watchdog

log = logging.getLogger("durable.worker")


@dataclass
class Worker:
    """One worker process's settings and parts; ``run()`` runs it until stopped.

    The parts are built once, with the settings the worker was built with.
    """

    worker_id: str = field(default_factory=default_worker_id)
    queues: list[str] = field(default_factory=lambda: ["default"])
    concurrency: int = 1
    burst: bool = False
    lease_seconds: float = 30.0
    poll_interval: float = 1.0
    grace_seconds: float = 25.0
    max_jobs: int | None = None
    operations: list[str] | None = None
    # The most jobs one claim statement takes for threads waiting together
    # (ClaimDesk); None: as many as there are threads, 1: each thread alone.
    claim_batch: int | None = None

    def __post_init__(self) -> None:
        self.stopping = threading.Event()  # no new claims; stop at the next unit boundary
        self.finished = threading.Event()
        self._signals = 0
        # Set when the grace period ran out with units still running in threads
        # we cannot interrupt: the caller should end the process with os._exit.
        self.abandoned_units = False
        self._wakeup = wakeup.Wakeup()
        # Every loop of the process reports to it: one warning when the database is
        # lost, one line when it is back, whichever loops fail meanwhile.
        self.watch = DatabaseWatch(log, worker=self.worker_id)
        self.executions = Executions()
        self.desk = ClaimDesk(self._claim_for, self.claim_batch or self.concurrency)
        self.runner = JobRunner(
            self.worker_id, self.lease_seconds, self.stopping, self.executions, self.watch
        )
        self.watchdog = Watchdog(self.worker_id, self.grace_seconds, stop=self.stop)
        self.renewer = Renewer(
            self.worker_id,
            self.lease_seconds,
            self.executions,
            self.watchdog,
            self.finished,
            self.watch,
        )
        self.executors = Executors(
            self.worker_id,
            self.desk,
            self.runner,
            self._wakeup,
            self.stopping,
            self.watch,
            burst=self.burst,
            poll_interval=self.poll_interval,
            max_jobs=self.max_jobs,
            next_claim=self._next_claim,
        )

    def run(self, *, install_signal_handlers: bool = True) -> int:
        """Run until stopped (or, with ``burst``, until nothing is due). Returns an exit code."""
        if install_signal_handlers:
            self._install_signal_handlers()
        self.operations = self.operations or sorted(registered())
        report = self._recover_at_startup()
        if report is None:  # stopped before the database ever answered
            return 0
        log.info(
            "worker started",
            extra={
                "worker": self.worker_id,
                "queues": self.queues,
                "concurrency": self.concurrency,
                "cold_start": report.cold_start,
                "reclaimed": len(report.reclaimed),
                "failed_by_policy": len(report.failed_queued),
            },
        )
        signals.send_now(
            signals.worker_started, worker_id=self.worker_id, cold_start=report.cold_start
        )
        connection.close()
        pulse = start_pulse(self.worker_id, self.lease_seconds, self.finished)
        renewer = threading.Thread(target=self.renewer.loop, name="durable-renewer", daemon=True)
        renewer.start()
        keeper = threading.Thread(
            target=housekeeping_loop,
            args=(self.worker_id, self.lease_seconds, self.stopping, self.finished, self.watch),
            name="durable-housekeeping",
            daemon=True,
        )
        keeper.start()
        if not self.burst:
            wakeup.start_listener(
                self._wakeup,
                self.queues,
                self.finished,
                due_exists=self._due_exists,
                sqlite_interval=getattr(settings, "DURABLE_SQLITE_WAKE_INTERVAL", 0.01),
                watch=self.watch,
            )
        threads = [
            threading.Thread(target=self.executors.loop, name=f"durable-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        self._wait_for(threads)
        self.finished.set()
        renewer.join(timeout=5)
        keeper.join(timeout=5)
        self._sign_off(pulse)
        log.info(
            "worker stopped",
            extra={"worker": self.worker_id, "jobs_done": self.executors.jobs_done},
        )
        return EXIT_UNIT_TIMEOUT if self.watchdog.hung_since is not None else 0

    def _wait_for(self, threads: list[threading.Thread]) -> None:
        """Until the executor threads end; once stopping, at most a grace period more."""
        deadline = None
        while any(thread.is_alive() for thread in threads):
            if self.stopping.is_set() and deadline is None:
                deadline = time.monotonic() + self.grace_seconds
                self.stop()  # tell running units, which may poll ctx.should_stop()
            if deadline is not None and time.monotonic() > deadline:
                log.warning(
                    "grace period over; leaving these jobs to lease expiry",
                    extra={"worker": self.worker_id, "jobs": self.executions.job_ids()},
                )
                self.abandoned_units = True
                return
            for thread in threads:
                thread.join(timeout=0.1)

    def _sign_off(self, pulse: threading.Thread) -> None:
        """Tell peers this worker is gone: its registry row, its exit reason, its pulse."""
        try:
            # Not when a thread is still inside a unit: "stopped" lets peers take
            # its job at once, while that unit could still write. The caller's
            # os._exit ends it; peers here see the PID gone, others the lease expire.
            if not self.abandoned_units:
                rescue.mark_stopped(self.worker_id)
            if self.watchdog.hung_since is not None:  # exit 70, not a clean stop
                rescue.record_exit_reason(self.worker_id, WorkerProcess.EXIT_UNIT_TIMEOUT)
        finally:
            connection.close()
            pulse.join(timeout=5)
            if not self.abandoned_units:
                rescue.stop_pulse(self.worker_id)

    def _recover_at_startup(self) -> rescue.StartupReport | None:
        """Startup recovery, tried again while the database is unreachable.

        A worker started before its database (a reboot, a failover) waits for it
        instead of crash-looping, looking every second (one warning, then one line
        a minute), so it starts within a second of the database; a stop signal
        ends the wait. Any other database error backs off up to 30 s.
        """
        failures = 0
        while True:
            began = self.watch.now()
            try:
                report = rescue.recover_at_startup(
                    self.worker_id,
                    queues=self.queues,
                    concurrency=self.concurrency,
                    lease_seconds=self.lease_seconds,
                    reclaim_now=failures == 0,  # not just after an outage: see there
                )
            except (OperationalError, InterfaceError) as exc:
                failures += 1
                unreachable = self.watch.failed(exc, "startup recovery failed; retrying")
                connection.close()
                delay = self.watch.retry_delay(failures, unreachable=unreachable, base=0.5, cap=30)
                if self.stopping.wait(delay):
                    return None
                continue
            self.watch.succeeded(began)
            return report

    def stop(self) -> None:
        """No new claims; running units are asked to stop at their next boundary."""
        self.stopping.set()
        self._wakeup.close()  # idle threads leave now, not at their next poll
        self.executions.ask_to_stop()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handle(signum: int, _frame: FrameType | None) -> None:
            # Only set an event here: the main thread may hold a lock we would need.
            self._signals += 1
            if self._signals > 1:
                os._exit(1)  # second signal: leave now, leases will expire
            self.stopping.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def run_job(self, job_id: int, *, timeout: float | None = None) -> Job:
        """Run one job in this process (management commands, tests) and return it finished.

        If a worker holds the job already, wait for it instead; the job is never
        run twice at once. Raises TimeoutError if ``timeout`` passes first.
        """
        started = time.monotonic()
        job = Job.objects.get(pk=job_id)
        get_operation(job.operation)  # fail fast if this process cannot run it
        rescue.register_inline(self.worker_id, lease_seconds=self.lease_seconds)
        pulse = start_pulse(self.worker_id, self.lease_seconds, self.finished)
        renewer = threading.Thread(target=self.renewer.loop, name="durable-renewer", daemon=True)
        renewer.start()
        try:
            while True:
                claimed = leases.claim(
                    self.worker_id,
                    queues=[],
                    operations=[job.operation],
                    lease_seconds=self.lease_seconds,
                    job_id=job_id,
                )
                if claimed is not None:
                    self.execute(*claimed)
                job = Job.objects.get(pk=job_id)
                if job.is_finished or job.state == JobState.PAUSED:
                    return job
                if timeout is not None and time.monotonic() - started > timeout:
                    raise TimeoutError(f"job {job_id} is still {job.state}")
                if self.stopping.wait(self.poll_interval):
                    return job
        finally:
            self.finished.set()
            renewer.join(timeout=5)
            rescue.mark_stopped(self.worker_id)
            pulse.join(timeout=5)
            rescue.stop_pulse(self.worker_id)

    def execute(self, lease: Lease, job: Job) -> None:
        """Run a job this worker claimed (see ``JobRunner.execute``)."""
        self.runner.execute(lease, job)

    def _claim_for(self, count: int) -> list[tuple[Lease, Job]]:
        """The claim desk's statement: up to ``count`` due jobs of this worker's queues.

        Each is held (``Executions.hold``) from here until its thread is done with
        it, so the renewer never takes it for a claim an outage swallowed."""
        claimed = leases.claim_many(
            self.worker_id,
            count,
            queues=self.queues,
            operations=self.operations or [],
            lease_seconds=self.lease_seconds,
        )
        self.executions.hold([lease.job_id for lease, _ in claimed])
        return claimed

    def _next_claim(self) -> leases.NextClaim:
        """The claim a thread's finishing job makes for its next one (no desk: the
        thread is the only one that wants it, and it is waiting for it)."""
        return leases.NextClaim(
            self.worker_id, self.queues, self.operations or [], self.lease_seconds
        )

    def _due_exists(self) -> bool:
        """A read (no lock taken): is a job this worker could claim due now?"""
        sql, params = leases.pick_sql(
            timezone.now(), queues=self.queues, operations=self.operations or [], lock=False
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone() is not None
