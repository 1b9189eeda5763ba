"""What a job's row and a job's detail show, built once for the Jobs pages and for
the actions' replies (htmx swaps the fresh row or detail in place).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone

from durable.models import Job
from durable.queues import paused_queues
from durable.states import JobState
from durable.tasks.describe import task_detail, task_summary
from recovery.models import RecoveryEvent

from .access import allowed_actions, can_view
from .actions import LABELS, row_actions
from .context import page_context
from .query import parse_int
from .serving import serving, why_waiting

ACTIVE_STATES = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.CANCELLING})
# Sent with every action's htmx reply: the Jobs table re-reads itself on it (it may
# not be polling: whether it polls was decided when it was last rendered).
CHANGED_EVENT = "jobs-changed"
EVENTS_SHOWN = 200
WORKERS_SHOWN = 50


def show(row: Any, **shown: Any) -> None:
    """Attach what a template reads beside a row's fields (plain instance attributes)."""
    vars(row).update(shown)


def decorate(job: Job, allowed: frozenset[str], now: datetime) -> Job:
    """Attach what the row shows: its action buttons and whether it is still moving."""
    waiting = job.state == JobState.QUEUED and job.next_attempt_at > now
    show(
        job,
        row_actions=[
            (action, LABELS[action])
            for action in row_actions(job.state, waiting=waiting, allowed=allowed)
        ],
        is_active=job.state in ACTIVE_STATES,
        lease_live=job.lease_is_live(now),
        task=task_summary(job),  # None unless a Django task (its function path, status)
    )
    return job


def detail_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    """What the detail shows, with its URLs built from the job, never from the request.

    The same template answers a GET and an action's POST (htmx swaps the detail
    in place): a poll URL taken from the request would be the action's URL, which
    answers GET with 405 — every 2 s, for as long as the page stays open.
    """
    now = timezone.now()
    decorate(job, allowed_actions(request.user), now)
    show(job, why_waiting=why_waiting(job, serving(now), set(paused_queues())))
    upto = _seq_param(request.GET.get("upto"), job.event_seq)
    detail_url = reverse("problems:job", args=[job.pk])
    # "Earlier events" keeps its place while it polls; the latest events need no ?upto=.
    here = f"{detail_url}?upto={upto}" if upto < job.event_seq else detail_url
    events = list(job.events.filter(seq__lte=upto).order_by("-seq")[:EVENTS_SHOWN])[::-1]
    started = job.events.filter(kind="started").order_by("-seq")[:WORKERS_SHOWN]
    holders = [
        {
            "worker": event.data.get("worker", "?"),
            "epoch": event.data.get("epoch"),
            "attempt": event.data.get("attempt"),
            "at": event.created_at,
        }
        for event in reversed(list(started))
    ]
    return page_context(
        request,
        "jobs",
        job=job,
        events=events,
        detail_url=detail_url,
        here=here,
        earlier=events[0].seq - 1 if events and events[0].seq > 1 else None,
        last_shown=events[-1].seq if events else None,
        holders=holders,
        errors=list(reversed(job.errors or [])),
        task=task_detail(job),
        recovery=(
            list(RecoveryEvent.objects.for_job(job.pk).order_by("-id")[:20])
            if can_view(request.user, "recovery")
            else []
        ),
        poll=job.state in ACTIVE_STATES,
    )


def _seq_param(value: Any, default: int) -> int:
    """``?upto=<seq>``: show the events up to there; garbage shows the latest."""
    return parse_int(value, default=default, low=1, high=max(default, 1))
