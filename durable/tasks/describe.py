"""A task job as plain JSON for the dashboard and the API, without importing the task.

A web server need not have (or trust) every task's module: the function path,
arguments, status, return value and errors all come from the job's rows.
"""

from __future__ import annotations

from typing import Any

from ..models import Job, UnitResult
from ..states import FINISHED_STATES, JobState
from . import policy
from .policy import RETURN_KEY, TASK_OPERATION

MAX_SHOWN_ERRORS = 20  # the engine keeps the newest 20 anyway


def is_task(job: Job) -> bool:
    return job.operation == TASK_OPERATION


def task_summary(job: Job) -> dict[str, Any] | None:
    """What a list shows of a task (no query): path, backend, status, steps."""
    if not is_task(job):
        return None
    data = job.input or {}
    checkpoint = job.checkpoint if isinstance(job.checkpoint, dict) else {}
    return {
        "path": data.get("task", ""),
        "name": str(data.get("task", "")).rpartition(".")[2],
        "backend": data.get("backend", "default"),
        "status": policy.task_status(job.state),
        "args": data.get("args", []),
        "kwargs": data.get("kwargs", {}),
        "run_after": data.get("run_after"),
        "steps_done": checkpoint.get("steps_done"),
        "steps_total": checkpoint.get("steps_total"),
        "current_step": checkpoint.get("step"),
    }


def task_detail(job: Job, *, tracebacks: bool = True) -> dict[str, Any] | None:
    """``task_summary`` plus the return value (once successful) and the errors."""
    summary = task_summary(job)
    if summary is None:
        return None
    found = UnitResult.objects.filter(job_id=job.pk, key=RETURN_KEY).values_list(
        "result", flat=True
    )
    returned = list(found[:1]) if job.state == JobState.COMPLETED else []
    events = list(
        job.events.filter(kind__in=("cancel_requested", "cancelled")).values_list(
            "kind", "data", "created_at"
        )
    )
    errors = policy.task_errors(
        job.errors or [], state=job.state, reason=policy.cancel_reason(events, job.reason)
    )[-MAX_SHOWN_ERRORS:]
    if not tracebacks:
        errors = [{k: v for k, v in e.items() if k != "traceback"} for e in errors]
    return {
        **summary,
        "has_return_value": bool(returned),
        "return_value": returned[0] if returned else None,
        "errors": errors,
    }


def task_result_json(job: Job) -> dict[str, Any] | None:
    """The API's view of a task result: the framework's TaskResult fields, no traceback.

    Tracebacks stay on the dashboard, as for every job's errors in the API.
    """
    detail = task_detail(job, tracebacks=False)
    if detail is None:
        return None
    events = job.events.filter(kind__in=("started", "rescheduled")).order_by("seq")
    runs = policy.task_runs(events.values_list("kind", "data", "created_at"))
    return {
        "id": str(job.pk),
        "task": detail["path"],
        "backend": detail["backend"],
        "status": detail["status"],
        "finished": job.state in FINISHED_STATES,
        "queue": job.queue,
        "priority": job.priority,
        "args": detail["args"],
        "kwargs": detail["kwargs"],
        "has_return_value": detail["has_return_value"],
        "return_value": detail["return_value"],
        "errors": [
            {"exception_class_path": e["exception_class_path"], "message": e["message"]}
            for e in detail["errors"]
        ],
        "worker_ids": [run.worker_id for run in runs],
        "attempts": len(runs),
        "steps_done": detail["steps_done"],
        "steps_total": detail["steps_total"],
        "enqueued_at": job.created_at,
        "started_at": runs[0].at if runs else None,
        "last_attempted_at": runs[-1].at if runs else None,
        "finished_at": job.finished_at if job.state in FINISHED_STATES else None,
    }
