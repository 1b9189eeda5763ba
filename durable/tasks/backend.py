"""``DurableBackend``: Django's Tasks framework on the durable engine.

Each ``task.enqueue()`` is one durable job of the operation ``django.task``
(lease, fencing, retries with backoff, reclaim after a crash, pause/cancel,
events, retention); its result id is the job's id. Results are read from the
job row, its events and its unit results, from any process.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .. import jobs
from ..models import Job, JobEvent, UnitResult
from ..rules import queue_name_problem
from ..states import FINISHED_STATES, JobState
from . import policy
from .compat import (
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
)
from .policy import RETURN_KEY, TASK_OPERATION

# The events a result is read from: runs (started, rescheduled) and who cancelled.
TASK_EVENTS = ("started", "rescheduled", "cancel_requested", "cancelled")


class DurableBackend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "durable.tasks.DurableBackend", "QUEUES": [...],
    "OPTIONS": {"MAX_ATTEMPTS": 3, ...}}}`` — see docs/how-to/write-a-django-task.md,
    "Django tasks"."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.options_error = ""
        try:
            self.task_options = policy.options_from_settings(self.options or {})
        except (ValueError, TypeError, AttributeError) as exc:
            # Reported by the system check (and on enqueue), not while settings load.
            self.options_error = str(exc)
            self.task_options = policy.TaskOptions()

    # --- enqueue ----------------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        problem = queue_name_problem(task.queue_name)
        if problem is not None:
            raise InvalidTaskError(f"Queue name {task.queue_name[:40]!r} {problem}.")

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult:
        """Validate by the framework's rules, then persist one job and its ``enqueued`` event.

        Inside a transaction the job commits or rolls back with the caller's own
        writes (it is a row of the same database); for on_commit see
        docs/how-to/write-a-django-task.md, "Transactions and enqueue on commit".
        """
        if self.options_error:
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]['OPTIONS']: {self.options_error}")
        self.validate_task(task)
        options = policy.options_for(task.func, self.task_options)
        data: dict[str, Any] = {
            "task": task.module_path,
            "backend": self.alias,
            "args": normalize_json(args),
            "kwargs": normalize_json(kwargs),
        }
        if task.run_after is not None:
            data["run_after"] = task.run_after.isoformat()
        job = jobs.enqueue(
            TASK_OPERATION,
            data,
            queue=task.queue_name,
            priority=task.priority,
            on_restart=options.on_restart,
            max_attempts=options.max_attempts,
            run_after=task.run_after,
        )
        result = self.result_of(job, task=task, events=[])
        task_enqueued.send(type(self), task_result=result)
        return result

    # --- results ------------------------------------------------------------------------

    def get_result(self, result_id: str, *, task: Any = None) -> TaskResult:
        """The task result with id ``result_id`` (a job id), read fresh from the database.

        ``task``: the imported task, when the caller has it (the worker); else
        the task's module is imported here.
        """
        try:
            pk = int(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.filter(pk=pk, operation=TASK_OPERATION).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result_of(job, task=task)

    def running_result(self, job_id: int, data: dict, task: Any) -> TaskResult:
        """The result a worker hands ``task_started`` and the task's context: one query.

        The claim wrote a ``started`` event, so the events joined to their job
        carry everything a RUNNING result shows.
        """
        fields = ("kind", "data", "created_at", "job__created_at", "job__priority", "job__queue")
        rows = list(
            JobEvent.objects.filter(job_id=job_id, kind__in=TASK_EVENTS)
            .order_by("seq")
            .values_list(*fields, "job__errors")
        )
        if not rows:  # pragma: no cover - a claimed task always has its started event
            return self.get_result(str(job_id), task=task)
        _kind, _data, _at, created_at, priority, queue, errors = rows[0]
        job = Job(
            pk=job_id,
            input=data,
            state=JobState.RUNNING,
            created_at=created_at,
            priority=priority,
            queue=queue,
            errors=errors or [],
        )
        return self.result_of(job, task=task, events=[row[:3] for row in rows])

    def result_of(
        self, job: Job, *, task: Any = None, events: list[tuple] | None = None
    ) -> TaskResult:
        data = job.input
        if task is None:
            try:
                task = import_task(data["task"])
            except (ImportError, TypeError) as exc:
                raise InvalidTaskError(
                    f"the task of result {job.pk} cannot be imported here: {exc}"
                ) from exc
        run_after = datetime.fromisoformat(data["run_after"]) if data.get("run_after") else None
        task = task.using(
            priority=job.priority,
            queue_name=job.queue,
            backend=data.get("backend", self.alias),
            run_after=run_after,
        )
        if events is None:
            events = list(
                job.events.filter(kind__in=TASK_EVENTS)
                .order_by("seq")
                .values_list("kind", "data", "created_at")
            )
        runs = policy.task_runs(events)
        status = TaskResultStatus(policy.task_status(job.state))
        value = None
        if job.state == JobState.COMPLETED:
            value = (
                UnitResult.objects.filter(job_id=job.pk, key=RETURN_KEY)
                .values_list("result", flat=True)
                .first()
            )
        result = TaskResult(
            task=task,
            id=str(job.pk),
            status=status,
            enqueued_at=job.created_at,
            started_at=runs[0].at if runs else None,
            finished_at=job.finished_at if job.state in FINISHED_STATES else None,
            last_attempted_at=runs[-1].at if runs else None,
            args=data.get("args", []),
            kwargs=data.get("kwargs", {}),
            backend=data.get("backend", self.alias),
            errors=[
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                for e in policy.task_errors(
                    job.errors or [],
                    state=job.state,
                    reason=policy.cancel_reason(events, job.reason),
                )
            ],
            worker_ids=[run.worker_id for run in runs],
        )
        object.__setattr__(result, "_return_value", value)
        return result

    # --- system checks --------------------------------------------------------------------

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from super().check(**kwargs)
        where = f"TASKS[{self.alias!r}]"
        if self.options_error:
            yield checks.Error(
                f"{where}['OPTIONS']: {self.options_error}",
                hint="Options: MAX_ATTEMPTS, BACKOFF_BASE, BACKOFF_MAX, ON_RESTART, "
                "NON_RETRYABLE, CODE_WAIT (docs: how-to/write-a-django-task.md, Options).",
                id="durable.E201",
            )
        if not apps.is_installed("durable"):
            yield checks.Error(
                f"{where} uses DurableBackend but 'durable' is not in INSTALLED_APPS.",
                id="durable.E202",
            )
        for queue in sorted(self.queues):
            problem = queue_name_problem(queue)
            if problem is not None:
                message = f"{where}['QUEUES']: {queue[:40]!r} {problem}."
                yield checks.Error(message, id="durable.E203")


def import_task(path: str) -> Any:
    """The ``Task`` at ``path``; ImportError if it cannot be imported, TypeError if not a task."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(
            f"{path!r} is {type(found).__name__}, not a task (a function decorated with @task)"
        )
    return found


def backend_for(alias: str) -> DurableBackend:
    """The ``DurableBackend`` named ``alias`` in this process's ``TASKS``."""
    backend = task_backends[alias]
    if not isinstance(backend, DurableBackend):
        raise TypeError(f"TASKS[{alias!r}] is {type(backend).__name__}, not a DurableBackend")
    return backend
