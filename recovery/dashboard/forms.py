"""The dashboard's forms: a job's input and options, a schedule's timing, a recorded event.

The limits come from the rules their targets enforce (``durable.rules`` for a
job's priority, the parser's column sizes for an event), so a form never
accepts what the engine would refuse, nor refuses what it would accept. The
``attach_*`` helpers put an engine refusal (``InputRejected``) beside the field
it names, for input that only the engine can judge.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.serializers.json import DjangoJSONEncoder

from durable.errors import InputRejected
from durable.models.schedules import Schedule
from durable.operations import Operation
from durable.rules import PRIORITY_MAX, PRIORITY_MIN
from durable.schedules.timing import CatchUp, parse_interval
from durable.states import OnRestart
from recovery.models import Severity
from recovery.parsing import MAX_SOURCE_CHARS, MAX_TYPE_CHARS

# --- a job's input and options (New job, New schedule) -------------------------------------


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
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        required=False,
        help_text=f"Higher runs first ({PRIORITY_MIN}…{PRIORITY_MAX}).",
    )
    on_restart = forms.ChoiceField(
        choices=[("", "The operation's default"), *OnRestart.choices],
        required=False,
        label="After a server restart",
    )


def input_form(operation: Operation, data: Any = None) -> forms.Form:
    """The operation's own input form, or a JSON object for one that has none."""
    form_class = getattr(operation, "input_form", None) or JsonInputForm
    return form_class(data, prefix="input")


def job_input(form: forms.Form) -> dict[str, Any]:
    """A valid input form's data as the job will store it."""
    if isinstance(form, JsonInputForm):
        return form.job_input()
    # Dates, decimals, UUIDs… as JSON, the way the job will store them.
    return json.loads(json.dumps(form.cleaned_data, cls=DjangoJSONEncoder))


def attach_job_refusal(error: InputRejected, form: forms.Form, options: OptionsForm) -> None:
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


# --- a schedule's timing (New schedule) ------------------------------------------------------


class ScheduleForm(forms.Form):
    """When and how a schedule runs; what it runs is the operation's own input form."""

    name = forms.CharField(max_length=100, help_text="Unique, e.g. nightly-backup.")
    timing = forms.ChoiceField(
        choices=[("cron", "At times (cron)"), ("interval", "Every interval")],
        initial="cron",
        widget=forms.RadioSelect,
    )
    cron = forms.CharField(
        required=False,
        max_length=200,
        help_text="5 fields in the schedule's time zone: '30 3 * * *', '*/15 * * * MON-FRI', "
        "@daily…",
    )
    every = forms.CharField(
        required=False, max_length=20, label="Interval", help_text="90s, 15m, 1h, 1d, 2w."
    )
    time_zone = forms.CharField(
        required=False, max_length=64, help_text="For cron, an IANA name; empty: TIME_ZONE."
    )
    catch_up = forms.ChoiceField(
        choices=[
            (CatchUp.LATEST.value, "After downtime, run the latest missed occurrence once"),
            (CatchUp.SKIP.value, "After downtime, skip the missed occurrences"),
        ],
        initial=CatchUp.LATEST.value,
        label="Catch-up",
    )
    overlap = forms.BooleanField(
        required=False, help_text="Start a job even while the previous one is unfinished."
    )
    priority = forms.IntegerField(
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        required=False,
        help_text="Empty: the operation's.",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def clean_name(self) -> str:
        """The service's rule for a name, checked here so its refusals name the right field."""
        name = self.cleaned_data["name"].strip()
        if not name or any(ch.isspace() and ch != " " for ch in name):
            raise forms.ValidationError("1 to 100 characters, no tabs or newlines.")
        if Schedule.objects.filter(name=name).exists():
            raise forms.ValidationError(f"a schedule named {name!r} exists")
        return name

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("timing") == "interval":
            text = (data.get("every") or "").strip()
            if not text:
                self.add_error("every", "Give an interval, e.g. 15m.")
            else:
                try:
                    data["interval"] = parse_interval(text)
                except ValueError as exc:
                    self.add_error("every", str(exc))
            data["cron"] = ""
        elif data.get("timing") == "cron":
            if not (data.get("cron") or "").strip():
                self.add_error("cron", "Give a cron expression, e.g. 30 3 * * *.")
            data["interval"] = None
        return data


# The fields of ``add_schedule`` itself, as its refusals (InputRejected.field) name them;
# any other field is the operation's input. "name" is both for an operation whose
# input has a name (backup.database): ScheduleForm checks the schedule's own name
# first, so a refusal on "name" from the service is the input's, unless it says
# the schedule name is taken (a race with another user adding the same name).
SCHEDULE_FIELDS = {
    "name": "name",
    "cron": "cron",
    "interval": "every",
    "time_zone": "time_zone",
    "catch_up": "catch_up",
    "priority": "priority",
}


def attach_schedule_refusal(
    error: InputRejected, form: forms.Form, schedule_form: ScheduleForm
) -> None:
    """Show the service's refusal beside the field it names."""
    field = error.field
    input_name = field.removeprefix("input.")
    ours = field in SCHEDULE_FIELDS and not (
        field == "name" and "name" in form.fields and not error.reason.startswith("a schedule")
    )
    if ours:
        schedule_form.add_error(SCHEDULE_FIELDS[field], error.reason)
    elif input_name in form.fields:
        form.add_error(input_name, error.reason)
    elif isinstance(form, JsonInputForm):
        form.add_error("input", f"{field}: {error.reason}")
    else:
        form.add_error(None, f"{field}: {error.reason}")


# --- a Recovery event recorded by hand ---------------------------------------------------------

MAX_DETAIL_CHARS = 4000


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
