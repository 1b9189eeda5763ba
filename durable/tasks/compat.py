"""Django's Tasks framework, from wherever this Django has it.

Django 6 ships it as ``django.tasks``; on Django 5.2 the ``django-tasks``
package is the same API under ``django_tasks``. Everything in ``durable.tasks``
imports the framework from here, so there is one code path for both. Only the
exception names differ (Django 6 dropped the ``Error`` suffix).
"""

from __future__ import annotations

try:  # Django 6.x
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK = "django_tasks"

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
