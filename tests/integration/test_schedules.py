"""Schedules in one process: validation, ticking, catch-up, overlap, the standing schedules.

Real worker processes ticking one schedule at once, and killed mid-tick, are in
``test_builtin_workers.py``.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.apps import apps as django_apps
from django.core import checks
from django.core.management import CommandError, call_command
from django.utils import timezone

from durable import jobs
from durable.errors import InputRejected, UnknownOperation
from durable.models import Job
from durable.schedules.models import Occurrence, Schedule
from durable.schedules.service import (
    add_schedule,
    apply_due,
    ensure_schedule,
    remove_schedule,
    set_enabled,
    tick,
)
from recovery import schedules as standing
from recovery.models import RecoveryEvent

from .helpers import drain

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def no_standing_schedules():
    # The site's own schedules (created by migrate) would tick along in these tests.
    Schedule.objects.all().delete()


def hourly(name: str = "rows", **kwargs) -> Schedule:
    kwargs.setdefault("input", {"units": 2})
    return add_schedule(name, "test.rows", every=HOUR, **kwargs)


def schedule_jobs(schedule: Schedule) -> list[Job]:
    return list(Job.objects.filter(owner=f"schedule:{schedule.name}").order_by("id"))


# --- adding -------------------------------------------------------------------------------


def test_add__the_first_occurrence_is_the_first_one_after_now():
    now = timezone.now()
    schedule = add_schedule("daily", "durable.noop", cron="30 3 * * *", now=now)
    assert schedule.next_run_at > now
    assert (
        schedule.next_run_at.astimezone(timezone.get_fixed_timezone(0)).strftime("%H:%M") == "03:30"
    )
    assert (schedule.enabled, schedule.catch_up, schedule.managed) == (True, "latest", False)
    assert hourly(now=now).next_run_at == now + HOUR


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * *", "every": HOUR}, "cron"),  # both
        ({}, "cron"),  # neither
        ({"every": timedelta(seconds=0)}, "interval"),
        ({"cron": "0 3 * * *", "time_zone": "Mars/Base"}, "time_zone"),
        ({"every": HOUR, "catch_up": "all"}, "catch_up"),
        ({"every": HOUR, "priority": 101}, "priority"),
        ({"every": HOUR, "priority": "high"}, "priority"),  # a clear refusal, not a crash
        ({"every": HOUR, "queue": "a b"}, "queue"),  # a queue no job can have (durable.rules)
        ({"every": HOUR, "queue": "q" * 65}, "queue"),
        ({"every": HOUR, "input": {"units": "many"}}, "units"),  # the operation's own check
        ({"every": HOUR, "input": {"api_token": "x"}}, "api_token"),  # never a secret
        ({"every": HOUR, "input": ["not", "an", "object"]}, "input"),
    ],
)
def test_add__refuses_with_the_field(kwargs, field):
    with pytest.raises(InputRejected) as refused:
        add_schedule("bad", "durable.noop", **kwargs)
    assert refused.value.field == field
    assert not Schedule.objects.exists()


def test_add__refuses_an_unknown_operation_and_a_taken_name():
    with pytest.raises(UnknownOperation):
        add_schedule("x", "no.such.operation", every=HOUR)
    hourly("taken")
    with pytest.raises(InputRejected, match="exists"):
        hourly("taken")


# --- ticking --------------------------------------------------------------------------------


def test_tick__applies_a_due_occurrence_once_and_enqueues_its_job():
    schedule = hourly()
    due = schedule.next_run_at
    assert tick(due - timedelta(seconds=1)) == []
    (occurrence,) = tick(due, worker="w1")
    (job,) = schedule_jobs(schedule)
    assert (occurrence.scheduled_for, occurrence.job_id, occurrence.missed) == (due, job.pk, 0)
    assert (occurrence.note, occurrence.worker) == (f"enqueued job {job.pk}", "w1")
    assert (job.operation, job.input, job.unique_key) == (
        "test.rows",
        {"units": 2},
        f"schedule:{schedule.pk}",
    )
    schedule.refresh_from_db()
    assert (schedule.last_run_at, schedule.next_run_at) == (due, due + HOUR)
    # The same moment again (a second worker, a restarted one): nothing more.
    assert tick(due) == []
    assert apply_due(schedule.pk, now=due) is None
    assert len(schedule_jobs(schedule)) == 1
    assert drain(job.pk).state == "completed"


def test_tick__an_occurrence_already_recorded_is_never_applied_again():
    schedule = hourly()
    due = schedule.next_run_at
    tick(due)
    # Even if next_run_at were moved back onto it (a restored backup, a hand edit),
    # the unique (schedule, scheduled_for) record refuses a second application.
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=due)
    assert tick(due + timedelta(seconds=5)) == []
    assert Occurrence.objects.filter(schedule=schedule).count() == 1
    assert len(schedule_jobs(schedule)) == 1
    schedule.refresh_from_db()
    assert schedule.next_run_at == due + HOUR  # and the schedule moved on


def test_tick__only_schedules_whose_operation_this_process_knows():
    schedule = hourly()
    assert tick(schedule.next_run_at, operations=["durable.noop"]) == []
    assert tick(schedule.next_run_at, operations=["test.rows"]) != []


def test_tick__without_overlap_an_unfinished_job_is_not_doubled():
    schedule = hourly()
    due = schedule.next_run_at
    (first,) = tick(due)
    jobs.pause(first.job_id, actor="ops")
    (second,) = tick(due + HOUR)
    assert second.job_id == first.job_id
    assert (
        second.note
        == f"job {first.job_id} of an earlier occurrence is still paused: not enqueued again"
    )
    assert len(schedule_jobs(schedule)) == 1
    jobs.cancel(first.job_id, actor="ops")
    (third,) = tick(due + 2 * HOUR)  # a finished job does not hold the next one back
    assert third.job_id not in (None, first.job_id)


def test_tick__with_overlap_each_occurrence_gets_its_own_job():
    schedule = hourly(overlap=True)
    due = schedule.next_run_at
    tick(due)
    tick(due + HOUR)
    assert len(schedule_jobs(schedule)) == 2
    assert {job.unique_key for job in schedule_jobs(schedule)} == {None}


def test_tick__catch_up_latest_runs_once_for_the_latest_missed_occurrence(
    django_capture_on_commit_callbacks,
):
    schedule = hourly()
    due = schedule.next_run_at
    with django_capture_on_commit_callbacks(execute=True):
        (occurrence,) = tick(due + 10 * HOUR + timedelta(minutes=20))  # down for 10 hours
    assert (occurrence.scheduled_for, occurrence.missed) == (due + 10 * HOUR, 10)
    assert len(schedule_jobs(schedule)) == 1
    schedule.refresh_from_db()
    assert schedule.next_run_at == due + 11 * HOUR
    report = RecoveryEvent.objects.get(type="schedule-caught-up")
    assert (report.severity, report.job_id) == ("warning", occurrence.job_id)
    assert "10 earlier occurrence(s) were not run" in report.detail


def test_tick__catch_up_skip_runs_nothing_for_long_missed_occurrences():
    schedule = hourly(catch_up="skip")
    due = schedule.next_run_at
    (occurrence,) = tick(due + 10 * HOUR + timedelta(minutes=20))
    assert occurrence.job_id is None
    assert occurrence.note.startswith("skipped (catch-up: skip): this occurrence was 20m late")
    assert schedule_jobs(schedule) == []
    (on_time,) = tick(due + 11 * HOUR + timedelta(seconds=3))
    assert on_time.job_id is not None


def test_tick__an_input_the_operation_now_refuses_is_recorded_not_retried(
    django_capture_on_commit_callbacks,
):
    schedule = add_schedule("noop", "durable.noop", every=HOUR)
    Schedule.objects.filter(pk=schedule.pk).update(input={"units": "many"})
    with django_capture_on_commit_callbacks(execute=True):
        (occurrence,) = tick(schedule.next_run_at)
    assert occurrence.job_id is None
    assert occurrence.note.startswith("not enqueued: InputRejected: units")
    event = RecoveryEvent.objects.get(type="schedule-failed")
    assert (event.done, event.severity) == (False, "error")
    schedule.refresh_from_db()
    assert schedule.next_run_at == occurrence.scheduled_for + HOUR


def test_disable__no_occurrence_until_enabled_and_the_gap_is_not_caught_up():
    schedule = hourly()
    due = schedule.next_run_at
    set_enabled("rows", False)
    assert tick(due + 5 * HOUR) == []
    later = due + 5 * HOUR
    schedule = set_enabled("rows", True, now=later)
    assert schedule.next_run_at == later + HOUR
    assert tick(later + timedelta(minutes=30)) == []
    assert Occurrence.objects.count() == 0


def test_remove__deletes_the_schedule_and_its_records_not_its_jobs():
    schedule = hourly()
    (occurrence,) = tick(schedule.next_run_at)
    assert remove_schedule("rows")
    assert not remove_schedule("rows")
    assert not Occurrence.objects.exists()
    assert Job.objects.filter(pk=occurrence.job_id).exists()


def test_purge__deletes_old_occurrence_records():
    schedule = hourly()
    (old,) = tick(schedule.next_run_at)
    Occurrence.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    (recent,) = tick(schedule.next_run_at + HOUR)
    purge = drain(jobs.enqueue("durable.purge", {"older_than": "30d"}).pk)
    assert purge.state == "completed"
    assert list(Occurrence.objects.values_list("pk", flat=True)) == [recent.pk]
    # Old records are not what keeps an occurrence from repeating: next_run_at is.
    assert tick(schedule.next_run_at + HOUR + timedelta(seconds=1)) == []


# --- the standing schedules ---------------------------------------------------------------------


def test_ensure_schedule__is_idempotent_and_keeps_an_operators_disable():
    now = timezone.now()
    first = ensure_schedule("std", "durable.noop", every=HOUR, now=now)
    again = ensure_schedule("std", "durable.noop", every=HOUR, now=now + timedelta(minutes=10))
    assert (again.pk, again.next_run_at) == (first.pk, now + HOUR)  # not pushed back
    set_enabled("std", False)
    changed = ensure_schedule("std", "durable.noop", every=2 * HOUR, now=now)
    assert (changed.enabled, changed.interval, changed.managed) == (False, 2 * HOUR, True)


def test_standing_schedules__follow_the_settings(settings):
    settings.RECOVERY_INGEST_INTERVAL = 30
    settings.DURABLE_RETENTION = "14d"
    settings.DURABLE_RETENTION_CRON = "15 4 * * *"
    standing.ensure_default_schedules()
    ingest = Schedule.objects.get(name="recovery-ingest")
    retention = Schedule.objects.get(name="retention")
    assert (ingest.operation, ingest.interval, ingest.input) == (
        "recovery.ingest",
        timedelta(seconds=30),
        {},
    )
    assert (retention.operation, retention.cron, retention.input) == (
        "durable.purge",
        "15 4 * * *",
        {"older_than": "14d"},
    )
    assert ingest.managed
    assert retention.managed
    (occurrence,) = tick(retention.next_run_at, operations=["durable.purge"])
    assert Job.objects.get(pk=occurrence.job_id).input == {"older_than": "14d"}

    settings.DURABLE_RETENTION = "off"
    settings.RECOVERY_INGEST_INTERVAL = 0
    standing.ensure_default_schedules()
    assert not Schedule.objects.exists()


def test_standing_schedules__created_by_migrate(settings):
    settings.DURABLE_RETENTION = "30d"
    standing.on_post_migrate(None, using="default", apps=django_apps)
    assert set(Schedule.objects.values_list("name", flat=True)) == {"recovery-ingest", "retention"}
    standing.on_post_migrate(None, using="other", apps=django_apps)  # another database: not ours
    assert Schedule.objects.count() == 2


@pytest.mark.parametrize(
    ("age", "cron", "ids"),
    [
        ("30d", "30 3 * * *", []),
        ("off", "nonsense", []),  # no schedule, nothing to check
        ("soon", "30 3 * * *", ["recovery.E101"]),
        ("10s", "30 3 * * *", ["recovery.E101"]),
        ("30d", "30 3 * *", ["recovery.E102"]),
    ],
)
def test_check__reports_bad_retention_settings(settings, age, cron, ids):
    settings.DURABLE_RETENTION = age
    settings.DURABLE_RETENTION_CRON = cron
    # The default database only: Django 6.1's run_checks() otherwise hands every
    # configured database to the model checks, and this test may use only "default".
    checked = checks.run_checks(databases=["default"])
    found = [m.id for m in checked if m.id.startswith("recovery.E1")]
    assert found == ids


# --- commands ----------------------------------------------------------------------------------


def test_commands__add_list_disable_enable_remove():
    out = run("add_schedule", "nightly", "durable.noop", "--cron", "@daily",
              "--time-zone", "Europe/Helsinki", "--input", '{"units": 3}')  # fmt: skip
    assert out.startswith("added schedule nightly: durable.noop cron 0 0 * * * (Europe/Helsinki)")
    assert "+02:00" in out or "+03:00" in out  # the next run, on Helsinki's clock
    run("add_schedule", "often", "durable.noop", "--every", "15m", "--catch-up", "skip")
    listing = run("list_schedules")
    assert listing.splitlines()[0].startswith("nightly\tenabled\tdurable.noop\tcron 0 0 * * *")
    assert "often\tenabled\tdurable.noop\tevery 15m\tcatch-up skip" in listing
    assert run("disable_schedule", "often") == "schedule often disabled\n"
    assert "often\tdisabled" in run("list_schedules")
    assert run("enable_schedule", "often").startswith("schedule often enabled; next run ")
    often = Schedule.objects.get(name="often")
    tick(often.next_run_at)
    detail = run("list_schedules", "often")
    assert "\tjob " in detail.splitlines()[1]
    assert "enqueued job" in detail
    assert run("remove_schedule", "often") == "removed schedule often\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add_schedule", "x", "durable.noop"], "one of the arguments --cron --every"),
        (["add_schedule", "x", "durable.noop", "--every", "soon"], "--every: 'soon'"),
        (["add_schedule", "x", "durable.noop", "--cron", "* *"], "cron: "),
        (["add_schedule", "x", "nope", "--every", "1h"], "no operation named 'nope'"),
        (["add_schedule", "x", "durable.noop", "--every", "1h", "--input", "{"], "not JSON"),
        (["enable_schedule", "ghost"], "no schedule named 'ghost'"),
        (["disable_schedule", "ghost"], "no schedule named 'ghost'"),
        (["remove_schedule", "ghost"], "no schedule named 'ghost'"),
        (["list_schedules", "ghost"], "no schedule named 'ghost'"),
    ],
)
def test_commands__refuse_clearly(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_admin__schedules_occurrences_and_import_records_are_read_only(
    admin_client, settings, tmp_path
):
    settings.STATIC_ROOT = tmp_path  # whitenoise warns about a missing collectstatic dir
    schedule = hourly()
    (occurrence,) = tick(schedule.next_run_at)
    pages = {
        "durable/schedule": schedule.pk,
        "durable/occurrence": occurrence.pk,
        "recovery/importrecord": None,
    }
    for page, pk in pages.items():
        listing = admin_client.get(f"/admin/{page}/")
        assert listing.status_code == 200
        assert admin_client.get(f"/admin/{page}/add/").status_code == 403
        if pk is not None:
            assert admin_client.post(f"/admin/{page}/{pk}/delete/").status_code == 403
    assert b"every 1h" in admin_client.get("/admin/durable/schedule/").content


def test_tick__an_operation_s_own_defaults_are_filled_in_for_every_occurrence(settings, tmp_path):
    # A backup without a name gets a time-stamped one; stored in the schedule, every
    # occurrence after the first would have asked for the same, taken, name.
    settings.DURABLE_BACKUP_DIR = tmp_path / "backups"
    settings.DURABLE_BACKUP_DIR.mkdir()
    schedule = add_schedule("nightly", "backup.database", every=HOUR, input={})
    assert "name" not in schedule.input
    due = schedule.next_run_at
    (first,) = tick(due)
    drain(first.job_id)
    (second,) = tick(due + HOUR)
    names = [job.input["name"] for job in schedule_jobs(schedule)]
    assert second.job_id != first.job_id
    assert len(set(names)) == 2
    assert Job.objects.get(pk=first.job_id).state == "completed"
