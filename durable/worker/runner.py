"""Running one claimed job: its remaining units in order, each committed with its checkpoint.

The steps of a unit: (1) the unit from the operation's generator, (2) skip it
if its result is already recorded, (3) run and verify it, (4) commit its
result, checkpoint and events in one transaction fenced by the lease. Between
units the job is let go of when the worker stops, an operator paused or
cancelled it, or the lease was lost. Whatever happens, the job is left in a
settled state (``durable.worker.failures`` for the ways a unit fails) — except
when the database itself went away: then nothing can be written, the error is
raised to the executor thread, and the job is handed back once the database
answers again (``hand_back_after_outage``), without spending an attempt: the
unit did not fail, its database did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connection, transaction

from .. import faults, tracing, transitions, turns
from .. import lease as leases
from ..dbwatch import DatabaseWatch
from ..errors import LeaseLost, Stopping, Unavailable
from ..lease import Lease, NextClaim
from ..models import Job
from ..operations import JobContext, Unit, check_payload, get_operation
from ..outage import is_unreachable
from ..states import JobState
from .execution import Execution, Executions
from .failures import fail, settle, stopped_early
from .lookahead import FINISHED, Ahead, Finished, Raised, look_ahead

log = logging.getLogger("durable.worker")


class JobRunner:
    """Runs claimed jobs for one worker; any thread of the worker may call ``execute``."""

    def __init__(
        self,
        worker_id: str,
        lease_seconds: float,
        stopping: threading.Event,
        executions: Executions,
        watch: DatabaseWatch | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.stopping = stopping  # the worker stops: let go of the job at the next boundary
        self.executions = executions
        self.watch = watch or DatabaseWatch(log, worker=worker_id)

    def execute(
        self,
        lease: Lease,
        job: Job,
        follow: Callable[[], NextClaim | None] | None = None,
    ) -> tuple[Lease, Job] | None:
        """Run the claimed job's remaining units; always leaves the job in a settled state.

        ``follow``: asked as the last unit commits; a claim it returns is made in that
        commit's transaction, and the job it claimed returned, held
        (``Executions.hold``), for the thread to run next. Claimed just as the worker
        began to stop, that job is handed back instead (queued, no attempt spent).
        """
        with tracing.attempt_span(
            job, attempt=job.attempts + 1, lease_epoch=lease.epoch, worker_id=self.worker_id
        ):
            execution = self._execution(lease, job, follow)
            try:
                claimed = self._execute(execution)
            except BaseException:
                # Raised after the finishing commit claimed the thread's next job (a
                # units iterable whose close() raised, say): the thread will not run
                # it, so it goes back to the queue now instead of staying held and
                # renewed by a worker that never starts it.
                if execution.next is not None:
                    self.hand_back(execution.next[0])
                    execution.next = None
                raise
        if claimed is not None and self.stopping.is_set():
            self.hand_back(claimed[0])
            return None
        return claimed

    def hand_back(self, lease: Lease) -> None:
        """A job claimed for this thread that it will not start: queued again at once,
        no attempt spent (``transitions.release``), and let go of."""
        try:
            settle(transitions.release, lease, "claimed as its worker stopped")
        finally:
            self.executions.let_go(lease.job_id)

    def _execution(
        self, lease: Lease, job: Job, follow: Callable[[], NextClaim | None] | None
    ) -> Execution:
        """The claimed job as the worker's threads will share it (not yet registered)."""
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
        return Execution(lease, ctx, op, results_possible=has_results, follow=follow)

    def _execute(self, execution: Execution) -> tuple[Lease, Job] | None:
        lease, ctx, op = execution.lease, execution.ctx, execution.op
        job_id = lease.job_id
        self.executions.add(execution)
        units = None
        try:
            faults.reach("after_claim")
            for name in op.credential_refs(ctx.input):
                ctx.credential(name)
            op.prepare(ctx)
            if ctx.units_total is None:
                ctx.units_total = op.total_units(ctx)
            units = op.units(ctx)
            pending = iter(units)
            ahead: Unit | None = None  # a unit the look-ahead already took from the generator
            while (unit := ahead if ahead is not None else next(pending, None)) is not None:
                if self._at_boundary(execution):
                    tracing.outcome("handed_back")
                    return None
                after = self._run_unit(execution, unit, pending)
                if after is FINISHED:
                    tracing.outcome("completed")
                    return execution.next  # the last unit's commit completed the job
                ahead = after
            faults.reach("before_complete")
            execution.finishing = True
            transitions.complete(lease)
            tracing.outcome("completed")
        except LeaseLost as exc:
            tracing.outcome("lease_lost")
            log.warning("lease lost; abandoning job", extra={"job": job_id, "detail": str(exc)})
        except Stopping as exc:
            execution.finishing = True
            tracing.outcome("stopped")
            stopped_early(execution, exc)
        except Unavailable as exc:
            execution.finishing = True
            tracing.outcome("unavailable")
            settle(transitions.pause_unavailable, lease, str(exc))
        except Exception as exc:
            execution.finishing = True
            if engine_database_lost(exc):
                raise  # nothing can be recorded now: the executor hands the job back later
            fail(execution, exc)
        finally:
            try:
                if units is not None and hasattr(units, "close"):
                    units.close()
            finally:
                self.executions.remove(job_id)
        return execution.next

    def hand_back_after_outage(self, lease: Lease) -> None:
        """Once the database answers again, hand the job back: queued at once, no attempt
        spent, its checkpoint kept (``transitions.release``).

        Looked at every second at most, like every loop through an outage. A job
        that someone else took meanwhile (an outage longer than the lease) is
        theirs: ``settle`` logs the lost lease. Not an outage after all: left to
        lease expiry and restart recovery, as before.
        """
        failures = 0
        while True:
            began = self.watch.now()
            try:
                settle(transitions.release, lease, "its worker lost the database")
                self.watch.succeeded(began)
                return
            except Exception as exc:
                failures += 1
                connection.close()
                if not self.watch.failed(
                    exc, "could not hand a job back after an outage", job=lease.job_id
                ):
                    return
                time.sleep(self.watch.retry_delay(failures, unreachable=True, base=1, cap=1))

    def _at_boundary(self, execution: Execution) -> bool:
        """Between units: True if the worker must let go of the job now."""
        if execution.lost:
            raise LeaseLost(f"job {execution.lease.job_id}: renewal found the lease gone")
        if execution.observed_state in (JobState.PAUSED, JobState.CANCELLING):
            execution.finishing = True
            state = transitions.settle(execution.lease)
            if state == JobState.RUNNING:  # resumed while we were busy
                execution.finishing = False
                execution.observed_state = state
                if not self.stopping.is_set():
                    execution.ctx.stop_requested.clear()
                return False
            return True
        if self.stopping.is_set():
            execution.finishing = True
            transitions.release(execution.lease)
            return True
        return False

    def _run_unit(
        self, execution: Execution, unit: Unit, pending: Iterator[Unit]
    ) -> Unit | Finished | None:
        """Run and commit one unit. Returns ``FINISHED`` when its commit also completed
        the job, the next unit when it had to be looked ahead at, else None."""
        ctx, op, lease = execution.ctx, execution.op, execution.lease
        check_payload(unit)
        execution.overrun_at, execution.unit_key = None, unit.key
        execution.unit_started = time.monotonic()
        ahead: Ahead = None
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
                ahead = look_ahead(execution, unit, pending)
                if ahead is FINISHED:
                    execution.finishing = True
                    self._finish(execution, unit, result)
                    faults.reach("finish_after_commit")
                    return FINISHED
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
        if isinstance(ahead, Raised):
            raise ahead.error  # the unit is committed; now the generator's own failure
        return ahead

    def _finish(self, execution: Execution, unit: Unit, result: Any) -> None:
        """The last unit's commit, which completes the job and, when the thread goes on
        (``Execution.follow``), claims its next job in the same transaction."""
        ctx, follow = execution.ctx, execution.follow
        then = follow() if follow is not None and not self.stopping.is_set() else None
        ended = leases.finish_unit(
            execution.lease,
            key=unit.key,
            result=result,
            checkpoint=unit.checkpoint,
            units_total=ctx.units_total,
            operation=ctx.operation,
            attempts=ctx.attempt - 1,
            then=then,
        )
        if ended.next is not None:  # committed: from now on the worker holds it
            self.executions.hold([ended.next[0].job_id])
            execution.next = ended.next

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
        """Step 4: the unit's result, checkpoint and events, in one fenced transaction."""
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


def engine_database_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is this thread's connection to the engine's database going away.

    An unreachable database, and this thread's connection to it closed or
    broken: not the unit's own connection to some other database (``db.copy``'s
    target), whose outage is the unit's failure like any other.
    """
    if not is_unreachable(exc):
        return False
    raw = connection.connection
    return raw is None or bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))
