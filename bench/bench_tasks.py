"""Django tasks measured by bench/tasks.py (imported by its worker processes)."""

from __future__ import annotations

from durable.tasks import expect_steps, step
from durable.tasks.compat import FRAMEWORK

if FRAMEWORK == "django.tasks":  # pragma: no cover - Django 6
    from django.tasks import task
else:
    from django_tasks import task


@task
def nothing() -> None:
    """The task counterpart of one durable.noop unit."""


@task
def three_steps() -> int:
    expect_steps(3)
    return sum(step(f"s{n}", int, n) for n in range(3))
