"""``/api/schedules``: scheduled rules managed through the API, on durable.schedules' service.

In-process like test_api.py; every response is checked against the OpenAPI document.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from durable.models import Job
from durable.operations import Access, get_operation
from durable.schedules.models import Schedule
from durable.schedules.service import ensure_schedule, tick

pytestmark = pytest.mark.django_db

SCHEDULER = ("schedules:read", "schedules:write")
NIGHTLY = {"name": "nightly", "operation": "durable.noop", "cron": "30 3 * * *"}


@pytest.fixture(autouse=True)
def no_site_schedules(db):
    """Start from an empty table: the recovery app installs its ingest schedule on migrate."""
    Schedule.objects.all().delete()


@pytest.fixture
def scheduler(api, make_client):
    """The ``api`` client with a token that may read and write schedules (not jobs:admin)."""
    _, token = make_client("scheduler", SCHEDULER)
    return api.with_token(token)


@pytest.fixture
def admin(api, make_client):
    _, token = make_client("ops", (*SCHEDULER, "jobs:admin"))
    return api.with_token(token)


def create(client, body, **kwargs):
    return client.post(
        "/api/schedules",
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **kwargs.pop("headers", {})},
        **kwargs,
    )


def patch(client, schedule_id, body):
    return client.patch(
        f"/api/schedules/{schedule_id}",
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )


def fields(response) -> list[str]:
    return [error["field"] for error in response.json().get("errors", [])]


# --- create, read, list -------------------------------------------------------------------


def test_create__cron_schedule_is_201_with_location_and_its_next_run(scheduler):
    before = timezone.now()
    response = create(
        scheduler, {**NIGHTLY, "time_zone": "Europe/Helsinki", "catch_up": "skip", "priority": 4}
    )
    assert response.status_code == 201
    body = response.json()
    assert response.headers["Location"] == f"/api/schedules/{body['id']}" == body["url"]
    schedule = Schedule.objects.get()
    assert (schedule.name, schedule.operation, schedule.cron, schedule.time_zone) == (
        "nightly", "durable.noop", "30 3 * * *", "Europe/Helsinki",
    )  # fmt: skip
    assert (schedule.catch_up, schedule.priority, schedule.enabled) == ("skip", 4, True)
    assert schedule.next_run_at > before
    assert body["rule"] == "cron 30 3 * * * (Europe/Helsinki)"
    assert (body["interval"], body["time_zone"], body["managed"]) == (
        None, "Europe/Helsinki", False,
    )  # fmt: skip
    assert not Job.objects.exists()  # nothing runs until the first occurrence


def test_create__interval_schedule_keeps_its_input_as_given(scheduler):
    response = create(
        scheduler,
        {"name": "ticker", "operation": "durable.noop", "interval": "15m",
         "input": {"units": 2}, "enabled": False, "overlap": True, "queue": "bulk"},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["interval"], body["interval_seconds"], body["cron"]) == ("15m", 900.0, None)
    # Checked by durable.noop's clean_input, stored as given: its defaults ("sleep": 0)
    # are filled in for each occurrence's job.
    assert body["input"] == {"units": 2}
    assert (body["enabled"], body["next_run_at"], body["overlap"], body["queue"]) == (
        False, None, True, "bulk",
    )  # fmt: skip


def test_create__macros_and_nulls_mean_the_defaults(scheduler):
    body = {"name": "daily", "operation": "durable.noop", "cron": "@daily", "interval": None,
            "input": None, "time_zone": None, "catch_up": None, "overlap": None, "queue": None,
            "priority": None, "enabled": None}  # fmt: skip
    response = create(scheduler, body)
    assert response.status_code == 201, response.text
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.catch_up, schedule.enabled, schedule.queue) == (
        "0 0 * * *", "latest", True, "",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "bad"),
    [
        ({"name": "x", "operation": "durable.noop"}, ["cron"]),  # no timing
        ({**NIGHTLY, "interval": "1h"}, ["cron"]),  # both
        ({**NIGHTLY, "cron": "61 * * * *"}, ["cron"]),
        ({**NIGHTLY, "cron": "* * *"}, ["cron"]),
        ({"name": "x", "operation": "durable.noop", "interval": "soon"}, ["interval"]),
        ({"name": "x", "operation": "durable.noop", "interval": "0s"}, ["interval"]),
        ({**NIGHTLY, "time_zone": "Mars/Olympus"}, ["time_zone"]),
        ({**NIGHTLY, "name": "tab\tname"}, ["name"]),
        ({**NIGHTLY, "name": ""}, ["name"]),
        ({**NIGHTLY, "name": "x" * 101}, ["name"]),
        ({**NIGHTLY, "catch_up": "all"}, ["catch_up"]),
        ({**NIGHTLY, "priority": 101}, ["priority"]),
        ({**NIGHTLY, "overlap": "yes"}, ["overlap"]),
        ({**NIGHTLY, "enabled": 1}, ["enabled"]),
        ({**NIGHTLY, "queue": "a b"}, ["queue"]),
        ({**NIGHTLY, "input": []}, ["input"]),
        ({**NIGHTLY, "every": "1h"}, ["every"]),  # the command's option, not this field
        ({**NIGHTLY, "input": {"units": "many"}}, ["input.units"]),  # the operation says
        ({**NIGHTLY, "input": {"api_key": "abc12345"}}, ["input.api_key"]),  # never a secret
        ({**NIGHTLY, "input": {"note": "a\u0000b"}}, ["input.note"]),
    ],
)
def test_create__invalid_fields_are_400_with_field_errors(scheduler, body, bad):
    response = create(scheduler, body)
    assert response.status_code == 400, response.text
    assert fields(response) == bad
    assert not Schedule.objects.exists()


def test_create__an_input_field_called_name_is_reported_as_input(admin, settings, tmp_path):
    # backup.database has an input "name" too: its refusal must not read as the schedule's.
    settings.DURABLE_BACKUP_DIR = tmp_path
    (tmp_path / "taken").mkdir()
    body = {**NIGHTLY, "operation": "backup.database", "input": {"name": "taken"}}
    response = create(admin, body)
    assert response.status_code == 400
    assert fields(response) == ["input.name"]


def test_create__a_taken_name_is_409_and_names_the_schedule(scheduler):
    first = create(scheduler, NIGHTLY).json()
    again = create(scheduler, {**NIGHTLY, "cron": "@hourly"})
    assert again.status_code == 409
    assert again.json()["code"] == "schedule_exists"
    assert first["url"] in again.json()["detail"]
    assert Schedule.objects.get().cron == "30 3 * * *"  # untouched


def test_create__unknown_or_not_offered_operation_is_400(scheduler, settings):
    assert fields(create(scheduler, {**NIGHTLY, "operation": "no.such"})) == ["operation"]
    settings.DURABLE_API_OPERATIONS = ["test.rows"]
    assert fields(create(scheduler, NIGHTLY)) == ["operation"]
    assert create(scheduler, {**NIGHTLY, "operation": "test.rows"}).status_code == 201


def test_get__the_latest_occurrences_and_their_jobs(scheduler):
    schedule_id = create(scheduler, {**NIGHTLY, "cron": None, "interval": "1h"}).json()["id"]
    due = Schedule.objects.get().next_run_at
    tick(due + timedelta(seconds=1))
    body = scheduler.get(f"/api/schedules/{schedule_id}").json()
    [occurrence] = body["recent_occurrences"]
    job = Job.objects.get()
    assert occurrence["job_id"] == job.pk
    assert occurrence["job_url"] == f"/api/jobs/{job.pk}"
    assert job.owner == "schedule:nightly"  # nobody's own: API actions on it need jobs:admin
    assert body["last_run_at"] is not None


def test_list__newest_first_in_keyset_pages_with_filters(scheduler):
    ids = [
        create(scheduler, {**NIGHTLY, "name": f"s{i}", "operation": op}).json()["id"]
        for i, op in enumerate(["durable.noop", "test.rows", "durable.noop"])
    ]
    page = scheduler.get("/api/schedules", params={"limit": 2}).json()
    assert [s["id"] for s in page["schedules"]] == [ids[2], ids[1]]
    rest = scheduler.get(page["next"]).json()
    assert [s["id"] for s in rest["schedules"]] == [ids[0]]
    assert rest["next_cursor"] is None
    noop = scheduler.get("/api/schedules", params={"operation": "durable.noop"}).json()
    assert [s["id"] for s in noop["schedules"]] == [ids[2], ids[0]]
    everything = scheduler.get("/api/schedules?operation=&cursor=").json()
    assert len(everything["schedules"]) == 3
    assert scheduler.get("/api/schedules", params={"limit": "0"}).status_code == 400
    assert scheduler.get("/api/schedules", params={"name": "s1"}).status_code == 400


# --- enable, disable, delete ----------------------------------------------------------------


def test_patch__disable_then_enable(scheduler):
    schedule_id = create(scheduler, NIGHTLY).json()["id"]
    off = patch(scheduler, schedule_id, {"enabled": False})
    assert off.status_code == 200
    assert (off.json()["enabled"], off.json()["next_run_at"]) == (False, None)
    on = patch(scheduler, schedule_id, {"enabled": True})
    assert on.json()["enabled"] is True
    assert Schedule.objects.get().next_run_at > timezone.now()  # from now, no catching up
    for body in ({}, {"enabled": "no"}, {"enabled": True, "cron": "@daily"}):
        assert patch(scheduler, schedule_id, body).status_code == 400


def test_delete__204_then_404_and_its_jobs_stay(scheduler):
    schedule_id = create(scheduler, {**NIGHTLY, "cron": None, "interval": "1h"}).json()["id"]
    tick(Schedule.objects.get().next_run_at + timedelta(seconds=1))
    deleted = scheduler.delete(f"/api/schedules/{schedule_id}")
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert not Schedule.objects.exists()
    assert Job.objects.count() == 1  # the jobs it enqueued are not touched
    assert scheduler.delete(f"/api/schedules/{schedule_id}").status_code == 404
    assert scheduler.get(f"/api/schedules/{schedule_id}").status_code == 404


def test_delete__a_managed_schedule_is_409_but_may_be_disabled(scheduler):
    managed = ensure_schedule("site-retention", "durable.noop", cron="30 3 * * *")
    refused = scheduler.delete(f"/api/schedules/{managed.pk}")
    assert refused.status_code == 409
    assert refused.json()["code"] == "managed_schedule"
    assert patch(scheduler, managed.pk, {"enabled": False}).status_code == 200
    assert Schedule.objects.get().enabled is False


@pytest.mark.parametrize("path", ["/api/schedules/999", "/api/schedules/0",
                                  "/api/schedules/99999999999999999999999"])  # fmt: skip
def test_unknown_schedules_are_404(scheduler, path):
    assert scheduler.get(path).status_code == 404


def test_wrong_method_is_405(scheduler):
    assert scheduler.request("PUT", "/api/schedules").headers["Allow"] == "GET, POST"
    schedule_id = create(scheduler, NIGHTLY).json()["id"]
    response = scheduler.request("POST", f"/api/schedules/{schedule_id}")
    assert response.headers["Allow"] == "GET, PATCH, DELETE"


# --- who may do what --------------------------------------------------------------------------


def test_scopes__each_method_needs_its_own(api, make_client):
    _, reader = make_client("reader", ("schedules:read",))
    _, writer = make_client("writer", ("schedules:write",))
    _, jobs_only = make_client("jobs", ("jobs:read", "jobs:write", "jobs:admin"))
    assert create(api, NIGHTLY, token=reader).status_code == 403
    assert create(api, NIGHTLY, token=jobs_only).status_code == 403
    created = create(api, NIGHTLY, token=writer)
    assert created.status_code == 201
    schedule_id = created.json()["id"]
    assert api.get("/api/schedules", token=writer).status_code == 403  # write is not read
    assert api.get("/api/schedules", token=reader).status_code == 200
    assert api.get(f"/api/schedules/{schedule_id}", token=jobs_only).status_code == 403
    assert api.delete(f"/api/schedules/{schedule_id}", token=reader).status_code == 403
    assert Schedule.objects.count() == 1


def test_access__a_privileged_operation_needs_jobs_admin_to_schedule_or_enable(
    scheduler, admin, api
):
    body = {**NIGHTLY, "operation": "test.one_per_target", "input": {"target": "a"}}
    refused = create(scheduler, body)
    assert refused.status_code == 403
    assert refused.json()["code"] == "insufficient_scope"
    assert 'scope="jobs:admin"' in refused.headers["WWW-Authenticate"]
    assert not Schedule.objects.exists()
    schedule_id = create(admin, {**body, "enabled": False}).json()["id"]
    # Switching it on starts the operation: only an admin may.
    refused = patch(scheduler, schedule_id, {"enabled": True})
    assert refused.status_code == 403
    assert 'scope="jobs:admin"' in refused.headers["WWW-Authenticate"]
    assert Schedule.objects.get().enabled is False
    assert scheduler.get(f"/api/schedules/{schedule_id}").status_code == 200  # reading is fine
    assert patch(admin, schedule_id, {"enabled": True}).status_code == 200
    # Switching it off, or removing it, stops work: schedules:write is enough (the
    # dashboard's rule: change_schedule / delete_schedule, whatever the operation).
    assert patch(scheduler, schedule_id, {"enabled": False}).status_code == 200
    assert scheduler.delete(f"/api/schedules/{schedule_id}").status_code == 204
    assert not Schedule.objects.exists()


def test_access__a_system_operation_is_never_scheduled_or_enabled(scheduler, admin, monkeypatch):
    monkeypatch.setattr(type(get_operation("test.rows")), "access", Access.SYSTEM)
    refused = create(admin, {**NIGHTLY, "operation": "test.rows"})
    assert refused.status_code == 403
    assert refused.json()["code"] == "operation_not_allowed"
    site = ensure_schedule("site-deliveries", "test.rows", every=timedelta(minutes=1))
    assert patch(admin, site.pk, {"enabled": False}).status_code == 200  # stopping is fine
    refused = patch(admin, site.pk, {"enabled": True})
    assert refused.status_code == 403
    assert refused.json()["code"] == "operation_not_allowed"
    assert Schedule.objects.get().enabled is False


def test_access__a_schedule_of_an_unregistered_operation_needs_jobs_admin_to_enable(
    scheduler, admin
):
    schedule_id = create(scheduler, {**NIGHTLY, "enabled": False}).json()["id"]
    Schedule.objects.filter(pk=schedule_id).update(operation="removed.operation")
    assert patch(scheduler, schedule_id, {"enabled": True}).status_code == 403
    assert patch(admin, schedule_id, {"enabled": True}).status_code == 200
    assert patch(scheduler, schedule_id, {"enabled": False}).status_code == 200
    assert scheduler.delete(f"/api/schedules/{schedule_id}").status_code == 204
