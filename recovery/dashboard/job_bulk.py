"""Actions on many jobs at once: the ticked rows, or every job matching the Jobs filter.

Both ask for a confirmation first (how many jobs, in which states). The ticked
rows (one page at most) are acted on in the request; a whole filter may be
100,000 jobs, so it becomes a durable job of its own (``bulk``,
``recovery.bulk_action``) whose progress the user follows.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib import messages
from django.db.models import Count, Max, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from durable import jobs as engine
from durable.models import Job

from . import audit
from .access import can_act, refuse, request_ip, staff_required
from .actions import LABELS, summarize
from .bulk import BATCH_SIZE
from .bulk import OPERATION as BULK_OPERATION
from .context import page_context
from .engine_actions import ENGINE_ACTIONS, apply_to
from .listing import JOB_FILTERS, job_filter, job_spec
from .query import PER_PAGE_MAX, parse_choice, parse_int, parse_table_query
from .responses import safe_next


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
        targets: QuerySet[Job] = Job.objects.filter(pk__in=ids)
        context: dict[str, Any] = {
            "ids": ids,
            "what": f"{len(ids)} selected job{'s' if len(ids) != 1 else ''}",
        }
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
    if not getattr(job, "created", True):  # set by enqueue(), not a column
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
