"""One job's action buttons (pause, resume, cancel, retry, discard): POST with CSRF,
through ``durable.jobs`` (``engine_actions``).

The engine's ``Outcome`` says applied / already so / refused, so a double click
does nothing twice and a refused transition is a message, never a 500. htmx
requests get the updated row (or detail) plus the message; plain form posts are
redirected back with the message.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from durable.models import Job

from . import audit
from .access import allowed_actions, can_act, refuse, staff_required
from .actions import describe
from .context import page_context
from .engine_actions import ENGINE_ACTIONS
from .job_context import CHANGED_EVENT, decorate, detail_context
from .responses import safe_next, wants_fragment


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
