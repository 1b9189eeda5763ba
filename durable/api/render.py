"""The JSON shapes of jobs and events (``openapi.py`` describes the same shapes)."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse

from ..models import Job, JobEvent

# Error-history fields a client may see; the traceback stays on the dashboard.
ERROR_FIELDS = ("at", "attempt", "error_class", "message", "retryable")


def dumps(data: Any) -> str:
    return json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=False)


def job_url(job_id: int) -> str:
    return reverse("durable-api:job", args=[job_id])


def job_json(job: Job) -> dict[str, Any]:
    last = job.last_error
    return {
        "id": job.pk,
        "url": job_url(job.pk),
        "events_url": reverse("durable-api:job-events", args=[job.pk]),
        "operation": job.operation,
        "state": job.state,
        "finished": job.is_finished,
        "owner": job.owner,
        "tenant": job.tenant,
        "queue": job.queue,
        "priority": job.priority,
        "on_restart": job.on_restart,
        "input": job.input,
        "checkpoint": job.checkpoint,
        "progress": {
            "units_done": job.units_done,
            "units_total": job.units_total,
            "fraction": job.progress,
        },
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "next_attempt_at": job.next_attempt_at,
        "last_error": {k: last.get(k) for k in ERROR_FIELDS} if last else None,
        "reason": job.reason,
        "error_code": job.error_code,
        "last_event_seq": job.event_seq,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


def event_json(event: JobEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "message": event.message,
        "data": event.data,
        "created_at": event.created_at,
    }
