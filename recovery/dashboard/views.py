"""Summary, Recovery and Security pages: one view per page, two renderings.

A normal request gets the whole page; an htmx request (search typed, filter
or page changed, a poll) gets only the part it swaps — from the same view
and the same templates, so both always agree. Every response varies on
``HX-Request`` (see ``access.dashboard_headers``). htmx's history-restore
request (back/forward with nothing cached) gets the whole page.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import views as auth_views
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_safe

from durable.models import Job
from durable.states import JobState
from recovery.models import SecurityEvent

from . import chart as charts
from .access import refuse, staff_required, viewer_of, visible_areas
from .context import page_context, throughput_context
from .listing import (
    RECOVERY_FILTERS,
    RECOVERY_STATUSES,
    SECURITY_FILTERS,
    SEVERITIES,
    daily_counts,
    recent_problems,
    recovery_listing,
    recovery_totals,
    security_listing,
)
from .query import parse_table_query
from .responses import table_fragment, wants_fragment

SUMMARY_ROWS = 10


def job_counts() -> dict[str, int]:
    counts = dict(Job.objects.values_list("state").annotate(n=Count("id")).order_by())
    return {state: counts.get(state, 0) for state in JobState.values}


# --- Summary ------------------------------------------------------------------------------


def events_per_day(today: Any, days: int = charts.DAYS) -> charts.Chart:
    first = today - timedelta(days=days - 1)
    return charts.chart(charts.last_days(daily_counts(first, today), today, days))


def in_progress() -> list[Job]:
    return list(
        Job.objects.filter(state__in=[JobState.RUNNING, JobState.CANCELLING]).order_by("-id")[
            :SUMMARY_ROWS
        ]
    )


@staff_required
@require_safe  # a page: GET and HEAD, anything else is a 405
def summary(request: HttpRequest) -> HttpResponse:
    """Only the sections the user may look at (and only their queries are run)."""
    now = timezone.now()
    shown = visible_areas(request.user)
    if wants_fragment(request):
        if not shown["jobs"]:
            return refuse(
                request, "no-permission:view-jobs", "You may not view jobs (durable.view_job)."
            )
        context = page_context(request, "summary", running=in_progress())
        return render(request, "problems/_in_progress.html", context)
    context = page_context(request, "summary", shown=shown)
    if shown["jobs"]:
        counts = job_counts()
        context.update(
            running=in_progress(),
            counts=counts,
            in_progress_total=counts[JobState.RUNNING] + counts[JobState.CANCELLING],
            retrying=Job.objects.retrying(now).count(),
            **throughput_context(request, now),
        )
    if shown["recovery"]:
        context.update(
            problems=recent_problems(SUMMARY_ROWS),
            chart=events_per_day(now.date()),
            totals=recovery_totals(),
        )
    if shown["security"]:
        context.update(security=list(SecurityEvent.objects.top()[:5]))
    return render(request, "problems/summary.html", context)


# --- Recovery and Security ----------------------------------------------------------------

STATUS_LABELS = {"all": "All", "done": "Done", "failed": "Failed", "deleted": "Deleted"}
SEVERITY_LABELS = {"all": "All", "info": "Info", "warning": "Warning", "error": "Error"}


@viewer_of("recovery")
@require_safe  # a page: GET and HEAD, anything else is a 405
def recovery(request: HttpRequest) -> HttpResponse:
    query = parse_table_query(request.GET, RECOVERY_FILTERS)
    listing = recovery_listing(query)
    totals = recovery_totals()
    context = page_context(
        request,
        "recovery",
        query=query,
        listing=listing,
        statuses=[(s, STATUS_LABELS[s], totals[s]) for s in RECOVERY_STATUSES],
        noun=("event", "events"),
    )
    if wants_fragment(request):
        return table_fragment(request, "problems/_recovery_results.html", context, query)
    return render(request, "problems/recovery.html", context)


@viewer_of("security")
@require_safe  # a page: GET and HEAD, anything else is a 405
def security(request: HttpRequest) -> HttpResponse:
    query = parse_table_query(request.GET, SECURITY_FILTERS)
    listing = security_listing(query)
    context = page_context(
        request,
        "security",
        query=query,
        listing=listing,
        severities=[(s, SEVERITY_LABELS[s]) for s in SEVERITIES],
        noun=("kind of refusal", "kinds of refusal"),
    )
    if wants_fragment(request):
        return table_fragment(request, "problems/_security_results.html", context, query)
    return render(request, "problems/security.html", context)


# --- login --------------------------------------------------------------------------------


class LoginView(auth_views.LoginView):
    template_name = "problems/login.html"
    next_page = "problems:summary"
    redirect_authenticated_user = False  # a non-staff user may log in as someone else


class LogoutView(auth_views.LogoutView):
    next_page = "problems:login"
