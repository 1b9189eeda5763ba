"""Django's Tasks framework (``django.tasks`` / ``django_tasks``) on the durable engine.

``DurableBackend`` is the backend to name in ``TASKS``; ``step``/``astep`` and
``expect_steps`` make parts of a task durable; ``task_options`` sets a task's
retry options. This module is the public face of the package: it imports the
backend and the steps, so a module of the engine below the operations must not
import anything from ``durable.tasks`` (see docs/explanation/architecture.md).

Layout: ``policy`` (pure: statuses, options, step keys), ``compat`` (the
framework from Django 6 or the backport), ``backend`` (enqueue and results),
``operation`` (``django.task``, the operation every task job runs as),
``steps`` (durable steps inside a task) and ``describe`` (a task job as the
API and the dashboard show it).
"""

from __future__ import annotations

from .backend import DurableBackend
from .policy import task_options
from .steps import astep, expect_steps, step


class TaskCancelled(Exception):
    """The last error of a task cancelled from the dashboard, the API or a command."""


class WorkerLost(Exception):
    """The error of an attempt whose worker stopped mid-task (crash, SIGKILL, power loss)."""


__all__ = [
    "DurableBackend",
    "TaskCancelled",
    "WorkerLost",
    "astep",
    "expect_steps",
    "step",
    "task_options",
]
