"""Durable steps inside a plain ``@task`` function.

A task runs as one unit of the engine; ``step("name", fn, ...)`` makes a piece
of it a unit of its own: its JSON result is committed under the key
``step:<name>`` (fenced by the lease, with the checkpoint) before the task goes
on. When the task runs again — after a crash, a failed attempt, a SIGTERM, a
pause — every step already committed returns its stored result without running,
and only the step that was in flight runs again. So a step must be safe to
repeat, and the code between steps should be cheap and deterministic: it runs
again on every retry.

Outside a durable worker (another backend, a test calling the function) a step
simply calls ``fn``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async

from .. import lease as leases
from ..errors import NonRetryable, Stopping
from ..lease import Lease
from ..operations import JobContext
from ..states import JobState
from .compat import normalize_json
from .policy import step_key

log = logging.getLogger("durable.tasks")


@dataclass
class TaskRun:
    """The running task's view of its job, for the steps it takes."""

    ctx: JobContext
    lease: Lease
    done: dict[str, Any]  # step key -> committed result, read once when the run starts
    seen: set[str] = field(default_factory=set)
    position: int = 0  # steps passed in this run (skipped or committed)
    total: int | None = None

    def begin(self, name: str) -> tuple[bool, Any]:
        """(True, result) for a step committed by an earlier run; else (False, None)."""
        key = step_key(name)
        if key in self.seen:
            raise ValueError(
                f"step {name!r} was already taken in this run: give each step its own name "
                f"(in a loop, put the position or the item's id in it)"
            )
        self.seen.add(key)
        self.position += 1
        if key in self.done:
            log.info("step already done; skipping", extra={"job": self.ctx.job_id, "step": name})
            return True, self.done[key]
        # A step boundary: the worker is stopping, or the job was paused or cancelled.
        # Hand the job back now (no attempt spent); this step runs on the next claim.
        self.ctx.stop_if_requested()
        return False, None

    def finish(self, name: str, value: Any) -> Any:
        """Commit the step's result with the checkpoint; returns it as stored (JSON)."""
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as exc:
            raise NonRetryable(f"step {name!r} returned a value JSON cannot hold: {exc}") from exc
        events, self.ctx.pending_events = self.ctx.pending_events, []
        state = leases.commit_unit(
            self.lease,
            key=step_key(name),
            result=value,
            checkpoint={"step": name, "steps_done": self.position, "steps_total": self.total},
            units_total=self.total,
            events=events,
        )
        self.done[step_key(name)] = value
        self.ctx.units_done += 1
        self.ctx.checkpoint = {"step": name, "steps_done": self.position}
        if state in (JobState.PAUSED, JobState.CANCELLING):
            self.ctx.stop_requested.set()
            raise Stopping(f"the job is {state}: stopped after step {name!r}")
        return value


_current: contextvars.ContextVar[TaskRun | None] = contextvars.ContextVar(
    "durable_task_run", default=None
)


def current_run() -> TaskRun | None:
    return _current.get()


def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` once per task: its JSON result is checkpointed as ``name``.

    ::

        @task
        def import_account(account_id):
            expect_steps(3)
            rows = step("fetch", fetch_rows, account_id)
            saved = step("save", save_rows, rows)
            step("notify", notify_owner, account_id, saved)
            return saved

    Returns what ``fn`` returned as JSON (tuples become lists), the same on the
    first run and on every retry. Names are unique within a task. Inside
    ``transaction.atomic()`` the step's checkpoint commits with the block's rows.
    """
    run = _current.get()
    if run is None:
        return fn(*args, **kwargs)
    skipped, value = run.begin(name)
    if skipped:
        return value
    return run.finish(name, fn(*args, **kwargs))


async def astep(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``step`` for an ``async def`` task; ``fn`` may be a coroutine function or a plain one."""
    run = _current.get()
    if run is None:
        return await _call(fn, args, kwargs)
    skipped, value = run.begin(name)
    if skipped:
        return value
    value = await _call(fn, args, kwargs)
    # The worker thread's connection: the task's event loop runs inside async_to_sync.
    return await sync_to_async(run.finish, thread_sensitive=True)(name, value)


async def _call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    if iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)


def expect_steps(total: int) -> None:
    """Say how many steps this task takes, so the dashboard shows "n of N" as they finish."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError("expect_steps takes a whole number, 0 or more")
    run = _current.get()
    if run is not None:
        run.total = total
        run.ctx.units_total = total
