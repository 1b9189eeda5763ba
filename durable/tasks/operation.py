"""``django.task``: the operation every Django task job runs as.

Registered with the engine when ``durable`` loads, so ``runworker`` runs tasks
with no extra flag. The task's module is imported only once a worker has
claimed a job of it; a worker that cannot import it (it runs other code than
the one that enqueued) hands the job back without spending an attempt, until
``code_wait`` has passed since the task was enqueued — then the task fails
with a clear error.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.dispatch import receiver
from django.utils import timezone

from .. import signals
from ..errors import InputRejected, LeaseLost, NonRetryable, RetryLater, Stopping, Unavailable
from ..lease import Lease
from ..models import Job, UnitResult
from ..operations import Access, JobContext, Operation, Unit, register
from ..policy import backoff_delay
from ..states import JobState
from . import policy
from .backend import backend_for, import_task
from .compat import TaskContext, TaskResultStatus, normalize_json, task_finished, task_started
from .policy import RETURN_KEY, STEP_PREFIX, TASK_OPERATION
from .steps import TaskRun, _current

log = logging.getLogger("durable.tasks")

CODE_RETRY_SECONDS = (20.0, 40.0)  # a worker without the code looks again in this window
# Per worker thread: the task that just returned (job id, running result, value).
_last = threading.local()


class TaskAborted(Exception):
    """Carries a task's BaseException (SystemExit, KeyboardInterrupt…) out of a worker thread.

    Re-raising those would end the worker's thread (or process) for a bug in one
    task; the failure is recorded as the original class (``stands_for``).
    """

    def __init__(self, original: BaseException):
        super().__init__(f"{type(original).__name__}: {original}")
        self.stands_for = original


class TaskRetry(RetryLater):
    """A task's exception, retried with the task's own backoff; recorded as the original."""

    def __init__(self, original: BaseException, at: Any):
        super().__init__(str(original), at=at)
        self.stands_for = original


class TaskGaveUp(NonRetryable):
    """A task's exception its options say not to retry; recorded as the original."""

    def __init__(self, original: BaseException):
        super().__init__(str(original))
        self.stands_for = original


def clean_task_input(data: dict[str, Any]) -> dict[str, Any]:
    """The job input of a task: its path, backend alias and JSON arguments."""
    path = data.get("task")
    if not isinstance(path, str) or "." not in path or len(path) > 500:
        raise InputRejected("task", "must be the task function's dotted path")
    alias = data.get("backend", "default")
    if not isinstance(alias, str) or not alias or len(alias) > 100:
        raise InputRejected("backend", "must be the name of a TASKS backend")
    args = data.get("args", [])
    kwargs = data.get("kwargs", {})
    if not isinstance(args, list):
        raise InputRejected("args", "must be a JSON array")
    if not isinstance(kwargs, dict):
        raise InputRejected("kwargs", "must be a JSON object")
    cleaned = {"task": path, "backend": alias, "args": args, "kwargs": kwargs}
    if data.get("run_after") is not None:
        if not isinstance(data["run_after"], str):
            raise InputRejected("run_after", "must be an ISO 8601 date and time")
        cleaned["run_after"] = data["run_after"]
    return cleaned


@register
class TaskOperation(Operation):
    name = TASK_OPERATION
    label = "Django task"
    description = "A function decorated with Django's @task, enqueued through DurableBackend."
    # Started with task.enqueue(): the dashboard cannot build a task's arguments.
    access = Access.SYSTEM
    max_attempts = policy.TaskOptions.max_attempts

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        return clean_task_input(data)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        # One unit: the call. Its checkpoint dict is filled in by run_unit (the
        # steps it passed) before the worker commits it.
        yield Unit(key=RETURN_KEY, checkpoint={})

    def run_unit(self, ctx: JobContext, unit: Unit) -> Any:
        path, alias = ctx.input["task"], ctx.input.get("backend", "default")
        backend, task = self._resolve(ctx, path, alias)
        options = policy.options_for(task.func, backend.task_options)
        done: dict[str, Any] = {}
        if ctx.checkpoint is not None or ctx.units_done:
            done = dict(
                UnitResult.objects.filter(
                    job_id=ctx.job_id, key__startswith=STEP_PREFIX
                ).values_list("key", "result")
            )
        _last.finished = None
        result = backend.running_result(ctx.job_id, ctx.input, task)
        task_started.send(type(backend), task_result=result)
        run = TaskRun(ctx, Lease(ctx.job_id, ctx.worker_id, ctx.lease_epoch), done)
        token = _current.set(run)
        args, kwargs = ctx.input.get("args", []), ctx.input.get("kwargs", {})
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
        except (Stopping, LeaseLost, RetryLater, NonRetryable, Unavailable):
            raise  # the engine's own verdicts, raised by a step or by the task itself
        except Exception as exc:
            raise self._verdict(ctx, exc, options) from exc
        except BaseException as exc:  # SystemExit & co.: must not end the worker's thread
            raise self._verdict(ctx, TaskAborted(exc), options) from exc
        finally:
            _current.reset(token)
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as exc:
            # Recorded as the real class (builtins.TypeError, ...), as Django's own
            # backends report it; not retried, since it would fail the same way.
            clear = type(exc)(f"the task returned a value JSON cannot hold: {exc}")
            raise TaskGaveUp(clear) from exc
        # For task_finished once the job completes in this thread (_announce_finished).
        _last.finished = (ctx.job_id, result, value)
        unit.checkpoint.update(steps_done=run.position, steps_total=run.total)
        if run.total is not None:
            ctx.units_total = ctx.units_done + 1  # the return is one unit more than the steps
        return value

    def _resolve(self, ctx: JobContext, path: str, alias: str) -> tuple[Any, Any]:
        """Backend and task, or the verdict: wait for a worker with the code, or fail clearly."""
        try:
            backend = backend_for(alias)
        except Exception as exc:
            self._missing(ctx, f"this worker has no TASKS backend {alias!r}: {exc}", 600.0)
        try:
            task = import_task(path)
        except ModuleNotFoundError as exc:
            if not policy.missing_code(path, exc.name):
                raise  # the task's module imports something absent: an ordinary failure
            self._missing(ctx, f"cannot import {path!r}: {exc}", backend.task_options.code_wait)
        except ImportError as exc:  # the module is there, the function is not (yet)
            self._missing(ctx, f"cannot import {path!r}: {exc}", backend.task_options.code_wait)
        except TypeError as exc:
            raise NonRetryable(str(exc)) from None
        return backend, task

    def _missing(self, ctx: JobContext, why: str, wait: float) -> None:
        created = Job.objects.filter(pk=ctx.job_id).values_list("created_at", flat=True).first()
        now = timezone.now()
        if created is None or now - created >= timedelta(seconds=wait):
            raise NonRetryable(f"{why}; no worker could run the task within {wait:g}s") from None
        at = now + timedelta(seconds=random.uniform(*CODE_RETRY_SECONDS))
        # Nothing ran: no attempt is spent, and a worker that has the code may take it.
        raise RetryLater(
            f"{why}; left for a worker that has the code", at=at, consume_attempt=False
        )

    def _verdict(
        self, ctx: JobContext, exc: BaseException, options: policy.TaskOptions
    ) -> Exception:
        original = getattr(exc, "stands_for", None) or exc
        if policy.is_non_retryable(original, options.non_retryable):
            return TaskGaveUp(original)
        delay = backoff_delay(ctx.attempt, base=options.backoff_base, cap=options.backoff_max)
        return TaskRetry(original, timezone.now() + timedelta(seconds=delay))


@receiver(signals.job_state_changed)
def _announce_finished(sender: Any, *, job_id: int, operation: str, **kwargs: Any) -> None:
    """The framework's ``task_finished``, once a task job reached a final state.

    Sent after the commit, from whichever process finished it (a worker, or the
    web process that cancelled a queued task). A process that cannot import the
    task logs that and sends nothing.
    """
    if operation != TASK_OPERATION or kwargs.get("new_state") not in (
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
    ):
        return
    cached, _last.finished = getattr(_last, "finished", None), None
    if cached is not None and cached[0] == job_id and kwargs["new_state"] == JobState.COMPLETED:
        # Completed by this thread just after the task returned: its running result
        # and return value are at hand; only the finish time is new.
        _id, running, value = cached
        finished_at = Job.objects.filter(pk=job_id).values_list("finished_at", flat=True).first()
        result = dataclasses.replace(
            running, status=TaskResultStatus.SUCCESSFUL, finished_at=finished_at
        )
        object.__setattr__(result, "_return_value", value)
        task_finished.send(type(running.task.get_backend()), task_result=result)
        return
    try:
        job = Job.objects.get(pk=job_id)
        backend = backend_for(job.input.get("backend", "default"))
        result = backend.get_result(str(job_id))
    except Exception:
        log.warning("task_finished not sent: the task cannot be read here", exc_info=True)
        return
    task_finished.send(type(backend), task_result=result)
