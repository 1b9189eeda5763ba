"""What the engine announces becomes Recovery and Security rows; workers start the ingest.

The engine sends its signals after commit; ``django_capture_on_commit_callbacks``
runs those callbacks at the end of the block, as a real commit would.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from durable import jobs, rescue, signals
from durable.models import Job
from durable.schedules.models import Schedule
from durable.schedules.service import tick
from recovery import receivers, schedules
from recovery.models import EventType, RecoveryEvent, SecurityEvent
from recovery.policy import ingest_unique_key
from recovery.records import record_event, record_security
from recovery.schedules import INGEST_SCHEDULE

from .helpers import drain

pytestmark = pytest.mark.django_db


def left_by_a_dead_worker(job: Job) -> Job:
    Job.objects.filter(pk=job.pk).update(
        state="running",
        lease_owner="dead-worker",
        lease_epoch=1,
        lease_expires_at=timezone.now() - timedelta(seconds=5),
        checkpoint={"next": 2},
        units_done=2,
    )
    return Job.objects.get(pk=job.pk)


# --- engine signals → Recovery events -------------------------------------------------------


def test_reclaimed_job__is_a_job_reclaimed_after_restart_warning(
    django_capture_on_commit_callbacks,
):
    job = left_by_a_dead_worker(jobs.enqueue("test.rows", {"units": 4}))
    with django_capture_on_commit_callbacks(execute=True):
        assert rescue.reclaim("rescuer") == [job.pk]
    event = RecoveryEvent.objects.get(type=EventType.JOB_RECLAIMED)
    assert (event.severity, event.source, event.done, event.reclaimed) == (
        "warning",
        "worker",
        True,
        True,
    )
    assert (event.job_id, event.operation, event.attempt) == (job.pk, "test.rows", 1)
    assert event.checkpoint == {"next": 2}
    assert "dead-worker" in event.detail
    assert "running → queued" in event.detail


def test_reclaimed_job_after_progress__says_no_attempt_was_spent(
    django_capture_on_commit_callbacks,
):
    job = left_by_a_dead_worker(jobs.enqueue("test.rows", {"units": 4}))
    Job.objects.filter(pk=job.pk).update(units_at_claim=0)  # both units under the lost lease
    with django_capture_on_commit_callbacks(execute=True):
        assert rescue.reclaim("rescuer") == [job.pk]
    event = RecoveryEvent.objects.get(type=EventType.JOB_RECLAIMED)
    assert event.attempt == 0
    assert "It had committed 2 unit(s) since its claim: no attempt spent." in event.detail


def test_reclaimed_job_failed_by_its_policy__also_needs_attention(
    django_capture_on_commit_callbacks,
):
    job = left_by_a_dead_worker(jobs.enqueue("test.rows", {}, on_restart="fail"))
    with django_capture_on_commit_callbacks(execute=True):
        rescue.reclaim("rescuer")
    failed = RecoveryEvent.objects.get(type=EventType.JOB_FAILED)
    assert (failed.done, failed.severity, failed.reclaimed, failed.job_id) == (
        False,
        "error",
        True,
        job.pk,
    )
    assert "on_restart policy is 'fail'" in failed.reason
    assert RecoveryEvent.objects.filter(type=EventType.JOB_RECLAIMED, job_id=job.pk).exists()


def test_exhausted_job__is_a_not_done_event_with_checkpoint_attempt_and_reason(
    django_capture_on_commit_callbacks,
):
    job = jobs.enqueue("test.flaky", {"fail_times": 9, "message": "x" * 5000}, max_attempts=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert drain(job.pk).state == "failed"
    event = RecoveryEvent.objects.get(type=EventType.JOB_FAILED)
    assert (event.done, event.severity, event.reclaimed) == (False, "error", False)
    assert (event.job_id, event.operation, event.attempt) == (job.pk, "test.flaky", 1)
    assert event.reason.startswith("gave up after 1 attempts")
    assert len(event.reason.encode()) <= 2048  # bounded
    assert RecoveryEvent.objects.failed().get() == event


def test_paused_for_a_missing_credential__is_a_not_done_warning(
    django_capture_on_commit_callbacks,
):
    job = jobs.enqueue("test.needs_credential", {"token_ref": "nowhere"})
    with django_capture_on_commit_callbacks(execute=True):
        assert drain(job.pk).state == "paused"
    event = RecoveryEvent.objects.get(type=EventType.JOB_PAUSED)
    assert (event.done, event.severity, event.job_id) == (False, "warning", job.pk)
    assert "DURABLE_CREDENTIAL_NOWHERE" in event.reason


@pytest.mark.parametrize("argument", ["next_attempt_at", "next_retry_at"])
def test_job_needs_attention__stores_the_next_retry_the_engine_sends(argument):
    retry_at = (timezone.now() + timedelta(minutes=7)).replace(microsecond=0)
    signals.send_now(
        signals.job_needs_attention,
        job_id=5,
        operation="webhooks.deliver",
        state="paused",
        cause="unavailable",
        reason="storage 'archive' is not mounted",
        checkpoint={"next": 3},
        attempt=2,
        **{argument: retry_at},
    )
    event = RecoveryEvent.objects.get(type=EventType.JOB_PAUSED)
    assert event.next_retry_at == retry_at
    assert (event.job_id, event.attempt, event.checkpoint) == (5, 2, {"next": 3})
    assert retry_at.isoformat(timespec="seconds") in event.detail


def test_paused_for_missing_storage__is_a_not_done_warning_with_the_fix(
    django_capture_on_commit_callbacks, settings, tmp_path
):
    settings.STORAGES = {
        **settings.STORAGES,
        "archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "not-mounted")},  # never created
        },
    }
    job = jobs.enqueue("integrity.scan", {"target": "storage", "storage": "archive"})
    with django_capture_on_commit_callbacks(execute=True):
        assert drain(job.pk).state == "paused"
    event = RecoveryEvent.objects.get(type=EventType.JOB_PAUSED)
    assert (event.done, event.severity, event.job_id, event.operation) == (
        False,
        "warning",
        job.pk,
        "integrity.scan",
    )
    assert "not-mounted" in event.reason
    assert "does not exist" in event.reason
    assert RecoveryEvent.objects.failed().get() == event


def test_recovery_event_signal__an_operation_reports_a_backup():
    signals.send_now(
        signals.recovery_event,
        type="backup-created",
        severity="info",
        detail="Backed up wekan.sqlite to backup/",
        db="wekan",
        job_id=41,
        operation="backup.sqlite",
        checkpoint={"table": "cards"},
        object_ids=["cards"],
        deleted_data=False,
        surprise="an argument a newer engine may add",
    )
    event = RecoveryEvent.objects.get(type="backup-created")
    assert (event.source, event.db, event.job_id, event.operation) == (
        "worker",
        "wekan",
        41,
        "backup.sqlite",
    )
    assert event.checkpoint == {"table": "cards"}
    assert (event.object_ids, event.object_titles) == (["cards"], ["(unknown title)"])
    assert event.is_done


def test_recovery_event_signal__without_a_type_records_nothing(caplog):
    signals.send_now(signals.recovery_event, type="  ", detail="who am I")
    assert not RecoveryEvent.objects.exists()
    assert "without a type" in caplog.text


# --- Security summary rows --------------------------------------------------------------------


def refuse(**overrides: object) -> None:
    fields = {
        "category": "ssrf",
        "key": "webhook.url",
        "detail": "blocked http://10.0.0.5/",
        "severity": "warning",
        "cwe": "CWE-918",
        "source": "webhooks",
        "user_id": 7,
        "username": "alice",
        "ip": "203.0.113.9",
    }
    signals.send_now(signals.security_refusal, **{**fields, **overrides})


def test_security_refusal__one_row_per_kind_never_per_actor():
    refuse()
    refuse(username="bob", user_id=8, ip="::ffff:198.51.100.7", detail="blocked http://[::1]/")
    refuse(username="", user_id="", ip="2001:db8::1", detail="blocked http://[fd00::1]/")
    row = SecurityEvent.objects.get()
    assert (row.category, row.key, row.cwe, row.source, row.severity) == (
        "ssrf",
        "webhook.url",
        "CWE-918",
        "webhooks",
        "warning",
    )
    assert row.count == 3
    assert row.users == {"alice": 1, "bob": 1}
    assert row.addresses == {"203.0.113.9": 1, "198.51.100.7": 1, "2001:db8::1": 1}
    assert (row.last_ipv4, row.last_ipv6) == ("198.51.100.7", "2001:db8::1")
    assert row.detail == "blocked http://[fd00::1]/"  # the latest detail
    assert row.first_seen <= row.last_seen


def test_security_refusal__another_severity_or_cwe_is_another_kind():
    refuse()
    refuse(severity="error")
    refuse(cwe=352)
    assert SecurityEvent.objects.count() == 3


def test_security_refusal__tallies_are_capped_with_an_overflow_count():
    for n in range(60):
        record_security(category="auth", key="token", username=f"user{n}", ip=f"10.0.0.{n}")
    row = SecurityEvent.objects.get()
    assert row.count == 60
    assert (len(row.users), row.users_overflow) == (50, 10)
    assert (len(row.addresses), row.addresses_overflow) == (50, 10)
    assert row.users["user0"] == 1
    user_id_only = record_security(category="auth", key="token", user_id=99)
    assert user_id_only.users_overflow == 11  # "#99" is the 51st actor


def test_record_security__never_raises_even_when_the_database_fails(caplog):
    with connection.cursor() as cursor:  # undone when the test's transaction rolls back
        cursor.execute(f"DROP TABLE {SecurityEvent._meta.db_table}")
    with caplog.at_level(logging.ERROR, logger="recovery.records"):
        assert record_security(category="ssrf", key="x") is None
    assert "could not record a security event" in caplog.text
    # The caller's own transaction is still usable afterwards.
    assert Job.objects.count() == 0


def test_record_event__never_raises_even_when_the_database_fails(caplog):
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {RecoveryEvent._meta.db_table}")
    with caplog.at_level(logging.ERROR, logger="recovery.records"):
        assert record_event("backup-created", detail="x") is None
    assert "could not record a recovery event" in caplog.text
    assert Job.objects.count() == 0


# --- workers start the ingest ----------------------------------------------------------------


@pytest.fixture
def no_wekan_env(monkeypatch):
    for name in ("WEKAN_FERRETDB_SQLITE_DIR", "FERRETDB_SQLITE_DIR", "WEKAN_SQLITE_DIR"):
        monkeypatch.delenv(name, raising=False)


def ingest_jobs() -> list[Job]:
    return list(Job.objects.filter(operation="recovery.ingest").order_by("id"))


def ingest_schedule() -> Schedule:
    return Schedule.objects.get(name=INGEST_SCHEDULE)


def test_worker_start__with_nothing_configured_does_nothing(settings, no_wekan_env):
    settings.RECOVERY_EVENTS_FILE = ""
    receivers.on_worker_started(None, worker_id="w1")
    schedules.ensure_default_schedules()
    (occurrence,) = tick(ingest_schedule().next_run_at, worker="w1")
    assert (occurrence.job_id, occurrence.note) == (None, "nothing to do")
    assert ingest_jobs() == []


def test_worker_start__a_configured_file_that_does_not_exist_is_quietly_ignored(settings, tmp_path):
    settings.RECOVERY_EVENTS_FILE = str(tmp_path / "recovery-events.jsonl")
    receivers.on_worker_started(None, worker_id="w1")
    tick(ingest_schedule().next_run_at)
    assert ingest_jobs() == []


def test_worker_start__many_workers_queue_one_ingest(settings, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    path.write_text('{"type": "integrity-ok"}\n')
    settings.RECOVERY_EVENTS_FILE = str(path)
    for n in range(3):
        receivers.on_worker_started(None, worker_id=f"w{n}")
    (job,) = ingest_jobs()
    assert job.unique_key == ingest_unique_key(str(path))
    assert job.input["path"] == str(path)
    assert job.owner == "worker w0"


def test_worker_start__finds_the_file_in_the_wekan_data_directory(
    settings, tmp_path, monkeypatch, no_wekan_env
):
    settings.RECOVERY_EVENTS_FILE = ""
    monkeypatch.setenv("WEKAN_SQLITE_DIR", str(tmp_path))
    (tmp_path / "recovery-events.jsonl").write_text('{"type": "integrity-ok"}\n')
    receivers.on_worker_started(None, worker_id="w1")
    (job,) = ingest_jobs()
    assert job.input["path"] == str(tmp_path / "recovery-events.jsonl")


def test_configured_file__a_relative_path_is_the_project_directorys_wherever_we_run(
    settings, tmp_path, monkeypatch
):
    project = tmp_path / "project"
    (project / "var").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    settings.BASE_DIR = project
    settings.RECOVERY_EVENTS_FILE = "var/recovery-events.jsonl"
    monkeypatch.chdir(tmp_path / "elsewhere")  # a worker started from another directory
    assert receivers.configured_events_file() == str(project / "var" / "recovery-events.jsonl")


def test_ingest_schedule__looks_every_interval_and_only_if_the_file_changed(settings, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    path.write_text('{"type": "integrity-ok"}\n')
    settings.RECOVERY_EVENTS_FILE = str(path)
    settings.RECOVERY_INGEST_INTERVAL = 3600
    schedules.ensure_default_schedules()
    due = ingest_schedule().next_run_at
    assert tick(due - timedelta(seconds=1)) == []  # not yet
    (first,) = tick(due)
    (job,) = ingest_jobs()
    assert (first.job_id, job.owner) == (job.pk, "schedule:recovery-ingest")
    assert drain(job.pk).state == "completed"

    assert tick(due + timedelta(minutes=59)) == []  # within the interval: no look
    (unchanged,) = tick(due + timedelta(hours=1))  # due, but the file is unchanged
    assert (unchanged.job_id, unchanged.note) == (None, "nothing to do")
    with open(path, "a") as handle:
        handle.write('{"type": "backup-created"}\n')
    assert tick(due + timedelta(hours=1, minutes=30)) == []  # changed, but not due yet
    (changed,) = tick(due + timedelta(hours=2))
    assert len(ingest_jobs()) == 2
    assert changed.job_id == ingest_jobs()[1].pk


def test_ingest_schedule__an_unfinished_ingest_is_not_enqueued_twice(settings, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    path.write_text('{"type": "integrity-ok"}\n')
    settings.RECOVERY_EVENTS_FILE = str(path)
    receivers.on_worker_started(None, worker_id="w1")  # the start look enqueues it
    (job,) = ingest_jobs()
    schedules.ensure_default_schedules()
    (occurrence,) = tick(ingest_schedule().next_run_at)
    assert occurrence.job_id == job.pk
    assert "still queued: not enqueued again" in occurrence.note
    assert ingest_jobs() == [job]


def test_ingest_schedule__interval_zero_means_only_when_a_worker_starts(settings, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    path.write_text('{"type": "integrity-ok"}\n')
    settings.RECOVERY_EVENTS_FILE = str(path)
    schedules.ensure_default_schedules()
    assert Schedule.objects.filter(name=INGEST_SCHEDULE).exists()
    settings.RECOVERY_INGEST_INTERVAL = 0
    schedules.ensure_default_schedules()
    assert not Schedule.objects.filter(name=INGEST_SCHEDULE).exists()
    assert tick(timezone.now() + timedelta(days=1)) == []
    assert ingest_jobs() == []
    receivers.on_worker_started(None, worker_id="w1")
    assert len(ingest_jobs()) == 1


def test_receivers__are_connected_once():
    # ready() may run more than once (tests, reloads); dispatch_uid prevents doubles.
    receivers.connect()
    refuse()
    assert SecurityEvent.objects.get().count == 1
