"""Jobs pages: the list and one job's detail.

The actions are in ``job_actions`` (one job) and ``job_bulk`` (selected rows,
a whole filter), "New job" in ``new_job``; what a row and a detail show is
``job_context``, shared with the actions' replies.
"""

from __future__ import annotations

from django.core.cache import cache
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_safe

from durable.models import Job
from durable.operations import registered
from durable.queues import paused_queues
from durable.states import JobState

from .access import allowed_actions, viewer_of
from .actions import LABELS, PAST
from .context import page_context
from .job_context import ACTIVE_STATES, CHANGED_EVENT, decorate, detail_context, show
from .listing import JOB_FILTERS, JOB_STATES, jobs_listing
from .query import parse_table_query
from .responses import table_fragment, wants_fragment
from .serving import serving, why_waiting

STOP_POLLING = 286  # htmx: swap this reply and stop the element's "every 2s"
ERROR_MENU_SECONDS = 30


def operation_choices() -> list[str]:
    return sorted(registered())


def error_classes() -> list[str]:
    """Last error classes seen on unfinished or failed jobs (for the filter's menu).

    A menu may lag a little: it is kept for ERROR_MENU_SECONDS per process
    rather than read from 100,000 jobs on every page view. The current
    filter's value is always offered, and typing ``?error=`` works regardless.
    """

    def read() -> list[str]:
        return list(
            Job.objects.exclude(last_error_class="")
            .filter(state__in=[JobState.FAILED, JobState.PAUSED, JobState.QUEUED, JobState.RUNNING])
            .values_list("last_error_class", flat=True)
            .distinct()
            .order_by("last_error_class")[:50]
        )

    return cache.get_or_set("problems:error-classes", read, ERROR_MENU_SECONDS) or []


# --- the list -----------------------------------------------------------------------------

SORT_LABELS = {
    "-created": "Newest first",
    "created": "Oldest first",
    "-attempts": "Most attempts",
    "attempts": "Fewest attempts",
    "next": "Next attempt soonest",
    "-next": "Next attempt latest",
}
STATE_LABELS = {
    "all": "All states",
    "active": "Active",
    "retrying": "Retrying",
    **{state.value: state.label for state in JobState},
}


@viewer_of("jobs")
@require_safe  # a page: GET and HEAD, anything else is a 405
def job_list(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    query = parse_table_query(request.GET, JOB_FILTERS)
    listing = jobs_listing(query, now)
    allowed = allowed_actions(request.user)
    served, paused = serving(now), set(paused_queues())
    for job in listing.rows:
        decorate(job, allowed, now)
        show(job, why_waiting=why_waiting(job, served, paused))
    context = page_context(
        request,
        "jobs",
        query=query,
        listing=listing,
        poll=any(job.state in ACTIVE_STATES for job in listing.rows),
        refresh_on=f"{CHANGED_EVENT} from:body",
        noun=("job", "jobs"),
        bulk_actions=[(action, LABELS[action]) for action in PAST if action in allowed],
        upto=Job.objects.aggregate(top=Max("id"))["top"] or 0,
    )
    if wants_fragment(request):
        return table_fragment(request, "problems/_jobs_results.html", context, query)
    context.update(
        states=[(state, STATE_LABELS[state]) for state in JOB_STATES],
        sorts=list(SORT_LABELS.items()),
        operations=operation_choices(),
        errors=error_classes(),
    )
    return render(request, "problems/jobs.html", context)


# --- one job ------------------------------------------------------------------------------


@viewer_of("jobs")
@require_safe  # a page: GET and HEAD, anything else is a 405
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        text = (
            f"Job {job_id} does not exist (any more: finished jobs are purged after the "
            "retention period)."
        )
        if wants_fragment(request):
            # A detail left open on a purged job polls it: 286 tells htmx to stop.
            context = {"level": "error", "message": text}
            return render(request, "problems/_job_gone.html", context, status=STOP_POLLING)
        raise Http404(text)
    context = detail_context(request, job)
    if wants_fragment(request):
        return render(request, "problems/_job_detail.html", context)
    return render(request, "problems/job_detail.html", context)
