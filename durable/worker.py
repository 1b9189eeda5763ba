"""The worker: claims due jobs, runs their units in order, renews leases.

``python manage.py runworker`` builds a ``Worker`` and calls ``run()``. Each of
``concurrency`` threads claims one job at a time. One more thread renews every
lease this process holds and beats the worker's heartbeat, and does nothing
else, so nothing can stall it: it never waits for a row lock (an atomic unit
of ours may hold one) and never runs signal receivers. A third thread does the
housekeeping that may be slow — reclaiming jobs of stopped workers, the
``worker_heartbeat`` signal's chores. On SQLite a fourth only touches the
worker's pulse file (``rescue.pulse``), which no database lock can delay.
Scale out with more processes (on one or many machines sharing PostgreSQL),
not more threads: units are mostly I/O, and processes isolate crashes.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from . import faults, rescue, signals, tracing, turns, wakeup
from . import lease as leases
from .errors import LeaseLost, NonRetryable, RetryLater, Stopping, Unavailable, UnitTimeout
from .lease import Lease
from .models import Job, WorkerProcess
from .operations import JobContext, Operation, Unit, check_payload, get_operation, registered
from .policy import backoff_delay, error_entry
from .states import JobState

log = logging.getLogger("durable.worker")


# The exit status of a worker that had to leave because a unit overran its
# operation's unit_timeout and would not stop (os.EX_SOFTWARE): restart it.
EXIT_UNIT_TIMEOUT = 70
EXIT_RECORD_SECONDS = 2.0  # how long exit 70 waits to record itself (Workers page)
MAX_WORKER_ID_PREFIX = 150  # leaves room for the suffix in the 200-character lease_owner


def default_worker_id(prefix: str | None = None) -> str:
    """``prefix:random`` (default prefix ``host:pid``), fresh for every process start.

    A restarted pod or container started with the same ``--worker-id`` never
    inherits the dead process's identity: its leases, its registry row, its
    "stopped" mark. 48 random bits keep a crash-looping pod clear of collisions
    with the rows its earlier starts left behind.
    """
    prefix = prefix or f"{socket.gethostname()}:{os.getpid()}"
    return f"{prefix[:MAX_WORKER_ID_PREFIX]}:{secrets.token_hex(6)}"


_FINISHED = object()  # _run_unit: the last unit's commit also completed the job


@dataclass(frozen=True)
class _Raised:
    """The look-ahead's generator raised; re-raised once the unit is committed."""

    error: Exception


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

    @property
    def timed_out(self) -> bool:
        """The current unit overran unit_timeout and was asked to stop."""
        return self.overrun_at is not None


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


@dataclass
class Worker:
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
        self._executions: dict[int, Execution] = {}
        self._lock = threading.Lock()
        self._jobs_done = 0
        self._reserved = 0
        self._signals = 0
        # Set when the grace period ran out with units still running in threads
        # we cannot interrupt: the caller should end the process with os._exit.
        self.abandoned_units = False
        # When a unit that overran its unit_timeout was found still running a
        # grace period later: from then on the process drains and exits.
        self._hung_since: float | None = None
        self._wakeup = wakeup.Wakeup()
        self.desk = ClaimDesk(self._claim_for, self.claim_batch or self.concurrency)

    # --- lifecycle ------------------------------------------------------------

    def run(self, *, install_signal_handlers: bool = True) -> int:
        """Run until stopped (or, with ``burst``, until nothing is due). Returns an exit code."""
        if install_signal_handlers:
            self._install_signal_handlers()
        ops = self.operations or sorted(registered())
        self.operations = ops
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
        pulse = self._start_pulse()
        renewer = threading.Thread(target=self._renew_loop, name="durable-renewer", daemon=True)
        renewer.start()
        keeper = threading.Thread(
            target=self._housekeeping_loop, name="durable-housekeeping", daemon=True
        )
        keeper.start()
        if not self.burst:
            wakeup.start_listener(
                self._wakeup,
                self.queues,
                self.finished,
                due_exists=self._due_exists,
                sqlite_interval=getattr(settings, "DURABLE_SQLITE_WAKE_INTERVAL", 0.01),
            )
        threads = [
            threading.Thread(target=self._executor_loop, name=f"durable-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        deadline = None
        while any(thread.is_alive() for thread in threads):
            if self.stopping.is_set() and deadline is None:
                deadline = time.monotonic() + self.grace_seconds
                self.stop()  # tell running units, which may poll ctx.should_stop()
            if deadline is not None and time.monotonic() > deadline:
                with self._lock:
                    busy = sorted(self._executions)
                log.warning(
                    "grace period over; leaving these jobs to lease expiry",
                    extra={"worker": self.worker_id, "jobs": busy},
                )
                self.abandoned_units = True
                break
            for thread in threads:
                thread.join(timeout=0.1)
        self.finished.set()
        renewer.join(timeout=5)
        keeper.join(timeout=5)
        try:
            # Not when a thread is still inside a unit: "stopped" lets peers take
            # its job at once, while that unit could still write. The caller's
            # os._exit ends it; peers here see the PID gone, others the lease expire.
            if not self.abandoned_units:
                rescue.mark_stopped(self.worker_id)
            if self._hung_since is not None:  # exit 70, not a clean stop
                rescue.record_exit_reason(self.worker_id, WorkerProcess.EXIT_UNIT_TIMEOUT)
        finally:
            connection.close()
            pulse.join(timeout=5)
            if not self.abandoned_units:
                rescue.stop_pulse(self.worker_id)
        log.info("worker stopped", extra={"worker": self.worker_id, "jobs_done": self._jobs_done})
        return EXIT_UNIT_TIMEOUT if self._hung_since is not None else 0

    def _recover_at_startup(self) -> rescue.StartupReport | None:
        """Startup recovery, retried with backoff while the database is unreachable.

        A worker started before its database (a reboot, a failover) waits for it
        instead of crash-looping; a stop signal ends the wait.
        """
        delay = 0.5
        while True:
            try:
                return rescue.recover_at_startup(
                    self.worker_id,
                    queues=self.queues,
                    concurrency=self.concurrency,
                    lease_seconds=self.lease_seconds,
                )
            except (OperationalError, InterfaceError) as exc:
                log.warning(
                    "database unavailable at startup; retrying",
                    extra={"worker": self.worker_id, "error": str(exc)[:200], "retry_in": delay},
                )
                connection.close()
                if self.stopping.wait(delay):
                    return None
                delay = min(delay * 2, 30.0)

    def stop(self) -> None:
        self.stopping.set()
        self._wakeup.close()  # idle threads leave now, not at their next poll
        with self._lock:
            for execution in self._executions.values():
                execution.ctx.stop_requested.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handle(signum: int, _frame: Any) -> None:
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
        pulse = self._start_pulse()
        renewer = threading.Thread(target=self._renew_loop, name="durable-renewer", daemon=True)
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

    # --- claiming -------------------------------------------------------------

    def _executor_loop(self) -> None:
        # No start-up jitter: jobs taken back after a restart already come due
        # gradually (rescue.reclaim_delay), and everything else should start now.
        # The thread keeps its connection for its whole life (SQLite included: a
        # reconnect costs a WAL checkpoint's fsync on the last close); it is
        # dropped only after an error, and the next claim reconnects.
        idle = 0.0
        try:
            while not self.stopping.is_set():
                if not self._reserve():
                    return
                try:
                    claimed = self.desk.take()
                except Exception:
                    log.exception("claim failed; retrying", extra={"worker": self.worker_id})
                    connection.close()
                    self._unreserve()
                    idle = min(max(idle * 2, self.poll_interval), 30.0)
                    self.stopping.wait(idle)
                    continue
                if claimed is None:
                    self._unreserve()
                    if self.burst:
                        return
                    self._wakeup.wait(self.poll_interval * random.uniform(0.8, 1.2))
                    continue
                idle = 0.0
                if self._wakeup.idle:
                    # There may be more: let one idle thread look too (a burst
                    # reaches every thread; a lone job costs one empty claim).
                    self._wakeup.signal()
                try:
                    self.execute(*claimed)
                except Exception:
                    # Typically the database went away while recording an outcome;
                    # the lease expires and restart recovery takes the job back.
                    log.exception("job left to lease expiry", extra={"job": claimed[0].job_id})
                    connection.close()
                with self._lock:
                    self._jobs_done += 1
        finally:
            connection.close()

    def _claim_for(self, count: int) -> list[tuple[Lease, Job]]:
        return leases.claim_many(
            self.worker_id,
            count,
            queues=self.queues,
            operations=self.operations or [],
            lease_seconds=self.lease_seconds,
        )

    def _due_exists(self) -> bool:
        """A read (no lock taken): is a job this worker could claim due now?"""
        sql, params = leases.pick_sql(
            timezone.now(), queues=self.queues, operations=self.operations or [], lock=False
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone() is not None

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

    # --- running a job -----------------------------------------------------------

    def execute(self, lease: Lease, job: Job) -> None:
        """Run the claimed job's remaining units; always leaves the job in a settled state."""
        with tracing.attempt_span(
            job, attempt=job.attempts + 1, lease_epoch=lease.epoch, worker_id=self.worker_id
        ):
            self._execute(lease, job)

    def _execute(self, lease: Lease, job: Job) -> None:
        op = get_operation(job.operation)
        ctx = JobContext(
            job_id=job.pk,
            operation=job.operation,
            input=job.input,
            checkpoint=job.checkpoint,
            attempt=job.attempts + 1,
            worker_id=self.worker_id,
            lease_epoch=lease.epoch,
            units_done=job.units_done,
            units_total=job.units_total,
            logger=logging.getLogger(f"durable.op.{job.operation}"),
        )
        has_results = getattr(job, "has_results", None)  # the claim tells; else ask
        if has_results is None:
            has_results = leases.has_results(job.pk)
        execution = Execution(lease, ctx, op, results_possible=has_results)
        with self._lock:
            self._executions[job.pk] = execution
        units = None
        try:
            faults.reach("after_claim")
            for name in op.credential_refs(job.input):
                ctx.credential(name)
            op.prepare(ctx)
            if ctx.units_total is None:
                ctx.units_total = op.total_units(ctx)
            units = op.units(ctx)
            pending = iter(units)
            ahead: Any = None  # a unit the look-ahead already took from the generator
            while (unit := ahead if ahead is not None else next(pending, None)) is not None:
                if self._at_boundary(execution):
                    tracing.outcome("handed_back")
                    return
                ahead = self._run_unit(execution, unit, pending)
                if ahead is _FINISHED:
                    tracing.outcome("completed")
                    return  # the last unit's commit completed the job
            faults.reach("before_complete")
            execution.finishing = True
            leases.complete(lease)
            tracing.outcome("completed")
        except LeaseLost as exc:
            tracing.outcome("lease_lost")
            log.warning("lease lost; abandoning job", extra={"job": job.pk, "detail": str(exc)})
        except Stopping as exc:
            execution.finishing = True
            tracing.outcome("stopped")
            self._stopped_early(execution, exc)
        except Unavailable as exc:
            execution.finishing = True
            tracing.outcome("unavailable")
            self._settle_failure(leases.pause_unavailable, lease, str(exc))
        except Exception as exc:
            execution.finishing = True
            self._fail(execution, exc)
        finally:
            if units is not None and hasattr(units, "close"):
                units.close()
            with self._lock:
                self._executions.pop(job.pk, None)

    def _at_boundary(self, execution: Execution) -> bool:
        """Between units: True if the worker must let go of the job now."""
        if execution.lost:
            raise LeaseLost(f"job {execution.lease.job_id}: renewal found the lease gone")
        if execution.observed_state in (JobState.PAUSED, JobState.CANCELLING):
            execution.finishing = True
            state = leases.settle(execution.lease)
            if state == JobState.RUNNING:  # resumed while we were busy
                execution.finishing = False
                execution.observed_state = state
                if not self.stopping.is_set():
                    execution.ctx.stop_requested.clear()
                return False
            return True
        if self.stopping.is_set():
            execution.finishing = True
            leases.release(execution.lease)
            return True
        return False

    def _run_unit(self, execution: Execution, unit: Unit, pending: Iterator[Unit]) -> Any:
        """Run and commit one unit. Returns ``_FINISHED`` when its commit also completed
        the job, the next unit when it had to be looked ahead at, else None."""
        ctx, op, lease = execution.ctx, execution.op, execution.lease
        check_payload(unit)
        execution.overrun_at, execution.unit_key = None, unit.key
        execution.unit_started = time.monotonic()
        ahead: Any = None
        try:
            if op.atomic_units:
                # SQLite: the unit holds the one write lock while it runs; let
                # whoever waits for it (renewals, claims, commits) go first.
                turns.give_way()
                execution.in_atomic = True
                with transaction.atomic():
                    leases.fence(lease, self.lease_seconds)
                    result = self._unit_body(execution, unit)
                    state = self._commit(execution, unit, result)
            else:
                result = self._unit_body(execution, unit)
                ahead = self._look_ahead(execution, unit, pending)
                if ahead is _FINISHED:
                    execution.finishing = True
                    state = leases.finish_unit(
                        lease,
                        key=unit.key,
                        result=result,
                        checkpoint=unit.checkpoint,
                        units_total=ctx.units_total,
                        operation=ctx.operation,
                        attempts=ctx.attempt - 1,
                    )
                    faults.reach("finish_after_commit")
                    return _FINISHED
                state = self._commit(execution, unit, result)
        finally:
            execution.unit_started = None
            execution.in_atomic = False
        faults.reach("after_checkpoint")
        execution.committed += 1
        ctx.checkpoint = unit.checkpoint
        ctx.units_done += 1
        execution.observed_state = state
        if state in (JobState.PAUSED, JobState.CANCELLING):
            ctx.stop_requested.set()
        elif execution.timed_out and not (self.stopping.is_set() or execution.lost):
            ctx.stop_requested.clear()  # it finished after all: the stop was for that unit only
        if isinstance(ahead, _Raised):
            raise ahead.error  # the unit is committed; now the generator's own failure
        return ahead

    def _look_ahead(self, execution: Execution, unit: Unit, pending: Iterator[Unit]) -> Any:
        """Is the unit just run the job's last? Asked only when ``total_units`` says so.

        Then the generator is asked for one more unit before the commit: none
        means the commit completes the job too (``_FINISHED``: one transaction
        instead of two); a unit means the total was an estimate, and it is run
        next as usual. A generator that raises is committed past first, then
        its error is raised (``_Raised``). Never for atomic units (the look-ahead
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
            return _Raised(exc)
        finally:
            ctx.units_done, ctx.checkpoint = ctx.units_done - 1, checkpoint
        if ahead is None:
            return None if ctx.pending_events else _FINISHED
        return ahead

    def _unit_body(self, execution: Execution, unit: Unit) -> Any:
        """Steps 2 and 3, and the check of step 4: skip if done, else run and verify."""
        ctx, op = execution.ctx, execution.op
        exists, result = (
            leases.result_exists(ctx.job_id, unit.key)
            if execution.results_possible
            else (False, None)
        )
        if exists:
            ctx.logger.info(
                "unit already done; skipping", extra={"job": ctx.job_id, "unit": unit.key}
            )
            return result
        faults.reach("before_unit")
        with tracing.unit_span(ctx, unit):
            result = op.run_unit(ctx, unit)
            faults.reach("after_unit")
            op.verify(ctx, unit, result)
        return result

    def _commit(self, execution: Execution, unit: Unit, result: Any) -> str:
        ctx = execution.ctx
        events, ctx.pending_events = ctx.pending_events, []
        return leases.commit_unit(
            execution.lease,
            key=unit.key,
            result=result,
            checkpoint=unit.checkpoint,
            units_total=ctx.units_total,
            events=events,
            lease_seconds=self.lease_seconds,
        )

    # --- failures -----------------------------------------------------------------

    def _stopped_early(self, execution: Execution, exc: Stopping) -> None:
        """A unit raised Stopping: hand the job back as asked, or count it if nobody asked."""
        if not execution.ctx.stop_requested.is_set():
            self._fail(execution, exc)  # unprompted: an ordinary failure, so it cannot loop
            return
        if execution.timed_out:
            timeout = execution.op.unit_timeout
            self._fail(
                execution,
                UnitTimeout(
                    f"unit {execution.unit_key!r} ran longer than its unit_timeout of "
                    f"{timeout:g}s and stopped when asked"
                ),
            )
            return
        execution.ctx.logger.info(
            "unit stopped early; handing the job back",
            extra={"job": execution.ctx.job_id, "state": execution.observed_state},
        )
        # release() settles every case under the row lock: running -> queued at
        # once, cancelling -> cancelled, paused -> stays paused; no attempt spent.
        self._settle_failure(leases.release, execution.lease, "the unit stopped early")

    def _fail(self, execution: Execution, exc: Exception) -> None:
        ctx, op, lease = execution.ctx, execution.op, execution.lease
        now = timezone.now()
        seen = frozenset(ctx.secrets)
        if isinstance(exc, RetryLater):
            entry = error_entry(exc, attempt=ctx.attempt, retryable=True, now=now, secrets=seen)
            retry_at, consume = exc.at, exc.consume_attempt
        elif isinstance(exc, (NonRetryable, *op.non_retryable)):
            entry = error_entry(exc, attempt=ctx.attempt, retryable=False, now=now, secrets=seen)
            retry_at, consume = None, True
        else:
            entry = error_entry(exc, attempt=ctx.attempt, retryable=True, now=now, secrets=seen)
            retry_at = op.next_retry_at(ctx, exc, now) or now + timedelta(
                seconds=backoff_delay(ctx.attempt, base=op.backoff_base, cap=op.backoff_max)
            )
            consume = True
        tracing.failed(entry)
        ctx.logger.warning(
            "unit failed",
            extra={
                "job": ctx.job_id,
                "attempt": ctx.attempt,
                "error_class": entry["error_class"],
                "error": entry["message"][:200],
                "retry_at": retry_at.isoformat() if retry_at else None,
            },
        )
        self._settle_failure(
            leases.record_failure,
            lease,
            entry,
            retry_at=retry_at,
            consume_attempt=consume,
            on_exhausted=op.on_exhausted,
            coalesce=execution.committed == 0,
        )

    def _settle_failure(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except LeaseLost as exc:
            log.warning("lease lost while recording an outcome", extra={"detail": str(exc)})

    # --- lease renewal and housekeeping --------------------------------------------

    def _start_pulse(self) -> threading.Thread:
        """SQLite: the pulse that tells peers on this machine this process is alive.

        Its own thread, which never touches the database: lease renewals may wait
        for SQLite's write lock for longer than a lease, the pulse never waits.
        """
        interval = max(self.lease_seconds / 3.0, 0.05)

        def beat() -> None:
            rescue.pulse(self.worker_id)
            while not self.finished.wait(interval):
                rescue.pulse(self.worker_id)

        thread = threading.Thread(target=beat, name="durable-pulse", daemon=True)
        thread.start()
        return thread

    def _renew_loop(self) -> None:
        """Renew every lease and beat the heartbeat, every third of a lease; nothing else."""
        interval = max(self.lease_seconds / 3.0, 0.05)
        try:
            while not self.finished.wait(interval):
                try:
                    self._renew_all()
                    rescue.heartbeat(self.worker_id)
                except Exception:
                    log.exception("lease renewal round failed", extra={"worker": self.worker_id})
                    connection.close()  # the next round reconnects
        finally:
            connection.close()

    def _housekeeping_loop(self) -> None:
        """The periodic work that may be slow: the heartbeat signal's chores and reclaims.

        Kept off the renewal thread: a reclaim may wait for a peer's row lock, a
        receiver may enqueue jobs, and neither may delay this process's renewals.
        """
        interval = max(self.lease_seconds / 3.0, 0.05)
        reclaim_every = max(self.lease_seconds / 2.0, 0.1)
        next_reclaim = time.monotonic() + reclaim_every * random.uniform(0.5, 1.0)
        try:
            while not self.finished.wait(interval):
                try:
                    signals.send_now(signals.worker_heartbeat, worker_id=self.worker_id)
                    if time.monotonic() >= next_reclaim and not self.stopping.is_set():
                        rescue.reclaim(self.worker_id)
                        next_reclaim = time.monotonic() + reclaim_every * random.uniform(0.8, 1.2)
                except Exception:
                    log.exception("housekeeping round failed", extra={"worker": self.worker_id})
                    connection.close()
        finally:
            connection.close()

    def _renew_all(self) -> None:
        with self._lock:
            executions = list(self._executions.values())
        for execution in executions:
            # An overrunning unit is still running: its lease is renewed like any
            # other until the unit returns or the process is gone.
            self._watch_timeout(execution)
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
        self._watch_hung(executions)

    # --- units that overrun unit_timeout -------------------------------------------

    def _watch_timeout(self, execution: Execution) -> None:
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

    def _record_unit_timeout(self) -> None:
        try:
            rescue.record_exit_reason(self.worker_id, WorkerProcess.EXIT_UNIT_TIMEOUT)
        except Exception:
            log.exception("could not record the exit reason")
        finally:
            connection.close()

    def _watch_hung(self, executions: list[Execution]) -> None:
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
        if self._hung_since is None:
            self._hung_since = now
            log.critical(
                "a unit did not stop after its unit_timeout; draining this worker, then exiting",
                extra={"worker": self.worker_id, "jobs": [e.lease.job_id for e in hung]},
            )
            self.stop()
        others = [e for e in executions if all(e is not h for h in hung)]
        if not others or now - self._hung_since > self.grace_seconds:
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
