"""The JSON shapes of jobs and events (``openapi.py`` describes the same shapes)."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse

from ..models import Job, JobEvent
from ..models.schedules import Occurrence, Schedule
from ..schedules.service import describe_rule
from ..schedules.timing import format_interval

# Error-history fields a client may see; the traceback stays on the dashboard.
ERROR_FIELDS = ("at", "attempt", "error_class", "message", "retryable")


def dumps(data: Any) -> str:
    return json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=False)


def job_url(job_id: int) -> str:
    return reverse("durable-api:job", args=[job_id])


def schedule_url(schedule_id: int) -> str:
    return reverse("durable-api:schedule", args=[schedule_id])


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


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    interval = schedule.interval
    return {
        "id": schedule.pk,
        "url": schedule_url(schedule.pk),
        "name": schedule.name,
        "operation": schedule.operation,
        "input": schedule.input,
        "cron": schedule.cron or None,
        "interval": format_interval(interval) if interval is not None else None,
        "interval_seconds": interval.total_seconds() if interval is not None else None,
        # Cron follows this zone's wall clock; an interval knows no zone.
        "time_zone": schedule.zone if schedule.cron else None,
        "rule": describe_rule(schedule),
        "catch_up": schedule.catch_up,
        "overlap": schedule.overlap,
        "queue": schedule.queue or None,
        "priority": schedule.priority,
        "enabled": schedule.enabled,
        "managed": schedule.managed,
        "next_run_at": schedule.next_run_at,
        "last_run_at": schedule.last_run_at,
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
    }


def occurrence_json(occurrence: Occurrence) -> dict[str, Any]:
    return {
        "scheduled_for": occurrence.scheduled_for,
        "job_id": occurrence.job_id,
        "job_url": job_url(occurrence.job_id) if occurrence.job_id else None,
        "missed": occurrence.missed,
        "note": occurrence.note,
    }
