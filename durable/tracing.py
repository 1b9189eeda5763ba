"""OpenTelemetry traces of jobs, optional and free when unused.

A job is one trace from the code that enqueued it to its last unit, even when
the worker running it dies: the enqueuing code's trace context is stored on the
job row (W3C ``traceparent``/``tracestate``, a few hundred bytes), and every
attempt's span — the first, and the one a new worker makes after a reclaim —
is a child of that context. Units are children of their attempt, outbound HTTP
calls children of their unit.

Only the OpenTelemetry *API* is used; the site chooses the SDK, exporter and
sampler by installing a ``TracerProvider`` (see "Monitor it" in the docs).
Without the API package nothing here imports anything, and with it but without
a provider (the API's proxy), nothing is stored on the job and no span is made:
a job then pays one attribute lookup per hook.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from django.conf import settings

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the "tracing" extra is not installed: every hook is a no-op
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .models import Job
    from .operations import JobContext, Unit

TRACER_NAME = "durable"
# A carrier is two headers; anything longer was not written by a propagator of ours.
MAX_CONTEXT_CHARS = 2048

# Attribute names: OpenTelemetry's messaging conventions where one fits, ours otherwise.
JOB_ID = "messaging.message.id"
OPERATION = "durable.operation"
QUEUE = "messaging.destination.name"
ATTEMPT = "durable.attempt"
LEASE_EPOCH = "durable.lease_epoch"
WORKER = "durable.worker_id"
UNIT_KEY = "durable.unit.key"
UNIT_INDEX = "durable.unit.index"
OUTCOME = "durable.outcome"
SYSTEM = "messaging.system"


def active() -> bool:
    """Is a tracing SDK configured? Checked per call: a site may install its provider late."""
    if trace is None or not getattr(settings, "DURABLE_TRACING", True):
        return False
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _tracer() -> Any:
    return trace.get_tracer(TRACER_NAME)


def context_for_enqueue(operation: str, queue: str) -> str:
    """The trace context to store with a new job: a short ``enqueue`` span's.

    The span is a child of whatever span is current (the web request's, a
    task's), so the job's trace continues the caller's; with no current span
    the job starts a trace of its own. Returns "" when tracing is off.
    """
    if not active():
        return ""
    carrier: dict[str, str] = {}
    with _tracer().start_as_current_span(
        f"enqueue {operation}",
        kind=SpanKind.PRODUCER,
        attributes={SYSTEM: "durable", OPERATION: operation, QUEUE: queue},
    ):
        propagate.inject(carrier)
    text = json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else ""
    return text if len(text) <= MAX_CONTEXT_CHARS else ""


def parse_context(text: str) -> dict[str, str]:
    """The carrier stored on a job; {} for anything that is not one (never raises)."""
    if not text or len(text) > MAX_CONTEXT_CHARS:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


@contextmanager
def attempt_span(job: Job, *, attempt: int, lease_epoch: int, worker_id: str) -> Iterator[None]:
    """The span of one attempt at ``job``, a child of the context stored at enqueue."""
    if not active():
        yield
        return
    parent = propagate.extract(parse_context(job.trace_context))
    with _tracer().start_as_current_span(
        f"run {job.operation}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            SYSTEM: "durable",
            JOB_ID: str(job.pk),
            OPERATION: job.operation,
            QUEUE: job.queue,
            ATTEMPT: attempt,
            LEASE_EPOCH: lease_epoch,
            WORKER: worker_id,
        },
        # The worker settles every failure itself (a failed attempt is recorded by
        # failed()); an exception escaping execute() is the worker's own bug.
        record_exception=True,
        set_status_on_exception=True,
    ):
        yield


@contextmanager
def unit_span(ctx: JobContext, unit: Unit) -> Iterator[None]:
    """The span of one unit's run and verify, inside its attempt's."""
    if not active():
        yield
        return
    span = _tracer().start_span(
        f"unit {ctx.operation}",
        attributes={
            JOB_ID: str(ctx.job_id),
            OPERATION: ctx.operation,
            UNIT_KEY: unit.key,
            UNIT_INDEX: ctx.units_done,
            LEASE_EPOCH: ctx.lease_epoch,
            WORKER: ctx.worker_id,
        },
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    except BaseException as exc:
        # The class only: the message may quote a secret the engine redacts later.
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _current() -> Span | None:
    if not active():
        return None
    span = trace.get_current_span()
    return span if span.is_recording() else None


def outcome(name: str) -> None:
    """Note how the current attempt ended (completed, failed, lease_lost, stopped…)."""
    if (span := _current()) is not None:
        span.set_attribute(OUTCOME, name)


def failed(entry: Mapping[str, Any]) -> None:
    """Record a failed attempt from the engine's error entry, already redacted."""
    if (span := _current()) is None:
        return
    span.set_attribute(OUTCOME, "failed")
    span.set_attribute("error.type", str(entry.get("error_class", "")))
    span.add_event(
        "exception",
        {
            "exception.type": str(entry.get("error_class", "")),
            "exception.message": str(entry.get("message", "")),
            "durable.retryable": bool(entry.get("retryable", False)),
        },
    )
    span.set_status(Status(StatusCode.ERROR, str(entry.get("error_class", ""))))


def client_span(method: str, url: Any, headers: MutableMapping[str, str]) -> Any:
    """A CLIENT span for one outbound request, its context injected into ``headers``.

    ``url`` is an ``httpx.URL``; the span carries its host, port, scheme and
    path — never the query string, which may hold a key.
    """
    if not active():
        return nullcontext(None)
    return _client_span(method, url, headers)


@contextmanager
def _client_span(method: str, url: Any, headers: MutableMapping[str, str]) -> Iterator[Span]:
    with _tracer().start_as_current_span(
        method,
        kind=SpanKind.CLIENT,
        attributes={
            "http.request.method": method,
            "server.address": url.host,
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "url.scheme": url.scheme,
            "url.path": url.path,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        propagate.inject(headers)
        yield span


def response_status(span: Span | None, status: int) -> None:
    if span is None:
        return
    span.set_attribute("http.response.status_code", status)
    if status >= 400:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def request_failed(span: Span | None, exc: BaseException) -> None:
    if span is None:
        return
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
