"""The HTTP surface: bearer tokens, JSON in and out, problem+json refusals.

No view uses cookies or sessions, so none needs CSRF protection: a browser
cannot attach a bearer token to a forged cross-site request. Every state
change goes through ``durable.jobs``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from functools import wraps
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from .. import jobs
from ..models import Job, JobEvent
from ..models.api import Client
from ..outage import describe, is_unreachable
from ..states import FINISHED_STATES, Action
from ..tasks.describe import task_result_json
from .auth import authenticate, authorize_job_action, authorize_operation
from .errors import FieldError, Refusal, invalid
from .openapi import build_document
from .parse import (
    MAX_ID,
    encode_cursor,
    find_unstorable,
    is_json_content_type,
    loads_json_object,
    parse_batch,
    parse_events_query,
    parse_idempotency_key,
    parse_list_query,
    parse_submission,
    request_digest,
    sse_comment,
    sse_event,
    sse_retry,
    wants_event_stream,
)
from .render import dumps, event_json, job_json
from .submission import submit, submit_batch

log = logging.getLogger("durable.api")

JSON = "application/json"
PROBLEM_JSON = "application/problem+json"
DEFAULT_MAX_BODY_BYTES = 256 * 1024
DEFAULT_STREAM_SECONDS = 25.0
DEFAULT_STREAM_POLL_SECONDS = 1.0
DEFAULT_STREAM_KEEPALIVE_SECONDS = 10.0
DEFAULT_MAX_STREAMS = 4
STREAMS_BUSY_RETRY_AFTER = 5  # seconds, for the 503 when every stream slot is taken
DATABASE_RETRY_AFTER = 5  # seconds, for the 503 while the database is unreachable
STREAM_RETRY_MS = 2000
STREAM_BATCH = 200
ACTIONS: dict[str, Callable[..., jobs.Outcome]] = {
    Action.CANCEL: jobs.cancel,
    Action.PAUSE: jobs.pause,
    Action.RESUME: jobs.resume,
    Action.RETRY: jobs.retry_now,
}


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


# --- responses ------------------------------------------------------------------------


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> HttpResponse:
    return HttpResponse(dumps(data), status=status, content_type=JSON, headers=headers)


def problem(refusal: Refusal) -> HttpResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(refusal.status).phrase,
        "status": refusal.status,
        "code": refusal.code,
        "detail": refusal.detail,
    }
    body.update(refusal.extra)
    if refusal.errors:
        body["errors"] = [{"field": e.field, "message": e.message} for e in refusal.errors]
    return HttpResponse(
        dumps(body), status=refusal.status, content_type=PROBLEM_JSON, headers=refusal.headers
    )


def refused(request: HttpRequest, refusal: Refusal) -> HttpResponse:
    """The problem+json answer, logged here instead of by Django.

    Django logs every 4xx response with the request attached, and the
    request's repr carries the query string — where a client may have put its
    token (``?access_token=…``). This line names the path only; Django skips
    a response marked as logged.
    """
    response = problem(refusal)
    log.warning(
        "api request refused",
        extra={
            "method": request.method,
            "path": request.path,
            "status": refusal.status,
            "code": refusal.code,
        },
    )
    # django.utils.log.log_response's own marker, which the stubs do not declare
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def database_unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """503 + Retry-After while the database cannot be reached: a client's retry will do.

    A 500 would say the request is wrong or the server broken, and the
    traceback of a refused connection tells nobody anything: one line is logged,
    without it.
    """
    refusal = Refusal(
        503,
        "database_unavailable",
        "the database cannot be reached right now; try again after Retry-After seconds",
        headers={"Retry-After": str(DATABASE_RETRY_AFTER)},
    )
    response = problem(refusal)
    log.warning(
        "api request failed: database unreachable",
        extra={"method": request.method, "path": request.path, "error": describe(exc)},
    )
    response._has_been_logged = True  # type: ignore[attr-defined]  # see refused()
    return response


def endpoint(scopes: dict[str, str | None]) -> Callable:
    """Wrap a view: method check, bearer authentication for the method's scope,
    Refusals rendered as problem+json, an unreachable database as a 503, and
    responses never cached.

    ``scopes`` maps each allowed method to the scope it needs (None: public).
    The view is called as ``view(request, client, **kwargs)``.
    """

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            try:
                if request.method not in scopes:
                    raise Refusal(
                        405,
                        "method_not_allowed",
                        f"{request.method} is not allowed here",
                        headers={"Allow": ", ".join(scopes)},
                    )
                scope = scopes[request.method]
                client = authenticate(request, scope) if scope else None
                response = view(request, client, **kwargs)
            except Refusal as refusal:
                response = refused(request, refusal)
            except (OperationalError, InterfaceError) as exc:
                if not is_unreachable(exc):
                    raise
                response = database_unavailable(request, exc)
            response["Cache-Control"] = "no-store"
            return response

        # Bearer tokens, no cookies: nothing for CSRF to protect. Not atomic even
        # under ATOMIC_REQUESTS: a 202 means committed, and a stream must not
        # hold a transaction open for its whole duration.
        return csrf_exempt(transaction.non_atomic_requests(wrapper))

    return decorate


def row_or_404(rows: QuerySet, pk: int, noun: str) -> Any:
    """The row of ``rows`` with this id (or its values), or a 404 naming the ``noun``."""
    # A larger id cannot exist and must not reach the database (BIGINT).
    row = rows.filter(pk=pk).first() if 0 < pk <= MAX_ID else None
    if row is None:
        raise Refusal(404, "not_found", f"there is no {noun} {pk}")
    return row


def _job_or_404(job_id: int) -> Job:
    return row_or_404(Job.objects.all(), job_id, "job")


def query_params(request: HttpRequest) -> dict[str, list[str]]:
    return dict(request.GET.lists())


def keyset_page(
    request: HttpRequest, rows: QuerySet, *, before_id: int | None, limit: int
) -> tuple[list[Any], str | None, str | None]:
    """One page of ``rows``, newest (highest id) first: (page, next_cursor, next URL).

    Keyset pagination on the id, for jobs and schedules alike: page N costs what
    page 1 costs, and rows added meanwhile never shift a page already handed out.
    """
    if before_id is not None:
        rows = rows.filter(pk__lt=before_id)
    page = list(rows.order_by("-pk")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    cursor = encode_cursor(page[-1].pk) if more else None
    next_url = None
    if cursor is not None:
        params = request.GET.copy()
        params["cursor"] = cursor
        next_url = f"{request.path}?{params.urlencode()}"
    return page, cursor, next_url


def no_content() -> HttpResponse:
    """204, without the Content-Type Django would add to an empty body."""
    response = HttpResponse(status=204)
    del response["Content-Type"]
    return response


# --- request bodies ---------------------------------------------------------------------


def read_json_body(request: HttpRequest) -> dict[str, Any]:
    """The body as a JSON object, or a precise 411/413/415/400.

    Read with ``request.read``, not ``request.body``: the API's own limit,
    ``DURABLE_API_MAX_BODY_BYTES``, is the one that applies (``request.body``
    would refuse anything above Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` and
    the 413 would name the wrong limit).
    """
    if not is_json_content_type(request.META.get("CONTENT_TYPE")):
        raise Refusal(
            415, "unsupported_media_type", "send the body as Content-Type: application/json"
        )
    if request.META.get("HTTP_TRANSFER_ENCODING"):
        # WSGI hands Django a chunked body as an empty one (no Content-Length), so
        # without this the answer would be "the request body is empty".
        raise Refusal(
            411,
            "length_required",
            "send the body with a Content-Length header; chunked request bodies are not accepted",
        )
    limit = int(_setting("DURABLE_API_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES))
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    too_large = Refusal(
        413,
        "body_too_large",
        f"the request body is larger than {limit} bytes (DURABLE_API_MAX_BODY_BYTES)",
    )
    if length > limit:
        raise too_large
    body = request.read(limit + 1)
    if len(body) > limit:
        raise too_large
    data = loads_json_object(body)
    where = find_unstorable(data)
    if where is not None:
        raise invalid(
            [FieldError(where, "must not contain NUL (U+0000) or unpaired surrogate characters")]
        )
    return data


# --- views ------------------------------------------------------------------------------


@endpoint({"GET": "jobs:read", "POST": "jobs:write"})
def jobs_view(request: HttpRequest, client: Client) -> HttpResponse:
    if request.method == "POST":
        return submit_job(request, client)
    return list_jobs(request)


def submit_job(request: HttpRequest, client: Client) -> HttpResponse:
    key = parse_idempotency_key(request.headers.get("Idempotency-Key"))
    data = read_json_body(request)
    submission = parse_submission(data)
    # Before the key is looked at: a replay is an answer to this client's request
    # now, and a refused request never uses a key up.
    operation = authorize_operation(request, client, submission.operation)
    # The digest covers the submission as it will be enqueued, not the bytes sent, so
    # equivalent requests (null or absent, 1 or 1.0, the operation's own priority) match.
    # The input is hashed as sent: an operation's clean_input may add what differs
    # from call to call (a backup's name is the time).
    submission = submission.with_defaults(
        queue=operation.queue, priority=operation.priority, on_restart=operation.on_restart
    )
    digest = request_digest("POST", "jobs", submission.fields())
    reply = submit(client, submission, key=key, digest=digest)
    response = HttpResponse(reply.body, status=reply.status, content_type=JSON)
    for name, value in reply.headers.items():
        response[name] = value
    if key is not None:
        response["Idempotent-Replayed"] = "true" if reply.replayed else "false"
    return response


@endpoint({"POST": "jobs:write"})
def jobs_batch_view(request: HttpRequest, client: Client) -> HttpResponse:
    """Many jobs of one operation in one request: all inputs checked, then one transaction."""
    key = parse_idempotency_key(request.headers.get("Idempotency-Key"))
    batch = parse_batch(read_json_body(request))
    operation = authorize_operation(request, client, batch.operation)
    batch = batch.with_defaults(
        queue=operation.queue, priority=operation.priority, on_restart=operation.on_restart
    )
    digest = request_digest("POST", "jobs/batch", batch.fields())
    reply = submit_batch(client, batch, key=key, digest=digest)
    response = HttpResponse(reply.body, status=reply.status, content_type=JSON)
    if key is not None:
        response["Idempotent-Replayed"] = "true" if reply.replayed else "false"
    return response


def list_jobs(request: HttpRequest) -> HttpResponse:
    """Newest first, keyset-paginated on id: page N costs what page 1 costs."""
    query = parse_list_query(query_params(request))
    rows = Job.objects.all()
    if query.states:
        rows = rows.filter(state__in=query.states)
    if query.operation is not None:
        rows = rows.filter(operation=query.operation)
    page, cursor, next_url = keyset_page(
        request, rows, before_id=query.before_id, limit=query.limit
    )
    return json_response(
        {"jobs": [job_json(job) for job in page], "next_cursor": cursor, "next": next_url}
    )


@endpoint({"GET": "jobs:read"})
def job_view(request: HttpRequest, client: Client, job_id: int) -> HttpResponse:
    return json_response(job_json(_job_or_404(job_id)))


@endpoint({"GET": "jobs:read"})
def job_result_view(request: HttpRequest, client: Client, job_id: int) -> HttpResponse:
    """A Django task's result (status, return value, errors), read from its job."""
    found = task_result_json(_job_or_404(job_id))
    if found is None:
        raise Refusal(404, "not_a_task", f"job {job_id} is not a Django task")
    return json_response(found)


@endpoint({"GET": "jobs:read"})
def job_events_view(request: HttpRequest, client: Client, job_id: int) -> HttpResponseBase:
    # The job is read before its events: state and event commit together, so a
    # job seen finished here has all its events visible to the next query, and
    # "finished" never makes a client stop before the last event.
    job = _job_or_404(job_id)
    query = parse_events_query(query_params(request), request.headers.get("Last-Event-ID"))
    if wants_event_stream(request.headers.get("Accept")):
        return stream_events(job, query.after)
    events = list(
        JobEvent.objects.filter(job_id=job.pk, seq__gt=query.after).order_by("seq")[
            : query.limit + 1
        ]
    )
    more = len(events) > query.limit
    events = events[: query.limit]
    return json_response(
        {
            "job_id": job.pk,
            "state": job.state,
            "finished": job.is_finished,
            "events": [event_json(event) for event in events],
            "next_after": events[-1].seq if events else query.after,
            "has_more": more,
        }
    )


class StreamSlots:
    """How many event streams this process serves at once, and the limit on that.

    A stream holds the gunicorn thread serving it for its whole life, so
    without a limit enough followers would take every thread and the
    dashboard and API would wait behind them. One counter per process, which
    is what holds the threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open = 0

    def acquire(self, limit: int) -> bool:
        with self._lock:
            if self.open >= limit:
                return False
            self.open += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.open = max(0, self.open - 1)


STREAM_SLOTS = StreamSlots()


class HeldStream:
    """A stream's frames; closing it frees its slot, once.

    The WSGI server closes every response it was given (done, failed or the
    client gone), and Django passes that on to an iterator with ``close``. A
    generator's own ``finally`` would not do: it never runs if the generator
    was closed before it started.
    """

    def __init__(self, frames: Iterator[str], slots: StreamSlots):
        self._frames = frames
        self._slots: StreamSlots | None = slots

    def __iter__(self) -> HeldStream:
        return self

    def __next__(self) -> str:
        return next(self._frames)

    def close(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            try:
                self._frames.close()  # type: ignore[attr-defined]
            finally:
                slots.release()


def stream_events(job: Job, after: int) -> HttpResponseBase:
    if job.is_finished and after >= job.event_seq:
        # Nothing will ever follow: 204 tells an EventSource to stop reconnecting.
        return no_content()
    limit = int(_setting("DURABLE_API_MAX_STREAMS", DEFAULT_MAX_STREAMS))
    if not STREAM_SLOTS.acquire(limit):
        raise Refusal(
            503,
            "too_many_streams",
            f"this server process already serves {limit} event stream(s); reconnect after "
            "Retry-After seconds, or read the events as JSON pages meanwhile",
            headers={"Retry-After": str(STREAMS_BUSY_RETRY_AFTER)},
        )
    response = StreamingHttpResponse(
        HeldStream(event_frames(job.pk, after), STREAM_SLOTS),
        content_type="text/event-stream; charset=utf-8",
    )
    response["X-Accel-Buffering"] = "no"  # nginx: pass each frame on at once
    return response


def event_frames(job_id: int, after: int) -> Iterator[str]:
    """Frames until the job is finished or the stream's time is up.

    A stream holds a gunicorn thread, so it lasts at most
    ``DURABLE_API_STREAM_SECONDS`` (and at most ``DURABLE_API_MAX_STREAMS``
    are open per process, see ``StreamSlots``). The client then reconnects
    with ``Last-Event-ID`` and misses nothing. The database is polled every
    ``DURABLE_API_STREAM_POLL_SECONDS`` (one indexed read of the job row; the
    events only when its ``event_seq`` moved); a comment line every
    ``DURABLE_API_STREAM_KEEPALIVE_SECONDS`` keeps proxies from closing an idle
    stream and lets a vanished client be noticed.
    """
    started = time.monotonic()
    deadline = started + _setting("DURABLE_API_STREAM_SECONDS", DEFAULT_STREAM_SECONDS)
    poll = _setting("DURABLE_API_STREAM_POLL_SECONDS", DEFAULT_STREAM_POLL_SECONDS)
    keepalive = _setting("DURABLE_API_STREAM_KEEPALIVE_SECONDS", DEFAULT_STREAM_KEEPALIVE_SECONDS)
    last_sent = after
    last_write = started
    yield sse_retry(STREAM_RETRY_MS)
    while True:
        row = Job.objects.filter(pk=job_id).values_list("state", "event_seq").first()
        if row is None:
            yield sse_event(dumps({"state": None, "last_event_seq": last_sent}), event="end")
            return
        state, event_seq = row
        sent = False
        if event_seq > last_sent:
            batch = JobEvent.objects.filter(job_id=job_id, seq__gt=last_sent).order_by("seq")
            for event in batch[:STREAM_BATCH]:
                yield sse_event(dumps(event_json(event)), event_id=event.seq)
                last_sent = event.seq
                sent = True
        # The row read above already said "finished" if its last event is among those
        # just sent (state and event commit together): end now, not after a deadline
        # that may fall first — a reconnect would get 204 and never see the end.
        if state in FINISHED_STATES and last_sent >= event_seq:
            yield sse_event(dumps({"state": state, "last_event_seq": last_sent}), event="end")
            return
        now = time.monotonic()
        if now >= deadline:
            yield sse_comment("time limit reached; reconnect with Last-Event-ID")
            return
        if sent:
            last_write = now
            continue  # look again at once: another batch, or the end, may be there
        if now - last_write >= keepalive:
            yield sse_comment("keep-alive")
            last_write = now
        time.sleep(max(0.0, min(poll, deadline - now)))


@endpoint({"POST": "jobs:write"})
def job_action_view(request: HttpRequest, client: Client, job_id: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Refusal(404, "not_found", f"no action {action!r}; use {', '.join(ACTIONS)}")
    owner = row_or_404(Job.objects.values_list("owner", flat=True), job_id, "job")
    authorize_job_action(request, client, job_id, owner)  # the owner never changes
    outcome = ACTIONS[action](job_id, actor=client.actor)
    if outcome.refusal == "no such job":
        raise Refusal(404, "not_found", f"there is no job {job_id}")
    if outcome.refused:
        raise Refusal(
            409, "transition_refused", outcome.refusal or "", extra={"state": outcome.state}
        )
    return json_response(
        {"action": action, "applied": outcome.applied, "job": job_json(_job_or_404(job_id))}
    )


@endpoint({"GET": None})
def openapi_view(request: HttpRequest, client: Client | None) -> HttpResponse:
    prefix = reverse("durable-api:openapi").removesuffix("openapi.json")
    return json_response(build_document(prefix))


@csrf_exempt
def not_found_view(request: HttpRequest, rest: str = "") -> HttpResponse:
    response = refused(request, Refusal(404, "not_found", "no such API resource; see openapi.json"))
    response["Cache-Control"] = "no-store"
    return response
