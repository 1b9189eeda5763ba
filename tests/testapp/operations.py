"""Test-only operations whose side effects the tests count.

- ``test.rows``: an atomic unit writes one SideEffect row (exactly-once evidence).
- ``test.append``: a unit appends ``key`` lines to a file, like an external
  system with no transactions; with ``idempotent`` it first checks the
  destination, as a file copy that verifies before writing would; with
  ``cooperative`` its sleep polls ``ctx.should_stop()`` and raises ``Stopping``.
- ``test.overrun``: ``test.append`` whose first attempt overruns a 1 s ``unit_timeout``.
- ``test.flaky``: fails its first ``fail_times`` attempts with a chosen error.
- ``test.gated``: turned away (``RetryLater``, no attempt spent) ``turn_aways`` times, like a gate.
- ``test.needs_credential``: needs the credential named by ``token_ref``.
- ``test.form``: takes its input from a Django form (the dashboard's "New job").
- ``test.one_per_target``: privileged, one unfinished job per target (``unique_key``).
- ``test.close_raises``: its units iterable raises in ``close()``, after the last commit.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django import forms
from django.utils import timezone

from durable.errors import InputRejected, NonRetryable, RetryLater, Stopping, Unavailable
from durable.operations import Access, JobContext, Operation, Unit, register

from .models import SideEffect


def counted_units(ctx: JobContext) -> Iterator[Unit]:
    start = (ctx.checkpoint or {}).get("next", 0)
    for index in range(start, ctx.input.get("units", 3)):
        yield Unit(key=f"u{index}", payload={"index": index}, checkpoint={"next": index + 1})


@register
class Rows(Operation):
    name = "test.rows"
    atomic_units = True
    max_attempts = 10

    def total_units(self, ctx: JobContext) -> int:
        return ctx.input.get("units", 3)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        return counted_units(ctx)

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        time.sleep(ctx.input.get("sleep", 0))
        SideEffect.objects.create(job_id=ctx.job_id, key=unit.key, worker=ctx.worker_id)
        return {"index": unit.payload["index"]}


@register
class Append(Operation):
    name = "test.append"
    max_attempts = 10

    def total_units(self, ctx: JobContext) -> int:
        return ctx.input.get("units", 3)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        return counted_units(ctx)

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        """Writes ``begin``/``done`` lines: ``<event> <job> <key> <pid> <time>``."""
        path = ctx.input["path"]
        if ctx.input.get("idempotent") and done_keys(path, ctx.job_id) & {unit.key}:
            return {"appended": False}
        with open(path, "a") as handle:
            handle.write(f"begin {ctx.job_id} {unit.key} {os.getpid()} {time.time():.6f}\n")
            handle.flush()
            if ctx.input.get("cooperative"):  # a long unit polling should_stop()
                deadline = time.monotonic() + ctx.input.get("sleep", 0)
                while time.monotonic() < deadline:
                    ctx.stop_if_requested()
                    time.sleep(0.02)
            else:
                time.sleep(ctx.input.get("sleep", 0))
            handle.write(f"done {ctx.job_id} {unit.key} {os.getpid()} {time.time():.6f}\n")
        return {"appended": True}


@register
class Overrun(Append):
    """``test.append`` with a 1 s ``unit_timeout``; only the first attempt sleeps."""

    name = "test.overrun"
    unit_timeout = 1.0

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        if ctx.attempt > 1:
            ctx = dataclasses.replace(ctx, input={**ctx.input, "sleep": 0})
        return super().run_unit(ctx, unit)


def done_keys(path: str, job_id: int) -> set[str]:
    if not os.path.exists(path):
        return set()
    with open(path) as handle:
        rows = (line.split() for line in handle)
        return {row[2] for row in rows if row[:2] == ["done", str(job_id)]}


@register
class Flaky(Operation):
    name = "test.flaky"
    max_attempts = 3
    backoff_base = 0.01
    backoff_max = 0.05

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        if not ctx.checkpoint:
            yield Unit(key="only", checkpoint={"done": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> None:
        if ctx.attempt > ctx.input.get("fail_times", 0):
            return
        kind = ctx.input.get("error", "retryable")
        message = ctx.input.get("message", "boom")
        if kind == "nonretryable":
            raise NonRetryable(message)
        if kind == "unavailable":
            raise Unavailable(message)
        if kind == "stopping":  # Stopping although nothing asked the unit to stop
            raise Stopping(message)
        if kind == "retry_later":
            raise RetryLater(message, at=timezone.now() + timedelta(seconds=ctx.input["delay"]))
        raise RuntimeError(message)


@register
class Gated(Operation):
    """Turned away ``turn_aways`` times before its one unit runs, like a closed gate."""

    name = "test.gated"

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        if not ctx.checkpoint:
            yield Unit(key="only", checkpoint={"done": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> None:
        tries = SideEffect.objects.filter(job_id=ctx.job_id, key="try").count()
        SideEffect.objects.create(job_id=ctx.job_id, key="try", worker=ctx.worker_id)
        if tries < ctx.input.get("turn_aways", 0):
            raise RetryLater(f"gate closed (try {tries + 1})", at=timezone.now(),
                             consume_attempt=False)  # fmt: skip


@register
class NeedsCredential(Operation):
    name = "test.needs_credential"

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        if not ctx.checkpoint:
            yield Unit(key="only", checkpoint={"done": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, int]:
        secret = ctx.credential(ctx.input["token_ref"])
        if ctx.input.get("leak"):
            raise RuntimeError(f"provider said no to {secret}")
        return {"length": len(secret)}


@register
class FlakyThenPause(Flaky):
    name = "test.flaky_pause"
    on_exhausted = "paused"


@register
class ActMidway(Operation):
    """At unit ``act_at`` an operator action hits the job while that unit runs."""

    name = "test.act"

    def total_units(self, ctx: JobContext) -> int:
        return ctx.input.get("units", 4)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        return counted_units(ctx)

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        from durable import jobs

        if unit.payload["index"] == ctx.input.get("act_at", 1):
            jobs.act(ctx.input["action"], [ctx.job_id], actor="operator")
        SideEffect.objects.create(job_id=ctx.job_id, key=unit.key, worker=ctx.worker_id)
        return None


@register
class Ticks(Operation):
    """Each unit sleeps ``sleep`` seconds and logs a ``tick`` event: a job whose event
    log grows while a client follows it (the API's event-stream tests)."""

    name = "test.ticks"

    def total_units(self, ctx: JobContext) -> int:
        return ctx.input.get("units", 3)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        return counted_units(ctx)

    def run_unit(self, ctx: JobContext, unit: Unit) -> None:
        time.sleep(ctx.input.get("sleep", 0))
        ctx.event("tick", f"unit {unit.payload['index']}", index=unit.payload["index"])


@register
class HttpCalls(Operation):
    """One ``durable.http`` GET per path in ``paths`` to provider ``provider`` (default "api")."""

    name = "test.http_calls"
    max_attempts = 4

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        start = (ctx.checkpoint or {}).get("next", 0)
        for index in range(start, len(ctx.input["paths"])):
            yield Unit(key=f"call:{index}", payload=index, checkpoint={"next": index + 1})

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        from durable import http

        url = ctx.input["base"] + ctx.input["paths"][unit.payload]
        response = http.request(ctx, ctx.input.get("provider", "api"), "GET", url)
        return {"status": response.status, "bytes": len(response.content)}


class CopyForm(forms.Form):
    """The "New job" page renders this instead of a JSON field (``Operation.input_form``)."""

    source = forms.CharField(max_length=100, help_text="Where to copy from.")
    copies = forms.IntegerField(min_value=1, max_value=10, initial=1)
    not_before = forms.DateField(required=False)


@register
class FormInput(Operation):
    """An operation with an ``input_form``; ``clean_input`` refuses one source by name."""

    name = "test.form"
    label = "Copy (form input)"
    input_form = CopyForm

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("source") == "/etc/shadow":
            raise InputRejected("source", "that file is off limits")
        return data

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        if not ctx.checkpoint:
            yield Unit(key="only", checkpoint={"done": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> None:
        return None


@register
class OnePerTarget(Operation):
    """One unfinished job per ``target`` (``Operation.unique_key``), like a restore."""

    name = "test.one_per_target"
    access = Access.PRIVILEGED

    def unique_key(self, data: dict[str, Any]) -> str:
        return f"target:{data.get('target', '')}"

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        if not ctx.checkpoint:
            yield Unit(key="only", checkpoint={"done": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> None:
        return None


class _CloseRaises:
    """A units iterable whose ``close()`` raises once the job is done with it."""

    def __init__(self, units: Iterator[Unit]) -> None:
        self._units = units

    def __iter__(self) -> Iterator[Unit]:
        return self._units

    def close(self) -> None:
        raise RuntimeError("close() failed")


@register
class CloseRaises(Operation):
    """``test.close_raises``: one-unit jobs whose units iterable raises in ``close()``,
    after the last unit's commit (which may have claimed the thread's next job)."""

    name = "test.close_raises"

    def total_units(self, ctx: JobContext) -> int:
        return ctx.input.get("units", 1)

    def units(self, ctx: JobContext) -> Any:
        return _CloseRaises(counted_units(ctx))

    def run_unit(self, ctx: JobContext, unit: Unit) -> None:
        return None
