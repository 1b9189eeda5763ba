"""Django's Tasks framework (``django.tasks`` / ``django_tasks``) on the durable engine.

``DurableBackend`` is the backend to name in ``TASKS``; ``step``/``astep`` and
``expect_steps`` make parts of a task durable; ``task_options`` sets a task's
retry options. The backend (and with it the framework) is imported on first
use, so the engine loads without touching the framework.
"""

from __future__ import annotations

from typing import Any

from .policy import task_options
from .steps import astep, expect_steps, step


class TaskCancelled(Exception):
    """The last error of a task cancelled from the dashboard, the API or a command."""


class WorkerLost(Exception):
    """The error of an attempt whose worker stopped mid-task (crash, SIGKILL, power loss)."""


def __getattr__(name: str) -> Any:
    if name == "DurableBackend":
        from .backend import DurableBackend

        return DurableBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DurableBackend",
    "TaskCancelled",
    "WorkerLost",
    "astep",
    "expect_steps",
    "step",
    "task_options",
]
