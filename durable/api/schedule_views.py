"""``/schedules``: scheduled rules through ``durable.schedules.service``, never its tables.

Scopes ``schedules:read`` and ``schedules:write``; the schedule's operation
obeys the rule a submission does (``auth.authorize_operation``), because every
occurrence starts it: creating or enabling a schedule of a privileged
operation needs ``jobs:admin`` as well. Disabling and removing one stop work
and need no more than ``schedules:write``, as on the dashboard. Schedules are
addressed by id, like jobs; their names stay unique (a second POST with a
name already taken is ``409``, so retrying a create is safe).
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse

from ..errors import InputRejected
from ..models.api import Client
from ..models.schedules import Schedule
from ..schedules.service import add_schedule, remove_schedule, set_enabled
from .auth import authorize_operation, authorize_schedule_enable
from .errors import Refusal, rejected_input
from .parse import (
    parse_schedule,
    parse_schedule_list_query,
    parse_schedule_patch,
)
from .render import occurrence_json, schedule_json, schedule_url
from .views import (
    endpoint,
    json_response,
    keyset_page,
    no_content,
    query_params,
    read_json_body,
    row_or_404,
)

log = logging.getLogger("durable.api")

RECENT_OCCURRENCES = 10
# What parse_schedule has already checked; the service refusing one of these again is
# about that field. Anything else it refuses is in the input (an input may well have
# a field called "name": a backup's).
SCHEDULE_LEVEL_FIELDS = frozenset({"cron", "interval", "time_zone", "catch_up", "priority"})


def _schedule_or_404(schedule_id: int) -> Schedule:
    return row_or_404(Schedule.objects.all(), schedule_id, "schedule")


def _exists(name: str) -> Refusal:
    existing = Schedule.objects.filter(name=name).values_list("pk", flat=True).first()
    where = f" ({schedule_url(existing)})" if existing else ""
    return Refusal(
        409,
        "schedule_exists",
        f"a schedule named {name!r} exists{where}; choose another name, or change that one",
    )


def _log(message: str, schedule: Schedule, client: Client) -> None:
    """Who changed which schedule: the service logs what changed, not who asked."""
    log.info(message, extra={"schedule": schedule.name, "id": schedule.pk, "actor": client.actor})


@endpoint({"GET": "schedules:read", "POST": "schedules:write"})
def schedules_view(request: HttpRequest, client: Client) -> HttpResponse:
    if request.method == "POST":
        return create_schedule(request, client)
    return list_schedules(request)


def create_schedule(request: HttpRequest, client: Client) -> HttpResponse:
    spec = parse_schedule(read_json_body(request))
    authorize_operation(request, client, spec.operation)
    if Schedule.objects.filter(name=spec.name).exists():
        raise _exists(spec.name)
    try:
        schedule = add_schedule(
            spec.name,
            spec.operation,
            cron=spec.cron,
            every=spec.every,
            input=spec.input,
            time_zone=spec.time_zone,
            catch_up=spec.catch_up,
            overlap=spec.overlap,
            queue=spec.queue,
            priority=spec.priority,
            enabled=spec.enabled,
        )
    except InputRejected as exc:
        if exc.field == "name" and Schedule.objects.filter(name=spec.name).exists():
            raise _exists(spec.name) from None  # created by someone else meanwhile
        raise rejected_input(exc.field, exc.reason, SCHEDULE_LEVEL_FIELDS) from None
    _log("schedule added", schedule, client)
    return json_response(schedule_json(schedule), 201, {"Location": schedule_url(schedule.pk)})


def list_schedules(request: HttpRequest) -> HttpResponse:
    """Newest first, keyset-paginated on id, like the jobs."""
    query = parse_schedule_list_query(query_params(request))
    rows = Schedule.objects.all()
    if query.operation is not None:
        rows = rows.filter(operation=query.operation)
    page, cursor, next_url = keyset_page(
        request, rows, before_id=query.before_id, limit=query.limit
    )
    return json_response(
        {
            "schedules": [schedule_json(schedule) for schedule in page],
            "next_cursor": cursor,
            "next": next_url,
        }
    )


@endpoint({"GET": "schedules:read", "PATCH": "schedules:write", "DELETE": "schedules:write"})
def schedule_view(request: HttpRequest, client: Client, schedule_id: int) -> HttpResponse:
    schedule = _schedule_or_404(schedule_id)
    if request.method == "GET":
        recent = schedule.occurrences.order_by("-scheduled_for")[:RECENT_OCCURRENCES]
        body = schedule_json(schedule)
        body["recent_occurrences"] = [occurrence_json(o) for o in recent]
        return json_response(body)
    if request.method == "PATCH":
        enabled = parse_schedule_patch(read_json_body(request))
        if enabled:
            authorize_schedule_enable(request, client, schedule.operation)
        try:
            schedule = set_enabled(schedule.name, enabled)
        except Schedule.DoesNotExist:
            raise Refusal(404, "not_found", f"there is no schedule {schedule_id}") from None
        _log("schedule enabled" if enabled else "schedule disabled", schedule, client)
        return json_response(schedule_json(schedule))
    if schedule.managed:
        raise Refusal(
            409,
            "managed_schedule",
            f"{schedule.name!r} comes from the site's settings and is created again at every "
            "worker start; disable it instead (PATCH with enabled: false)",
        )
    if not remove_schedule(schedule.name):
        raise Refusal(404, "not_found", f"there is no schedule {schedule_id}")
    _log("schedule removed", schedule, client)
    return no_content()
