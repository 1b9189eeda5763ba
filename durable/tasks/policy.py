"""How a durable job reads as a Django task, and the tasks' retry options: pure functions.

No ORM, no clock, no framework import: the backend, the worker's operation, the
dashboard and the API all map a job row through these, and tests/unit pins the
tables down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from ..states import JobState, OnRestart

# The one operation every task job runs as; the task's function path is in its input.
TASK_OPERATION = "django.task"
# The unit result that holds a finished task's return value (steps use "step:<name>").
RETURN_KEY = "task:return"
STEP_PREFIX = "step:"
MAX_STEP_NAME = 200  # a unit key is at most 255 characters
CANCELLED_ERROR = "durable.tasks.TaskCancelled"

# The framework's statuses (TaskResultStatus values) for each job state.
# A paused job is not finished: it runs again once resumed, so it reads as READY;
# a cancelling one is still on its worker until the next step boundary.
STATUS_OF_STATE = {
    JobState.QUEUED: "READY",
    JobState.PAUSED: "READY",
    JobState.RUNNING: "RUNNING",
    JobState.CANCELLING: "RUNNING",
    JobState.COMPLETED: "SUCCESSFUL",
    JobState.FAILED: "FAILED",
    JobState.CANCELLED: "FAILED",
}


def task_status(state: str) -> str:
    """The framework's status (READY, RUNNING, SUCCESSFUL, FAILED) of a job state."""
    return STATUS_OF_STATE[JobState(state)]


# Failures the engine records by a bare name that is no builtin (restart recovery's).
ENGINE_ERRORS = {"WorkerLost": "durable.tasks.WorkerLost"}


def exception_path(error_class: str) -> str:
    """A dotted class path ``import_string`` resolves: the engine writes builtins bare."""
    if "." in error_class:
        return error_class
    return ENGINE_ERRORS.get(error_class, f"builtins.{error_class}")


def task_errors(errors: Iterable[Mapping[str, Any]], *, state: str, reason: str) -> list[dict]:
    """One ``{exception_class_path, traceback, message}`` per failed attempt, oldest first.

    A cancelled task ends FAILED with a last error ``durable.tasks.TaskCancelled``
    (its "traceback" says who cancelled it), so ``errors`` is never empty for a
    FAILED task and a caller can tell a cancel from a crash.
    """
    found = [
        {
            "exception_class_path": exception_path(str(entry.get("error_class") or "Exception")),
            "traceback": str(entry.get("traceback") or entry.get("message") or ""),
            "message": str(entry.get("message") or ""),
        }
        for entry in errors
    ]
    if state == JobState.CANCELLED:
        text = reason or "cancelled"
        found.append({"exception_class_path": CANCELLED_ERROR, "traceback": text, "message": text})
    return found


@dataclass(frozen=True)
class Run:
    worker_id: str
    at: datetime


def task_runs(events: Iterable[tuple[str, Mapping[str, Any], datetime]]) -> list[Run]:
    """The runs of a task from its ``started`` and ``rescheduled`` events, in order.

    Every claim writes ``started``; a claim whose worker turned the task away
    before running it (it lacked the task's code) is followed straight away by
    ``rescheduled`` and is no run. These are the framework's ``worker_ids``, so
    ``attempts`` counts every run, including one a crash or a SIGTERM cut short.
    """
    runs: list[Run] = []
    pending: Run | None = None
    for kind, data, at in events:
        if kind == "started":
            if pending is not None:
                runs.append(pending)
            pending = Run(str(data.get("worker") or ""), at)
        elif kind == "rescheduled":
            pending = None
    if pending is not None:
        runs.append(pending)
    return runs


def cancel_reason(events: Iterable[tuple[str, Mapping[str, Any], datetime]], reason: str) -> str:
    """Who cancelled: a running task's cancel is requested by one person and completed
    by its worker, so the job's reason may not name them; the request's event does."""
    actor = ""
    for kind, data, _at in events:
        if kind in ("cancel_requested", "cancelled") and data.get("actor"):
            actor = str(data["actor"])
    if actor and actor not in reason:
        return f"cancelled by {actor}"
    return reason or "cancelled"


def step_key(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("a step needs a non-empty string name")
    if len(name) > MAX_STEP_NAME:
        raise ValueError(f"step name longer than {MAX_STEP_NAME} characters: {name[:40]!r}…")
    return STEP_PREFIX + name


def missing_code(path: str, missing_module: str | None) -> bool:
    """Whether ``ModuleNotFoundError(name=missing_module)`` means the task's own module is absent.

    True for the task's module or a package above it (this worker runs other
    code than the one that enqueued); False for a module the task's module
    imports (a bug or a missing dependency of the task: an ordinary failure).
    """
    module = path.rpartition(".")[0]
    if not missing_module or not module:
        return False
    return module == missing_module or module.startswith(missing_module + ".")


# --- retry options -------------------------------------------------------------------

OPTION_NAMES = {
    "MAX_ATTEMPTS": "max_attempts",
    "BACKOFF_BASE": "backoff_base",
    "BACKOFF_MAX": "backoff_max",
    "ON_RESTART": "on_restart",
    "NON_RETRYABLE": "non_retryable",
    "CODE_WAIT": "code_wait",
}


@dataclass(frozen=True)
class TaskOptions:
    """How the engine runs a task: attempts, backoff, restart policy, errors not retried.

    ``code_wait``: seconds a task waits (queued, no attempt spent) for a worker
    that can import its module before it fails — a rolling deploy's window.
    """

    max_attempts: int = 3
    backoff_base: float = 2.0
    backoff_max: float = 300.0
    on_restart: str = OnRestart.RESUME
    non_retryable: tuple[str, ...] = ()
    code_wait: float = 600.0


def valid_options(values: Mapping[str, Any], base: TaskOptions | None = None) -> TaskOptions:
    """Check and apply ``values`` (lower-case names) over ``base``; ValueError says which."""
    base = base or TaskOptions()
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name == "max_attempts":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
                raise ValueError("max_attempts must be a whole number from 1 to 1000")
        elif name in ("backoff_base", "backoff_max", "code_wait"):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number of seconds, 0 or more")
            value = float(value)
        elif name == "on_restart":
            if value not in OnRestart.values:
                raise ValueError(f"on_restart must be one of {', '.join(OnRestart.values)}")
            value = str(value)
        elif name == "non_retryable":
            value = tuple(_class_path(item) for item in _as_list(value))
        else:
            raise ValueError(f"unknown task option {name!r}")
        changes[name] = value
    return replace(base, **changes)


def options_from_settings(options: Mapping[str, Any]) -> TaskOptions:
    """The backend's ``OPTIONS`` (upper-case keys, as Django's settings spell them)."""
    values = {}
    for key, value in options.items():
        if key not in OPTION_NAMES:
            known = ", ".join(sorted(OPTION_NAMES))
            raise ValueError(f"unknown OPTIONS key {key!r} (known: {known})")
        values[OPTION_NAMES[key]] = value
    return valid_options(values)


def _as_list(value: Any) -> list:
    if isinstance(value, str | type):
        return [value]
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    raise ValueError("non_retryable must be exception classes or their dotted paths")


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _class_path(item: Any) -> str:
    if isinstance(item, type) and issubclass(item, BaseException):
        return _dotted(item)
    if isinstance(item, str) and item and "." in item:
        return item
    raise ValueError(f"non_retryable: {item!r} is not an exception class or a dotted path")


F = TypeVar("F", bound=Callable[..., Any])

OPTIONS_ATTRIBUTE = "durable_task_options"


def task_options(**values: Any) -> Callable[[F], F]:
    """Per-task options, checked at import: put it *under* ``@task``.

    ``@task`` hands its function to the backend; this marks that function, so
    one decorator works with ``django.tasks`` and ``django_tasks`` alike::

        @task(priority=10)
        @task_options(max_attempts=10, non_retryable=[PermissionError])
        def send_invoice(invoice_id): ...

    Names: ``max_attempts``, ``backoff_base``, ``backoff_max``, ``on_restart``
    (``resume``, ``retry``, ``fail``), ``non_retryable``, ``code_wait``.
    Unset ones come from the backend's ``OPTIONS``.
    """
    valid_options(values)  # fail at import, not at the first run

    def mark(func: F) -> F:
        setattr(func, OPTIONS_ATTRIBUTE, dict(values))
        return func

    return mark


def options_for(func: Any, backend_options: TaskOptions) -> TaskOptions:
    """The backend's options with the function's own ``task_options`` over them."""
    return valid_options(getattr(func, OPTIONS_ATTRIBUTE, None) or {}, backend_options)


def is_non_retryable(exc: BaseException, paths: tuple[str, ...]) -> bool:
    """Whether ``exc`` is an instance of a class named in ``paths`` (subclasses included)."""
    if not paths:
        return False
    return any(_dotted(cls) in paths for cls in type(exc).__mro__)
