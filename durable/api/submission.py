"""``POST /jobs``: enqueue, and remember the response under the client's Idempotency-Key.

The key row is inserted *first* and the job second, in one transaction. Two
requests racing with one key then collide on the ``(client, key)`` unique
index before either creates a job: on PostgreSQL the second insert waits for
the first transaction and fails once it commits; on SQLite the second
transaction cannot start until the first has committed. The loser rolls back
and replays the winner's stored response, so N concurrent duplicates make
exactly one job. Because the response is stored in the database, a replay
works the same after the server restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from ..errors import InputRejected
from ..jobs import enqueue, enqueue_many
from ..models import Client, IdempotencyKey, Job
from .errors import FieldError, Refusal, invalid, rejected_input
from .parse import BatchSubmission, Submission
from .render import dumps, job_json, job_url

RACE_ATTEMPTS = 3


@dataclass(frozen=True)
class Reply:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)
    replayed: bool = False


def _enqueue(client: Client, submission: Submission) -> Job:
    # The caller has checked that the client may start the operation (auth.authorize_operation).
    try:
        return enqueue(
            submission.operation,
            submission.input,
            owner=client.actor,
            queue=submission.queue,
            priority=submission.priority,
            on_restart=submission.on_restart,
        )
    except InputRejected as exc:
        raise rejected_input(exc.field, exc.reason, ("priority",)) from None


def _accepted(job: Job) -> Reply:
    return Reply(202, dumps(job_json(job)), {"Location": job_url(job.pk)})


def _replay(row: IdempotencyKey, digest: str) -> Reply:
    if row.request_digest != digest:
        raise Refusal(
            422,
            "idempotency_key_reused",
            "this Idempotency-Key was already used with a different request; "
            "send the original request again, or use a new key for a new request",
        )
    return Reply(row.response_status, row.response_body, dict(row.response_headers), True)


def submit(client: Client, submission: Submission, *, key: str | None, digest: str) -> Reply:
    """Create the job (committed before this returns) or replay the stored reply."""

    def create() -> tuple[Job, Reply]:
        job = _enqueue(client, submission)
        return job, _accepted(job)

    return _once(client, create, key=key, digest=digest)


def _enqueue_batch(client: Client, batch: BatchSubmission) -> list[Job]:
    try:
        return enqueue_many(
            batch.operation,
            batch.inputs,
            owner=client.actor,
            queue=batch.queue,
            priority=batch.priority,
            on_restart=batch.on_restart,
        )
    except InputRejected as exc:
        # enqueue_many names the input by position ("inputs[3].units") or its own
        # option ("priority"): either is already the request's field.
        raise invalid([FieldError(exc.field, exc.reason)]) from None


def submit_batch(client: Client, batch: BatchSubmission, *, key: str | None, digest: str) -> Reply:
    """Create every job of the batch in one transaction, or replay the stored reply.

    With an Idempotency-Key the key row refers to the batch's first job, so the
    key is kept (see ``IdempotencyKey.objects.purgeable``) while that job is
    unfinished.
    """

    def create() -> tuple[Job, Reply]:
        created = _enqueue_batch(client, batch)
        body = {
            "count": len(created),
            "created": sum(1 for job in created if job.created),
            "jobs": [{**job_json(job), "created": job.created} for job in created],
        }
        return created[0], Reply(202, dumps(body))

    return _once(client, create, key=key, digest=digest)


def _once(
    client: Client, create: Callable[[], tuple[Job, Reply]], *, key: str | None, digest: str
) -> Reply:
    """``create()`` once per Idempotency-Key: the key row first, then the job(s)."""
    if key is None:
        return create()[1]
    for _ in range(RACE_ATTEMPTS):
        existing = IdempotencyKey.objects.filter(client=client, key=key).first()
        if existing is not None:
            return _replay(existing, digest)
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(client=client, key=key, request_digest=digest)
                job, reply = create()
                row.job = job
                row.response_status = reply.status
                row.response_body = reply.body
                row.response_headers = reply.headers
                row.save(
                    update_fields=["job", "response_status", "response_body", "response_headers"]
                )
            return reply
        except IntegrityError:
            continue  # another request with this key committed first: replay it
    raise RuntimeError(f"could not settle Idempotency-Key race for client {client.pk}")
