"""The Schedules page: the list with enabled / next run, "New schedule" (cron or interval, the
operation's form or JSON), Enable / Disable / Delete with their permissions and audit — all
through durable.schedules' own API, and the schedule's operation under New job's access rule."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from durable.schedules.models import Schedule
from durable.schedules.service import add_schedule, ensure_schedule, remove_schedule, tick
from recovery.models import RecoveryEvent, SecurityEvent

pytestmark = pytest.mark.django_db
LIST = "/problems/schedules/"
NEW = "/problems/schedules/new/"


@pytest.fixture(autouse=True)
def only_the_tests_schedules():
    """``migrate`` creates the site's standing ingest schedule; these tests make their own."""
    remove_schedule("recovery-ingest")


def change(client, schedule: Schedule, what: str, **data: str):
    return client.post(reverse("problems:schedule-change", args=[schedule.pk, what]), data)


def form(operation: str = "durable.noop", **fields: str) -> dict[str, str]:
    data = {"operation": operation, "schedule-name": "nightly", "schedule-timing": "cron",
            "schedule-cron": "30 3 * * *", "schedule-catch_up": "latest",
            "schedule-enabled": "on", "input-input": '{"units": 2}'}  # fmt: skip
    data.update({key if "-" in key else f"schedule-{key}": value for key, value in fields.items()})
    return data


def names(html: str) -> list[str]:
    return re.findall(r'<tr id="schedule-\d+" class="schedule[^"]*">\s*<td>([^<]+)<', html)


# --- the list ------------------------------------------------------------------------------------


def test_list__rule_enabled_next_run_and_the_last_occurrence(client_for):
    now = timezone.now()
    due = add_schedule("every-minute", "durable.noop", every=timedelta(minutes=1), now=now)
    add_schedule("nightly", "durable.noop", cron="30 3 * * *", input={"units": 3})
    add_schedule("off", "durable.noop", every=timedelta(hours=1), enabled=False)
    ensure_schedule("site-managed", "durable.noop", every=timedelta(hours=6))
    (occurrence,) = tick(now + timedelta(minutes=1, seconds=1))  # a worker's heartbeat
    html = client_for("readonly").get(LIST).content.decode()
    assert names(html) == ["every-minute", "nightly", "off", "site-managed"]
    row = html.split(f'id="schedule-{due.pk}"', 1)[1].split("</tr>", 1)[0]
    assert "every 1m" in row
    assert "Enabled" in row
    assert f"enqueued job {occurrence.job_id}" in row
    assert f'href="/problems/jobs/{occurrence.job_id}/"' in row
    assert "managed by settings" in html
    assert "&quot;units&quot;: 3" in html  # the input, escaped
    assert "cron 30 3 * * * (UTC)" in html
    assert "act-" not in html  # read-only: no buttons
    assert "New schedule" not in html


def test_list__search_filter_and_reachable_from_the_menu_and_the_jobs_page(client_for):
    add_schedule("backup-nightly", "durable.noop", cron="@daily")
    add_schedule("scan-hourly", "test.form", every=timedelta(hours=1), enabled=False,
                 input={"source": "/srv/a", "copies": 1})  # fmt: skip
    client = client_for("readonly")
    assert names(client.get(LIST, {"q": "BACKUP"}).content.decode()) == ["backup-nightly"]
    assert names(client.get(LIST, {"q": "test.form"}).content.decode()) == ["scan-hourly"]
    assert names(client.get(LIST, {"enabled": "disabled"}).content.decode()) == ["scan-hourly"]
    assert names(client.get(LIST, {"q": "%"}).content.decode()) == []  # literal
    jobs_page = client.get(reverse("problems:jobs")).content.decode()
    assert f'href="{LIST}"' in jobs_page.split('<nav class="menu"', 1)[1].split("</nav>")[0]
    assert f'<a class="button" href="{LIST}">Schedules</a>' in jobs_page
    assert (
        f'href="{LIST}"' not in client_for("pauser").get(reverse("problems:jobs")).content.decode()
    )


@pytest.mark.parametrize(
    "params",
    [{"page": "abc"}, {"page": str(10**30)}, {"per_page": "-1"}, {"enabled": "maybe"},
     {"q": "\x00"}, {"q": ".*+?^${}()|[]\\"}],
)  # fmt: skip
def test_list__garbage_parameters_give_a_sane_page(client_for, params):
    add_schedule("one", "durable.noop", every=timedelta(hours=1))
    response = client_for("readonly").get(LIST, params)
    assert response.status_code == 200
    assert b"page 1 / 1" in response.content


# --- New schedule ----------------------------------------------------------------------------


def test_new__a_cron_schedule_with_json_input(client_for):
    client = client_for("scheduler")
    page = client.get(NEW, {"operation": "durable.noop"}).content.decode()
    for field in ("schedule-name", "schedule-cron", "schedule-every", "input-input"):
        assert f'name="{field}"' in page
    response = client.post(NEW, form(time_zone="Europe/Helsinki"), follow=True)
    schedule = Schedule.objects.get()
    assert response.redirect_chain[-1][0] == LIST
    assert "Schedule &#x27;nightly&#x27; added; first run" in response.content.decode()
    assert (schedule.operation, schedule.cron) == ("durable.noop", "30 3 * * *")
    assert schedule.interval is None
    assert schedule.input == {"units": 2}  # checked by the operation, stored as given
    assert schedule.time_zone == "Europe/Helsinki"
    assert (schedule.enabled, schedule.managed) == (True, False)
    assert schedule.next_run_at > timezone.now()
    audit = RecoveryEvent.objects.get(type="schedule-created")
    assert (audit.username, audit.operation, audit.done) == ("scheduler", "durable.noop", True)
    assert audit.object_ids == [f"schedule:{schedule.pk}"]
    assert "added schedule 'nightly'" in audit.detail


def test_new__an_interval_schedule_through_the_operations_own_form(client_for):
    client = client_for("scheduler")
    data = {"operation": "test.form", "schedule-name": "copies", "schedule-timing": "interval",
            "schedule-every": "15m", "schedule-catch_up": "skip", "schedule-overlap": "on",
            "input-source": "/srv/a", "input-copies": "2"}  # fmt: skip
    assert client.post(NEW, data).status_code == 302
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.interval) == ("", timedelta(minutes=15))
    assert (schedule.catch_up, schedule.overlap, schedule.enabled) == ("skip", True, False)
    assert schedule.next_run_at is None  # added disabled: the box was not ticked
    assert schedule.input == {"source": "/srv/a", "copies": 2, "not_before": None}


@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({"cron": "61 * * * *"}, "schedule-cron", ""),  # the service's own refusal
        ({"cron": ""}, "schedule-cron", "Give a cron expression"),
        ({"timing": "interval", "every": ""}, "schedule-every", "Give an interval"),
        ({"timing": "interval", "every": "soon"}, "schedule-every", "is not an interval"),
        ({"time_zone": "Mars/Olympus"}, "schedule-time_zone", ""),
        ({"name": "two\nlines"}, "schedule-name", ""),
        ({"input-input": "{units"}, "input-input", "Not valid JSON"),
        ({"input-input": '{"units": -1}'}, "input-input", "units: must be"),
        ({"input-input": '{"password": "x"}'}, "input-input", "password"),
    ],
)
def test_new__refusals_are_shown_beside_their_field_and_add_nothing(client_for, fields, field,
                                                                     text):  # fmt: skip
    response = client_for("scheduler").post(NEW, form(**fields))
    html = response.content.decode()
    assert response.status_code == 200
    errors = re.findall(rf'id="id_{field}-error">([^<]*)<', html)
    assert errors, html[html.find("msg-error") - 200 :][:600]
    assert text in errors[0]
    assert not Schedule.objects.exists()
    assert not RecoveryEvent.objects.filter(type="schedule-created").exists()


def test_new__a_name_already_taken_is_refused_on_the_name(client_for):
    add_schedule("nightly", "durable.noop", every=timedelta(hours=1))
    html = client_for("scheduler").post(NEW, form()).content.decode()
    assert re.search(
        r'id="id_schedule-name-error">a schedule named &#x27;nightly&#x27; exists', html
    )
    assert Schedule.objects.count() == 1


def test_new__only_operations_the_user_may_start_are_offered_and_accepted(client_for):
    scheduler, admin = client_for("scheduler"), client_for("admin")
    offered = scheduler.get(NEW).content.decode()
    assert "?operation=durable.noop" in offered
    assert "?operation=test.one_per_target" not in offered  # PRIVILEGED
    assert "?operation=recovery.bulk_action" not in offered  # SYSTEM
    refused = scheduler.post(NEW, form("test.one_per_target", **{"input-input": "{}"}))
    assert refused.status_code == 403
    assert "needs the permission durable.start_privileged_job" in refused.content.decode()
    system = admin.post(NEW, form("recovery.search_index", **{"input-input": "{}"}))
    assert system.status_code == 403
    assert "started by the site itself" in system.content.decode()
    assert not Schedule.objects.exists()
    assert admin.post(NEW, form("test.one_per_target", **{"input-input": "{}"})).status_code == 302
    assert Schedule.objects.get().operation == "test.one_per_target"
    assert SecurityEvent.objects.filter(key="no-permission:start-privileged").exists()


def test_new__needs_add_schedule(client_for):
    response = client_for("readonly").post(NEW, form())
    assert response.status_code == 403
    assert not Schedule.objects.exists()
    assert SecurityEvent.objects.get(key="no-permission:schedule-add").users == {"readonly": 1}


# --- enable, disable, delete --------------------------------------------------------------------


def test_disable_then_enable__through_the_service_and_audited(client_for):
    schedule = add_schedule("hourly", "durable.noop", every=timedelta(hours=1))
    client = client_for("scheduler")
    page = client.get(LIST).content.decode()
    assert "act-disable" in page
    assert "act-delete" in page
    response = change(client, schedule, "disable")
    assert response["Location"] == LIST
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.next_run_at) == (False, None)
    assert change(client, schedule, "disable").status_code == 302  # twice: harmless
    change(client, schedule, "enable")
    schedule.refresh_from_db()
    assert schedule.enabled
    assert schedule.next_run_at > timezone.now()
    details = list(
        RecoveryEvent.objects.filter(type="schedule-action")
        .order_by("id")
        .values_list("detail", flat=True)
    )
    assert [d.split(": ", 1)[1].split(" (")[0] for d in details] == [
        "disabled schedule 'hourly'", "disabled schedule 'hourly'", "enabled schedule 'hourly'"
    ]  # fmt: skip


def test_enable__a_privileged_operations_schedule_needs_the_right_disable_does_not(client_for):
    schedule = add_schedule("targets", "test.one_per_target", every=timedelta(hours=1),
                            enabled=False)  # fmt: skip
    client = client_for("scheduler")
    refused = change(client, schedule, "enable")
    assert refused.status_code == 403
    assert "needs the permission durable.start_privileged_job" in refused.content.decode()
    schedule.refresh_from_db()
    assert not schedule.enabled
    change(client_for("admin"), schedule, "enable")
    change(client, schedule, "disable")  # stopping work needs no right beyond change_schedule
    schedule.refresh_from_db()
    assert not schedule.enabled


def test_delete__asks_first_then_deletes_and_keeps_the_jobs(client_for):
    now = timezone.now()
    schedule = add_schedule("gone", "durable.noop", every=timedelta(minutes=1), now=now)
    (occurrence,) = tick(now + timedelta(minutes=2))
    client = client_for("scheduler")
    confirm = change(client, schedule, "delete")
    assert confirm.status_code == 200
    assert "Delete the schedule <strong>gone</strong>" in confirm.content.decode()
    assert Schedule.objects.filter(pk=schedule.pk).exists()  # not yet
    done = change(client, schedule, "delete", confirmed="1")
    assert done["Location"] == LIST
    assert not Schedule.objects.exists()
    from durable.models import Job

    assert Job.objects.filter(pk=occurrence.job_id).exists()
    assert RecoveryEvent.objects.get(type="schedule-action").detail.startswith(
        "scheduler: deleted schedule 'gone'"
    )


def test_delete__a_managed_schedule_is_refused_disable_is_offered(client_for):
    schedule = ensure_schedule("retention-like", "durable.noop", every=timedelta(days=1))
    client = client_for("scheduler")
    assert "act-delete" not in client.get(LIST).content.decode()
    response = change(client, schedule, "delete", confirmed="1")
    page = client.get(response["Location"]).content.decode()
    assert "managed by the site&#x27;s settings" in page
    assert Schedule.objects.filter(pk=schedule.pk).exists()


@pytest.mark.parametrize(("role", "what"), [("readonly", "disable"), ("readonly", "delete"),
                                            ("pauser", "enable")])  # fmt: skip
def test_changes__need_their_permission(client_for, role, what):
    schedule = add_schedule("kept", "durable.noop", every=timedelta(hours=1), enabled=False)
    response = change(client_for(role), schedule, what, confirmed="1")
    assert response.status_code == 403
    assert Schedule.objects.filter(pk=schedule.pk, enabled=False).exists()


def test_changes__an_unknown_change_or_schedule(client_for):
    schedule = add_schedule("kept", "durable.noop", every=timedelta(hours=1))
    client = client_for("admin")
    assert change(client, schedule, "explode").status_code == 404
    missing = client.post(reverse("problems:schedule-change", args=[424242, "disable"]),
                          follow=True)  # fmt: skip
    assert "Schedule 424242 does not exist" in missing.content.decode()
