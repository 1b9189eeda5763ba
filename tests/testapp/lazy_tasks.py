"""A task module that says when it is imported (TEST_TASK_IMPORT_MARKER): the worker must
not import it before it claims a job of its task."""

from __future__ import annotations

import os
from pathlib import Path

from durable.tasks.compat import FRAMEWORK

if FRAMEWORK == "django.tasks":  # pragma: no cover - Django 6
    from django.tasks import task
else:
    from django_tasks import task

if os.environ.get("TEST_TASK_IMPORT_MARKER"):
    with Path(os.environ["TEST_TASK_IMPORT_MARKER"]).open("a") as handle:
        handle.write(f"imported by {os.getpid()}\n")


@task(queue_name="low")
def lazy(value: int) -> int:
    return value * 2
