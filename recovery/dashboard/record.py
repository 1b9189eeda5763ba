"""Recording a Recovery event by hand: what an administrator did outside the app.

A restore done with ``sqlite3`` at 3 a.m., a disk swapped, a board deleted on
purpose: the report should say so. Needs Django's ``recovery.add_recoveryevent``
permission. The event carries who recorded it and from where; an error is
published to the configured webhooks and mail like one from the JSONL file.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from recovery.models import EventType
from recovery.notify import publish_recorded
from recovery.records import record_event

from .access import can_record, refuse, request_ip, staff_required
from .context import page_context
from .forms import RecordEventForm

SOURCE = "admin-panel"


@staff_required
def record(request: HttpRequest) -> HttpResponse:
    if not can_record(request.user):
        return refuse(request, "no-permission:record", "You may not record Recovery events.")
    form = RecordEventForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        user = request.user
        event = record_event(
            data["type"],
            severity=data["severity"],
            detail=data["detail"],
            db=data["db"],
            source=SOURCE,
            done=data["outcome"] == "done",
            deleted_data=data["deleted_data"],
            user_id=user.pk,
            username=user.get_username(),
            ip=request_ip(request),
        )
        if event is None:
            form.add_error(None, "The event could not be recorded; the server log says why.")
        else:
            publish_recorded(event)
            messages.success(request, f"Recorded {event.type!r} as event {event.pk}.")
            return redirect("problems:recovery")
    context = page_context(request, "recovery", form=form, known_types=EventType.ALL)
    return render(request, "problems/record_event.html", context)
