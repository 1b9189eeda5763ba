"""The operators' console: Queues, Workers and throughput over time.

"Is the system healthy, and why is my job not running?" — one row per queue (ready,
scheduled, running, paused, failed, the oldest ready job's wait, the live workers that
serve it, finished in the last hour), one row per worker process (live or recently
stopped, and how it stopped), and completed/failed/retried jobs per minute or hour.

Every number comes from a grouped query on an indexed column; nothing here reads rows
one by one, so the pages cost the same at 100,000 jobs as at 100. Pausing a queue goes
through ``durable.queues`` (the engine owns the state; the claim reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import messages
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from durable.models import Job, WorkerProcess, database_now
from durable.queues import pause_queue, paused_queues, resume_queue
from durable.rules import QUEUE_NAME_MAX
from durable.states import LEASED_STATES, JobState

from . import audit, rights
from .access import held, refuse, staff_required, viewer_of
from .context import page_context, throughput_context
from .query import clean_query
from .serving import STATUS_LABELS, serving, worker_status

RECENT_STOPS = timedelta(hours=24)  # stopped workers shown this long
WORKERS_SHOWN = 200  # live ones
STOPPED_SHOWN = 50  # the newest of those that stopped within RECENT_STOPS


# --- workers ------------------------------------------------------------------------------


@viewer_of("jobs")
@require_safe
def workers(request: HttpRequest) -> HttpResponse:
    now = database_now()
    running = WorkerProcess.objects.filter(stopped_at__isnull=True)
    stopped = WorkerProcess.objects.filter(stopped_at__gte=now - RECENT_STOPS)
    rows = [
        *running.order_by("-started_at")[:WORKERS_SHOWN],
        *stopped.order_by("-stopped_at")[:STOPPED_SHOWN],
    ]
    holding: dict[str, list[Job]] = {}
    # By lease owner alone: SQLite then reads the lease index (leased jobs only), not every
    # job of the leased states (paused ones, released, are thousands).
    held = Job.objects.filter(
        lease_owner__isnull=False, lease_owner__in=[w.worker_id for w in rows]
    )
    for job in held.only("id", "operation", "state", "units_done", "units_total", "lease_owner"):
        if job.state in LEASED_STATES:
            holding.setdefault(job.lease_owner, []).append(job)
    for worker in rows:
        worker.status = worker_status(
            stopped_at=worker.stopped_at,
            exit_reason=worker.exit_reason,
            heartbeat_at=worker.heartbeat_at,
            lease_seconds=worker.lease_seconds,
            now=now,
        )
        worker.status_label = STATUS_LABELS[worker.status]
        worker.holding = sorted(holding.get(worker.worker_id, []), key=lambda j: j.pk)
    counts: dict[str, int] = {}
    for worker in rows:
        counts[worker.status] = counts.get(worker.status, 0) + 1
    context = page_context(
        request, "workers", workers=rows, now=now, counts=counts, recent=RECENT_STOPS
    )
    return render(request, "problems/workers.html", context)


# --- queues -------------------------------------------------------------------------------


@dataclass
class QueueRow:
    name: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    paused_jobs: int = 0
    failed: int = 0
    oldest_ready: datetime | None = None
    completed_hour: int = 0
    failed_hour: int = 0
    workers: list[str] = field(default_factory=list)
    paused: Any = None  # the PausedQueue row while the queue is paused

    @property
    def unserved(self) -> bool:
        """Work waits here and no live worker will ever take it."""
        return not self.workers and (self.ready or self.scheduled) > 0


def _as_datetime(value: Any) -> datetime | None:
    """A timestamp from raw SQL: SQLite returns the stored UTC text."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def queue_rows(now: datetime) -> list[QueueRow]:
    rows: dict[str, QueueRow] = {}

    def row(name: str) -> QueueRow:
        return rows.setdefault(name, QueueRow(name))

    # Raw SQL, each statement an index-only read: per state and queue from
    # durable_job_per_queue, finished in the last hour from durable_job_finished. The
    # "|| ''" keeps SQLite from walking durable_job_queue_newest for the GROUP BY's
    # order through all 100,000 rows instead.
    table = connection.ops.quote_name(Job._meta.db_table)
    at = connection.ops.adapt_datetimefield_value(now)
    states = "'queued', 'running', 'paused', 'cancelling', 'failed'"
    per_state = (
        f"SELECT queue || '', state, next_attempt_at <= %s, count(*), min(next_attempt_at) "  # noqa: S608
        f"FROM {table} WHERE state IN ({states}) GROUP BY 1, 2, 3"
    )
    finished = (
        f"SELECT queue || '', state, count(*) FROM {table} "  # noqa: S608
        "WHERE finished_at >= %s GROUP BY 1, 2"
    )
    with connection.cursor() as cursor:
        cursor.execute(per_state, [at])
        for queue, state, due, n, oldest in cursor.fetchall():
            r = row(queue)
            if state == JobState.QUEUED and due:
                r.ready += n
                oldest = _as_datetime(oldest)
                r.oldest_ready = min(filter(None, (r.oldest_ready, oldest)), default=None)
            elif state == JobState.QUEUED:
                r.scheduled += n
            elif state in (JobState.RUNNING, JobState.CANCELLING):
                r.running += n
            elif state == JobState.PAUSED:
                r.paused_jobs += n
            else:
                r.failed += n
        cursor.execute(
            finished, [connection.ops.adapt_datetimefield_value(now - timedelta(hours=1))]
        )
        for queue, state, n in cursor.fetchall():
            if state == JobState.COMPLETED:
                row(queue).completed_hour += n
            elif state == JobState.FAILED:
                row(queue).failed_hour += n
    for name, worker_ids in serving(now).items():
        row(name).workers = sorted(worker_ids)
    for name, paused in paused_queues().items():
        row(name).paused = paused
    return sorted(rows.values(), key=lambda r: r.name)


@viewer_of("jobs")
@require_safe
def queues(request: HttpRequest) -> HttpResponse:
    now = database_now()
    chart = throughput_context(request, now)
    context = page_context(
        request,
        "queues",
        queues=queue_rows(now),
        now=now,
        may_pause_queues=rights.may_pause_queues(held(request.user)),
        **chart,
    )
    return render(request, "problems/queues.html", context)


@staff_required
@require_POST
def queue_change(request: HttpRequest, change: str) -> HttpResponse:
    back = reverse("problems:queues")
    if change not in ("pause", "resume"):
        raise Http404(f"There is no queue change {change[:40]!r}: pause or resume.")
    if not rights.may_pause_queues(held(request.user)):
        return refuse(
            request,
            f"no-permission:{change}-queue",
            f"You may not {change} queues ({rights.QUEUE_PERMISSION}).",
        )
    name = clean_query(request.POST.get("queue"), QUEUE_NAME_MAX)
    if not name:
        messages.error(request, "Which queue? The form named none.")
        return redirect(back)
    actor = audit.actor(request)
    if change == "pause":
        reason = clean_query(request.POST.get("reason"), 500)
        try:
            changed = pause_queue(name, actor=actor, reason=reason)
        except ValueError as exc:  # a name no job can have: nothing to pause
            messages.error(request, f"Not paused: {exc}.")
            return redirect(back)
        text = (
            f"Queue {name} paused: workers take no new job from it; running jobs go on."
            if changed
            else f"Queue {name} is already paused: nothing to do."
        )
    else:
        changed = resume_queue(name)
        text = (
            f"Queue {name} resumed: workers take its jobs again."
            if changed
            else f"Queue {name} is not paused: nothing to do."
        )
    audit.record_action(
        request,
        audit.QUEUE_EVENT,
        detail=f"{actor}: {change} queue {name} — {text}",
        done=True,
        object_ids=[name],
        titles=[name],
    )
    (messages.success if changed else messages.info)(request, text)
    return redirect(back)
