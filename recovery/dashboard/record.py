"""Recording a Recovery event by hand: what an administrator did outside the app.

A restore done with ``sqlite3`` at 3 a.m., a disk swapped, a board deleted on
purpose: the report should say so. Needs Django's ``recovery.add_recoveryevent``
permission. The event carries who recorded it and from where; an error is
published to the configured webhooks and mail like one from the JSONL file.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from recovery.models import EventType, Severity
from recovery.notify import publish_recorded
from recovery.parsing import MAX_SOURCE_CHARS, MAX_TYPE_CHARS
from recovery.records import record_event

from .access import can_record, refuse, request_ip, staff_required
from .views import page_context

MAX_DETAIL_CHARS = 4000
SOURCE = "admin-panel"


class RecordEventForm(forms.Form):
    type = forms.CharField(
        max_length=MAX_TYPE_CHARS,
        help_text="A known type (listed as you type) or any short name, e.g. restore-backup.",
        widget=forms.TextInput(attrs={"list": "known-types", "autocomplete": "off"}),
    )
    severity = forms.ChoiceField(choices=Severity.choices, initial=Severity.INFO)
    outcome = forms.ChoiceField(
        choices=[("done", "Done"), ("failed", "Failed: still needs attention")], initial="done"
    )
    db = forms.CharField(max_length=MAX_SOURCE_CHARS, required=False, label="Database")
    detail = forms.CharField(
        max_length=MAX_DETAIL_CHARS, widget=forms.Textarea(attrs={"rows": 4}),
        help_text="What happened and what was done; shown escaped, as written.",
    )  # fmt: skip
    deleted_data = forms.BooleanField(required=False, label="Data was deleted")

    def clean_type(self) -> str:
        value = " ".join(self.cleaned_data["type"].split())
        if not value:
            raise forms.ValidationError("A type is required.")
        return value


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
