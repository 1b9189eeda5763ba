"""Schedules page: the scheduled rules with their next run, "New schedule", and
Enable / Disable / Delete — all through ``durable.schedules.service``, never by
writing the tables (the service validates the rule, keeps ``next_run_at`` right
and serialises with the workers that tick).

A schedule starts its operation again and again, so its operation obeys the same
rule as "New job" (``rights.start_refusal``): a user who may not start it by hand
may not schedule it or enable its schedule. Disabling and deleting stop work and
need only their permission. Every change is a Recovery event, like the job actions.
Schedules the site manages from its settings (``managed``: the ingest, retention)
may be disabled, not deleted: the next worker start would create them again.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import OuterRef, Q, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from durable.errors import InputRejected, UnknownOperation
from durable.models.schedules import Occurrence, Schedule
from durable.operations import registered
from durable.schedules.service import add_schedule, describe_rule, remove_schedule, set_enabled

from . import audit
from .access import (
    can_change_schedules,
    refuse,
    staff_required,
    start_refusal,
    viewer_of,
)
from .context import page_context
from .forms import ScheduleForm, attach_schedule_refusal, input_form, job_input
from .listing import Listing
from .operation_picker import choose_operation, refusal_text
from .query import Filter, parse_table_query, window
from .responses import table_fragment, wants_fragment

CHANGES = ("enable", "disable", "delete")
STATES = ("all", "enabled", "disabled")
SCHEDULE_FILTERS = (Filter("enabled", STATES, "all"),)
STATE_LABELS = {"all": "All", "enabled": "Enabled", "disabled": "Disabled"}
CREATED_EVENT = "schedule-created"
CHANGED_EVENT = "schedule-action"  # enabled, disabled or deleted
REFUSALS = {
    "add": "You may not add schedules.",
    "enable": "You may not enable schedules.",
    "disable": "You may not disable schedules.",
    "delete": "You may not delete schedules.",
}


# --- the list -----------------------------------------------------------------------------------


def schedules_listing(query: Any) -> Listing:
    """One page of schedules by name, with each one's latest occurrence (one query)."""
    rows = Schedule.objects.all()
    state = query.get("enabled")
    if state in ("enabled", "disabled"):
        rows = rows.filter(enabled=state == "enabled")
    if query.q:
        rows = rows.filter(Q(name__icontains=query.q) | Q(operation__icontains=query.q))
    latest = Occurrence.objects.filter(schedule=OuterRef("pk")).order_by("-scheduled_for")
    rows = rows.annotate(
        last_note=Subquery(latest.values("note")[:1]),
        last_job_id=Subquery(latest.values("job_id")[:1]),
    ).order_by("name")
    win = window(query.page, query.per_page, rows.count())
    page = list(rows[win.offset : win.offset + win.limit]) if win.limit else []
    for schedule in page:
        schedule.rule_text = describe_rule(schedule)
    return Listing(page, win)


@viewer_of("schedules")
@require_safe  # a page: GET and HEAD, anything else is a 405
def schedule_list(request: HttpRequest) -> HttpResponse:
    query = parse_table_query(request.GET, SCHEDULE_FILTERS)
    context = page_context(
        request,
        "schedules",
        query=query,
        listing=schedules_listing(query),
        noun=("schedule", "schedules"),
        states=[(state, STATE_LABELS[state]) for state in STATES],
        may_enable=can_change_schedules(request.user, "enable"),
        may_delete=can_change_schedules(request.user, "delete"),
    )
    if wants_fragment(request):
        return table_fragment(request, "problems/_schedules_results.html", context, query)
    return render(request, "problems/schedules.html", context)


# --- enable, disable, delete --------------------------------------------------------------------


@staff_required
@require_POST
def schedule_change(request: HttpRequest, schedule_id: int, change: str) -> HttpResponse:
    if change not in CHANGES:
        raise Http404(f"There is no change {change[:40]!r}: enable, disable or delete.")
    if not can_change_schedules(request.user, change):
        return refuse(request, f"no-permission:schedule-{change}", REFUSALS[change])
    schedule = Schedule.objects.filter(pk=schedule_id).first()
    if schedule is None:
        messages.info(request, f"Schedule {schedule_id} does not exist (any more).")
        return redirect("problems:schedules")
    if change == "enable" and not schedule.enabled:
        operation = registered().get(schedule.operation)
        if operation is None:
            messages.error(request, f"No operation named {schedule.operation!r} is registered.")
            return redirect("problems:schedules")
        if refusal := start_refusal(request.user, operation):
            key = f"no-permission:start-{refusal}"
            return refuse(request, key, refusal_text(schedule.operation, refusal))
    if change == "delete":
        return _delete(request, schedule)
    changed = set_enabled(schedule.name, change == "enable")
    done = "enabled" if changed.enabled else "disabled"
    when = f"; next run {changed.next_run_at:%Y-%m-%d %H:%M:%S %Z}" if changed.next_run_at else ""
    _audit(request, changed, f"{done} schedule {changed.name!r}")
    messages.success(request, f"Schedule {changed.name!r} {done}{when}.")
    return redirect("problems:schedules")


def _delete(request: HttpRequest, schedule: Schedule) -> HttpResponse:
    if schedule.managed:
        messages.error(
            request,
            f"Schedule {schedule.name!r} is managed by the site's settings and would be created "
            "again at the next worker start: disable it instead (or turn it off in the settings).",
        )
        return redirect("problems:schedules")
    if request.POST.get("confirmed") != "1":
        context = page_context(
            request, "schedules", schedule=schedule, rule_text=describe_rule(schedule)
        )
        return render(request, "problems/schedule_delete.html", context)
    remove_schedule(schedule.name)
    _audit(request, schedule, f"deleted schedule {schedule.name!r}")
    messages.success(
        request,
        f"Schedule {schedule.name!r} deleted; the jobs it started are kept.",
    )
    return redirect("problems:schedules")


def _audit(request: HttpRequest, schedule: Schedule, what: str, *, type: str = CHANGED_EVENT):
    audit.record_action(
        request,
        type,
        detail=f"{audit.actor(request)}: {what} ({schedule.operation}, {describe_rule(schedule)})",
        done=True,
        object_ids=[f"schedule:{schedule.pk}"],
        titles=[schedule.name],
        operation=schedule.operation,
    )


# --- New schedule ----------------------------------------------------------------------------


@staff_required
def new_schedule(request: HttpRequest) -> HttpResponse:
    """Pick an operation (only those this user may start), then its input and the timing."""
    if not can_change_schedules(request.user, "add"):
        return refuse(request, "no-permission:schedule-add", REFUSALS["add"])
    chosen = choose_operation(request, "schedules", "problems/new_schedule.html")
    if isinstance(chosen, HttpResponse):
        return chosen
    name, operation, context = chosen.name, chosen.operation, chosen.context
    bound = request.method == "POST"
    form = input_form(operation, request.POST if bound else None)
    schedule_form = ScheduleForm(request.POST if bound else None, prefix="schedule")
    if bound and form.is_valid() and schedule_form.is_valid():
        data = schedule_form.cleaned_data
        try:
            schedule = add_schedule(
                data["name"],
                name,
                cron=data["cron"] or None,
                every=data["interval"],
                input=job_input(form),
                time_zone=data["time_zone"],
                catch_up=data["catch_up"],
                overlap=data["overlap"],
                priority=data["priority"],
                enabled=data["enabled"],
            )
        except InputRejected as error:
            attach_schedule_refusal(error, form, schedule_form)
        except UnknownOperation as error:
            schedule_form.add_error(None, str(error))
        else:
            _audit(request, schedule, f"added schedule {schedule.name!r}", type=CREATED_EVENT)
            when = (
                f"; first run {schedule.next_run_at:%Y-%m-%d %H:%M:%S %Z}"
                if schedule.next_run_at
                else " (disabled)"
            )
            messages.success(request, f"Schedule {schedule.name!r} added{when}.")
            return redirect("problems:schedules")
    context.update(operation=operation, form=form, schedule_form=schedule_form)
    return render(request, "problems/new_schedule.html", context)
