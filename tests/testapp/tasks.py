"""Django tasks (``@task``) for the DurableBackend tests; side effects go to files the tests read.

Worker subprocesses import this module only when they claim a job of one of its
tasks, like any task module.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from durable.tasks import astep, expect_steps, step, task_options
from durable.tasks.compat import FRAMEWORK

if FRAMEWORK == "django.tasks":  # pragma: no cover - Django 6
    from django.tasks import task
else:
    from django_tasks import task


def append(path: str, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails")
def echo(*args: Any, **kwargs: Any) -> dict:
    return {"args": args, "kwargs": kwargs, "nested": [{"t": (1, 2)}, None, 1.5, True]}


@task
def record(path: str, label: str) -> str:
    append(path, label)
    return label


@task
@task_options(max_attempts=2, backoff_base=0)
def fail(message: str) -> None:
    raise ValueError(message)


@task
@task_options(max_attempts=5, backoff_base=0, non_retryable=[PermissionError])
def refuse() -> None:
    raise PermissionError("not yours")


@task
@task_options(max_attempts=1)
def leave(kind: str) -> None:
    if kind == "exit":
        raise SystemExit(3)
    raise KeyboardInterrupt


@task(takes_context=True)
@task_options(max_attempts=3, backoff_base=0)
def with_context(context: Any, fail_first: int = 0) -> dict:
    if context.attempt <= fail_first:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    result = context.task_result
    return {"attempt": context.attempt, "id": result.id, "workers": len(result.worker_ids)}


@task
async def add_async(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
def not_json() -> Any:
    return {1, 2}


def _work(path: str, index: int, hold_at: int) -> int:
    append(path, f"begin {index}")
    hold = Path(path + ".hold")
    deadline = time.monotonic() + 60
    while index == hold_at and hold.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # held until the test removes the file (or kills the worker)
    append(path, f"done {index}")
    return index * 10


@task
@task_options(backoff_base=0)
def stepped(path: str, steps: int = 3, hold_at: int = -1) -> int:
    """Step ``i`` writes ``begin i`` then ``done i``; the total is the sum of their results.

    Step ``hold_at`` waits between the two while ``<path>.hold`` exists.
    """
    expect_steps(steps)
    total = 0
    for index in range(steps):
        total += step(f"part:{index}", _work, path, index, hold_at)
    return total


@task
async def stepped_async(path: str, steps: int = 2) -> list:
    async def one(index: int) -> int:
        await asyncio.sleep(0)
        append(path, f"done {index}")
        return index

    return [await astep(f"a:{index}", one, index) for index in range(steps)]


@task
@task_options(max_attempts=3, backoff_base=0)
def fails_after_step(path: str) -> str:
    """Step one succeeds; the body then fails once (while ``path``.fail exists)."""
    first = step("one", _work, path, 1, -1)
    marker = Path(path + ".fail")
    if marker.exists():
        marker.unlink()
        raise RuntimeError("the body fails once after step one")
    return f"after {first}"


@task
def duplicate_steps() -> None:
    step("same", int, 1)
    step("same", int, 2)
