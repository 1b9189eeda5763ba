"""Jobs pages: the list, one job's detail, the actions (one job, selected rows, a whole
filter), and "New job".

Actions are POST with CSRF and go through ``durable.jobs`` (which locks, decides
and writes the event); the engine's ``Outcome`` says applied / already so /
refused, so a double click does nothing twice and a refused transition is a
message, never a 500. htmx requests get the updated row (or detail) plus the
message; plain form posts are redirected back with the message.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.core.cache import cache
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from durable import jobs as engine
from durable.errors import DurableError, InputRejected, UnknownOperation
from durable.models import Job
from durable.operations import registered
from durable.queues import paused_queues
from durable.states import JobState, OnRestart
from durable.tasks.describe import task_detail, task_summary
from recovery.models import RecoveryEvent

from . import audit, console, rights, rollup
from .access import (
    allowed_actions,
    can_act,
    can_add,
    can_view,
    count_refusal,
    refuse,
    request_ip,
    staff_required,
    start_refusal,
    startable,
    viewer_of,
)
from .actions import LABELS, PAST, describe, row_actions, summarize
from .bulk import BATCH_SIZE
from .bulk import OPERATION as BULK_OPERATION
from .listing import JOB_FILTERS, JOB_STATES, job_filter, job_spec, jobs_listing
from .query import PER_PAGE_MAX, parse_choice, parse_int, parse_table_query
from .views import page_context, table_fragment, wants_fragment

ACTIVE_STATES = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.CANCELLING})
ENGINE_ACTIONS = {
    "pause": engine.pause,
    "resume": engine.resume,
    "cancel": engine.cancel,
    "retry": engine.retry_now,
    "discard": lambda job_id, actor: apply_to("discard", [job_id], actor)[0],
}


def apply_to(action: str, ids: list[int], actor: str) -> list[Any]:
    """The engine's outcomes of ``action`` on ``ids`` (discard deletes: its own call)."""
    if action == "discard":
        rollup.count_before_deleting()  # the throughput history keeps them
        return engine.discard(ids)
    return engine.act(action, ids, actor=actor)


# Sent with every action's htmx reply: the Jobs table re-reads itself on it (it may
# not be polling: whether it polls was decided when it was last rendered).
CHANGED_EVENT = "jobs-changed"
STOP_POLLING = 286  # htmx: swap this reply and stop the element's "every 2s"
EVENTS_SHOWN = 200
ERROR_MENU_SECONDS = 30
WORKERS_SHOWN = 50


def decorate(job: Job, allowed: frozenset[str], now: Any) -> Job:
    """Attach what the row shows: its action buttons and whether it is still moving."""
    waiting = job.state == JobState.QUEUED and job.next_attempt_at > now
    job.row_actions = [
        (action, LABELS[action])
        for action in row_actions(job.state, waiting=waiting, allowed=allowed)
    ]
    job.is_active = job.state in ACTIVE_STATES
    job.lease_live = job.lease_is_live(now)
    job.task = task_summary(job)  # None unless a Django task (its function path, status)
    return job


def safe_next(request: HttpRequest, default: str) -> str:
    """Where a plain form post goes back to: a dashboard URL of this site, else ``default``."""
    target = request.POST.get("next") or ""
    ok = url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return target if ok and target.startswith(reverse("problems:summary")) else default


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

    return cache.get_or_set("problems:error-classes", read, ERROR_MENU_SECONDS)


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
    served, paused = console.serving(now), set(paused_queues())
    for job in listing.rows:
        decorate(job, allowed, now)
        job.why_waiting = console.why_waiting(job, served, paused)
    context = page_context(
        request,
        "jobs",
        query=query,
        listing=listing,
        poll=any(job.is_active for job in listing.rows),
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


def detail_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    """What the detail shows, with its URLs built from the job, never from the request.

    The same template answers a GET and an action's POST (htmx swaps the detail
    in place): a poll URL taken from the request would be the action's URL, which
    answers GET with 405 — every 2 s, for as long as the page stays open.
    """
    now = timezone.now()
    decorate(job, allowed_actions(request.user), now)
    job.why_waiting = console.why_waiting(job, console.serving(now), set(paused_queues()))
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
        poll=job.is_active,
    )


def _seq_param(value: Any, default: int) -> int:
    """``?upto=<seq>``: show the events up to there; garbage shows the latest."""
    return parse_int(value, default=default, low=1, high=max(default, 1))


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


# --- actions ------------------------------------------------------------------------------


def _answer(request: HttpRequest, job_id: int, said: Any, fallback: str) -> HttpResponse:
    """htmx: the job's fresh row (or detail) and the message; otherwise back, with the message."""
    if not wants_fragment(request):
        messages.add_message(request, getattr(messages, said.level.upper()), said.text)
        target = safe_next(request, fallback)
        own_page = reverse("problems:job", args=[job_id])
        if target.startswith(own_page) and not Job.objects.filter(pk=job_id).exists():
            target = reverse("problems:jobs")  # discarded: its page is gone
        return redirect(target)
    job = Job.objects.filter(pk=job_id).first()
    message = {"level": said.level, "message": said.text}
    if job is None:
        response = render(request, "problems/_message_oob.html", message)
    elif request.POST.get("render") == "detail":
        context = detail_context(request, job)
        context.update(message)
        response = render(request, "problems/_job_detail_oob.html", context)
    else:
        context = page_context(
            request, "jobs", job=decorate(job, allowed_actions(request.user), timezone.now())
        )
        context.update(message)
        response = render(request, "problems/_job_row_oob.html", context)
    # After the swap settles (the button's request no longer holds #results' sync lock).
    response["HX-Trigger-After-Settle"] = CHANGED_EVENT
    return response


@staff_required
@require_POST
def job_action(request: HttpRequest, job_id: int, action: str) -> HttpResponse:
    if action not in ENGINE_ACTIONS:
        raise Http404(
            f"There is no action {action[:40]!r}: pause, resume, cancel, retry or discard."
        )
    if not can_act(request.user, action):
        return refuse(request, f"no-permission:{action}", f"You may not {action} jobs.")
    outcome = ENGINE_ACTIONS[action](job_id, actor=audit.actor(request))
    said = describe(
        job_id, action, applied=outcome.applied, state=outcome.state, refusal=outcome.refusal
    )
    operation = Job.objects.filter(pk=job_id).values_list("operation", flat=True).first() or ""
    audit.record_action(
        request,
        audit.event_for(action),
        detail=f"{audit.actor(request)}: {action} job {job_id} — {said.text}",
        done=not outcome.refused,
        job_ids=[job_id],
        titles=[operation] if operation else (),
        job_id=job_id,
        operation=operation,
        reason=outcome.refusal or "",
    )
    fallback = reverse("problems:job", args=[job_id]) if operation else reverse("problems:jobs")
    return _answer(request, job_id, said, fallback)


# --- bulk ---------------------------------------------------------------------------------


def _selected_ids(request: HttpRequest) -> list[int] | None:
    """The ticked job ids (at most one page's worth), or None if the list is unusable."""
    values = request.POST.getlist("ids")
    ids: list[int] = []
    for value in values:
        if not value.isascii() or not value.isdigit() or len(value) > 18:
            return None
        ids.append(int(value))
    ids = sorted(set(ids))
    return ids if len(ids) <= PER_PAGE_MAX else None


def _posted_spec(request: HttpRequest) -> dict[str, str]:
    """The Jobs filter the bulk form was rendered with (hidden ``filter_*`` fields)."""
    query = parse_table_query(
        {
            "q": request.POST.get("filter_q", ""),
            **{f.name: request.POST.get(f"filter_{f.name}", "") for f in JOB_FILTERS},
        },
        JOB_FILTERS,
    )
    return job_spec(query)


def _spec_text(spec: dict[str, str]) -> str:
    parts = [f"{name}={value}" for name, value in spec.items() if value and value != "all"]
    return ", ".join(parts) or "all jobs"


@staff_required
@require_POST
def bulk(request: HttpRequest) -> HttpResponse:
    jobs_url = reverse("problems:jobs")
    back = safe_next(request, jobs_url)
    action = parse_choice(request.POST.get("action"), tuple(ENGINE_ACTIONS), "")
    scope = parse_choice(request.POST.get("scope"), ("selected", "filter"), "")
    if not action or not scope:
        messages.error(request, "Choose an action and what to apply it to.")
        return redirect(back)
    if not can_act(request.user, action):
        return refuse(request, f"no-permission:{action}", f"You may not {action} jobs.")
    confirmed = request.POST.get("confirmed") == "1"
    if scope == "selected":
        ids = _selected_ids(request)
        if ids is None:
            messages.error(request, f"Select at most {PER_PAGE_MAX} jobs (whole numbers).")
            return redirect(back)
        if not ids:
            messages.error(request, "No jobs selected: tick some rows first.")
            return redirect(back)
        targets = Job.objects.filter(pk__in=ids)
        context = {"ids": ids, "what": f"{len(ids)} selected job{'s' if len(ids) != 1 else ''}"}
    else:
        spec = _posted_spec(request)
        top = Job.objects.aggregate(top=Max("id"))["top"] or 0
        upto = min(_int(request.POST.get("upto"), top), top)
        targets = job_filter(Job.objects.filter(pk__lte=upto), spec, timezone.now())
        context = {"spec": spec, "upto": upto, "what": f"every job matching {_spec_text(spec)}"}
    if not confirmed:
        states = list(targets.values("state").annotate(n=Count("id")).order_by("-n"))
        count = sum(row["n"] for row in states)
        return render(
            request,
            "problems/bulk_confirm.html",
            page_context(
                request,
                "jobs",
                action=action,
                label=LABELS[action],
                scope=scope,
                count=count,
                states=states,
                back=back,
                batch=BATCH_SIZE,
                **context,
            ),
        )
    if scope == "selected":
        return _bulk_selected(request, action, context["ids"], back)
    return _bulk_filter(request, action, context["spec"], context["upto"], targets.count(), back)


def _int(value: Any, default: int) -> int:
    return parse_int(value, default=default, low=0, high=2**62)


def _bulk_selected(request: HttpRequest, action: str, ids: list[int], back: str) -> HttpResponse:
    outcomes = apply_to(action, ids, audit.actor(request))
    said = summarize(action, [(o.applied, o.refusal) for o in outcomes])
    refused = [o for o in outcomes if o.refused]
    audit.record_action(
        request,
        audit.event_for(action),
        detail=f"{audit.actor(request)}: {action} {len(ids)} selected jobs — {said.text}",
        done=not refused,
        job_ids=ids,
        reason=refused[0].refusal if refused else "",
    )
    messages.add_message(request, getattr(messages, said.level.upper()), said.text)
    return redirect(back)


def bulk_key(user_id: Any, action: str, spec: dict[str, str], upto: int) -> str:
    """The unique key of one confirmed "apply to all matching": who, what, which jobs.

    A confirmation submitted twice (a double click, a reload, the back button) gets
    the first job back while it is unfinished, instead of a second job and a second
    audit event. Once it finished, the same confirmation runs again (harmlessly:
    every job is "already so").
    """
    identity = json.dumps(
        {"user": user_id, "action": action, "filter": spec, "upto": upto},
        sort_keys=True,
        separators=(",", ":"),
    )
    return f"bulk:{hashlib.sha256(identity.encode()).hexdigest()[:48]}"


def _bulk_filter(
    request: HttpRequest, action: str, spec: dict[str, str], upto: int, count: int, back: str
) -> HttpResponse:
    if count == 0:
        messages.info(request, "No jobs match that filter any more: nothing to do.")
        return redirect(back)
    job = engine.enqueue(
        BULK_OPERATION,
        {
            "action": action,
            "filter": spec,
            "upto": upto,
            "expected": count,
            "user_id": request.user.pk,
            "ip": request_ip(request) or "",
        },
        owner=audit.actor(request),
        unique_key=bulk_key(request.user.pk, action, spec, upto),
    )
    if not job.created:
        messages.info(
            request, f"Already queued as job {job.pk} ({job.state}): its progress is below."
        )
        return redirect("problems:job", job.pk)
    audit.record_action(
        request,
        audit.BULK_EVENT,
        detail=(
            f"{audit.actor(request)}: {action} every job matching {_spec_text(spec)} "
            f"up to #{upto} ({count:,} jobs), as job {job.pk}"
        ),
        done=True,
        job_ids=[job.pk],
        titles=[BULK_OPERATION],
        job_id=job.pk,
        operation=BULK_OPERATION,
    )
    messages.success(
        request,
        f"Job {job.pk} will {action} {count:,} jobs, {BATCH_SIZE} at a time; "
        f"its progress is below.",
    )
    return redirect("problems:job", job.pk)


# --- New job ------------------------------------------------------------------------------


class JsonInputForm(forms.Form):
    """The input of an operation without its own ``input_form``: a JSON object."""

    input = forms.CharField(
        label="Input (JSON object)",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "mono"}),
        required=False,
        initial="{}",
    )

    def clean_input(self) -> dict[str, Any]:
        text = self.cleaned_data.get("input") or "{}"
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("The input must be a JSON object: {…}.")
        return value

    def job_input(self) -> dict[str, Any]:
        return self.cleaned_data["input"]


class OptionsForm(forms.Form):
    priority = forms.IntegerField(
        min_value=-100, max_value=100, required=False, help_text="Higher runs first (-100…100)."
    )
    on_restart = forms.ChoiceField(
        choices=[("", "The operation's default"), *OnRestart.choices],
        required=False,
        label="After a server restart",
    )


def _input_form(operation: Any, data: Any = None) -> forms.Form:
    form_class = getattr(operation, "input_form", None) or JsonInputForm
    return form_class(data, prefix="input")


def _job_input(form: forms.Form) -> dict[str, Any]:
    if isinstance(form, JsonInputForm):
        return form.job_input()
    # Dates, decimals, UUIDs… as JSON, the way the job will store them.
    return json.loads(json.dumps(form.cleaned_data, cls=DjangoJSONEncoder))


def _attach(error: InputRejected, form: forms.Form, options: OptionsForm) -> None:
    """Show the engine's refusal next to the field it names."""
    field = error.field.removeprefix("input.")
    if field in form.fields:
        form.add_error(field, error.reason)
    elif field in options.fields:
        options.add_error(field, error.reason)
    elif isinstance(form, JsonInputForm):
        form.add_error("input", f"{error.field}: {error.reason}")
    else:
        form.add_error(None, f"{error.field}: {error.reason}")


def refusal_text(name: str, refusal: str) -> str:
    """Why an operation may not be started (or scheduled) by hand, for the message."""
    if refusal == rights.PRIVILEGED_REFUSAL:
        return (
            f"Starting {name} needs the permission {rights.PRIVILEGED_PERMISSION} "
            "(it reads or replaces data beyond its own rows)."
        )
    return f"{name} is started by the site itself, never by hand."


def refuse_operation(
    request: HttpRequest, name: str, refusal: str, template: str, context: dict[str, Any]
) -> HttpResponse:
    """403 with the page and the reason, counted in Security (``start_refusal``'s reasons)."""
    text = refusal_text(name, refusal)
    count_refusal(request, f"no-permission:start-{refusal}", text)
    messages.error(request, text)
    return render(request, template, context, status=403)


@dataclass(frozen=True)
class Chosen:
    """The operation a form page is for, and the page's context so far."""

    name: str
    operation: Any
    context: dict[str, Any]


def choose_operation(request: HttpRequest, section: str, template: str) -> Chosen | HttpResponse:
    """The operation asked for (``?operation=``, or the POSTed one) among those this user
    may start — New job and New schedule alike.

    Anything else is answered here: no choice or an unknown name, the page with the
    list (and a message); an operation this user may not start, 403 with the reason,
    counted in Security (``refuse_operation``).
    """
    everything = dict(sorted(registered().items()))
    available = startable(request.user, everything)
    source = request.POST if request.method == "POST" else request.GET
    name = source.get("operation") or ""
    operation = available.get(name)
    context = page_context(request, section, operations=available, chosen=name if operation else "")
    if operation is not None:
        return Chosen(name, operation, context)
    if name in everything:
        refusal = start_refusal(request.user, everything[name]) or rights.SYSTEM_REFUSAL
        return refuse_operation(request, name, refusal, template, context)
    if name:
        messages.error(request, f"There is no operation named {name[:100]!r}.")
    return render(request, template, context)


@staff_required
def new_job(request: HttpRequest) -> HttpResponse:
    """Only the operations this user may start are listed, and only they are accepted."""
    if not can_add(request.user):
        return refuse(request, "no-permission:add", "You may not start jobs.")
    chosen = choose_operation(request, "new", "problems/new_job.html")
    if isinstance(chosen, HttpResponse):
        return chosen
    name, operation, context = chosen.name, chosen.operation, chosen.context
    bound = request.method == "POST"
    form = _input_form(operation, request.POST if bound else None)
    options = OptionsForm(request.POST if bound else None, prefix="job")
    if bound and form.is_valid() and options.is_valid():
        try:
            job = engine.enqueue(
                name,
                _job_input(form),
                owner=audit.actor(request),
                priority=options.cleaned_data.get("priority"),
                on_restart=options.cleaned_data.get("on_restart") or None,
            )
        except InputRejected as error:
            _attach(error, form, options)
        except (UnknownOperation, DurableError) as error:
            form.add_error(None, str(error))
        else:
            if not job.created:
                # The operation's unique key (one restore per database, one move per
                # pair of storages…) returned the unfinished job: nothing was started.
                messages.info(
                    request,
                    f"Job {job.pk} ({job.operation}) is already doing this ({job.state}); "
                    "nothing new was started.",
                )
                return redirect("problems:job", job.pk)
            audit.record_action(
                request,
                audit.CREATED_EVENT,
                detail=f"{audit.actor(request)} started job {job.pk} ({name})",
                done=True,
                job_ids=[job.pk],
                titles=[name],
                job_id=job.pk,
                operation=name,
            )
            messages.success(request, f"Job {job.pk} ({name}) is queued.")
            return redirect("problems:job", job.pk)
    context.update(operation=operation, form=form, options=options)
    return render(request, "problems/new_job.html", context)
