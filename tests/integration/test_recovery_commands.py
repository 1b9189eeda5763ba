"""Management commands and admin pages of the recovery app."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from durable import jobs
from durable.models import Job
from recovery.models import IngestCursor, IngestPath, RecoveryEvent
from recovery.policy import Position
from recovery.records import record_event, record_security
from recovery.records.cursors import follow, name_for

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# --- record_recovery_event ----------------------------------------


def test_record_recovery_event__records_what_the_administrator_says():
    output = run(
        "record_recovery_event",
        "restore-backup",
        "--detail", "Restored wekan.sqlite from backup/2026-11-30",
        "--severity", "warning",
        "--db", "wekan",
        "--failed",
        "--deleted-data",
        "--username", "alice",
        "--ip", "::ffff:192.0.2.4",
        "--object", "b1=Roadmap",
        "--object", "b2",
    )  # fmt: skip
    event = RecoveryEvent.objects.get()
    assert f"recorded recovery event {event.pk} (restore-backup)" in output
    assert (event.severity, event.db, event.source, event.done) == (
        "warning",
        "wekan",
        "manual",
        False,
    )
    assert (event.deleted_data, event.username, event.ipv4) == (True, "alice", "192.0.2.4")
    assert (event.object_ids, event.object_titles) == (["b1", "b2"], ["Roadmap", "(unknown title)"])


def test_record_recovery_event__done_unless_said_otherwise():
    run("record_recovery_event", "integrity-ok")
    assert RecoveryEvent.objects.get().done is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["  "], "must not be empty"),
        (["x", "--ip", "300.1.1.1"], "not an IPv4 or IPv6 address"),
        (["x", "--severity", "fatal"], "invalid choice"),
        (["x", "--done", "--failed"], "not allowed with argument"),
    ],
)
def test_record_recovery_event__refuses_bad_arguments(args, message):
    with pytest.raises(CommandError, match=message):
        run("record_recovery_event", *args)
    assert not RecoveryEvent.objects.exists()


# --- problems ----------------------------------------


def test_problems__fits_an_80_column_terminal_and_shows_each_section():
    running = jobs.enqueue("durable.noop", {"units": 10})
    Job.objects.filter(pk=running.pk).update(state="running", units_done=4, units_total=10)
    failed = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=failed.pk).update(state="failed", reason="gave up after 5 attempts " * 9)
    paused = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=paused.pk).update(state="paused", reason="set DURABLE_CREDENTIAL_X")
    record_event("corruption-detected", severity="error", detail="quick_check failed " * 20)
    record_event("restore-backup", done=False, detail="restore did not finish")
    record_event("integrity-ok", detail="fine")  # not a problem: not listed
    for _ in range(3):
        record_security(category="ssrf", key="webhook.url", cwe=918, username="alice")
    record_security(category="auth" * 20, key="token" * 30)

    output = run("problems")
    lines = output.splitlines()
    assert max(len(line) for line in lines) <= 80
    problems = "\n".join(section(output, "Latest recovery problems"))
    assert "Jobs in progress: 1" in output
    assert "[####------] 40%" in output
    assert "Failed: 1   Paused: 1   Queued: 0 (0 retrying)" in output
    assert "set DURABLE_CREDENTIAL_X" in output
    assert "corruption-detected" in problems
    assert "restore-backup" in problems
    assert "integrity-ok" not in problems  # not a problem
    assert "ssrf/webhook.url" in output
    assert "CWE-918" in output
    ssrf = next(line for line in lines if "ssrf/webhook.url" in line)
    assert ssrf.split()[0] == "3"  # sorted by count, the count first


def section(output: str, title: str) -> list[str]:
    """The lines of one section of ``problems``: from its title to the next blank line."""
    lines = output.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(title))
    end = next((n for n in range(start, len(lines)) if not lines[n].strip()), len(lines))
    return lines[start:end]


def test_problems__lists_the_latest_recovery_events_of_every_kind_newest_first():
    record_event("integrity-ok", detail="quick_check ok")
    record_event("restore-backup", done=False, detail="restore did not finish")
    record_event("board-permanently-deleted", severity="warning", deleted_data=True)
    for n in range(3):
        record_event("backup-created", detail=f"backup {n}")

    latest = section(run("problems", "--limit", "4"), "Latest recovery events")
    assert latest[0] == "Latest recovery events: 4 shown"
    rows = latest[2:-1]  # between the header and the legend
    assert [row.split()[2:4] for row in rows] == [
        ["done", "info"], ["done", "info"], ["done", "info"], ["del", "warning"],
    ]  # fmt: skip
    assert "backup 2" in rows[0]  # newest first
    assert "board-permanently-del…" in rows[3]  # cut to its column
    full = section(run("problems"), "Latest recovery events")
    assert any("FAILED" in row and "restore-backup" in row for row in full)
    assert any("integrity-ok" in row for row in full)  # not a problem, but an event
    assert max(len(line) for line in full) <= 80


def test_problems__an_empty_database_says_none():
    output = run("problems", "--limit", "5")
    assert "Jobs in progress: 0" in output
    assert output.count("  none") == 3


# --- ingest_recovery_events ----------------------------------------


def test_ingest_command__says_clearly_when_no_file_is_configured(settings, monkeypatch):
    settings.RECOVERY_EVENTS_FILE = ""
    for name in ("WEKAN_FERRETDB_SQLITE_DIR", "FERRETDB_SQLITE_DIR", "WEKAN_SQLITE_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CommandError, match="set RECOVERY_EVENTS_FILE"):
        run("ingest_recovery_events")


def test_ingest_command__says_clearly_when_the_file_does_not_exist(tmp_path):
    missing = tmp_path / "recovery-events.jsonl"
    with pytest.raises(CommandError, match="does not exist"):
        run("ingest_recovery_events", str(missing))
    assert not Job.objects.exists()


def test_ingest_command__enqueues_one_ingest_per_file(settings, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    path.write_text('{"type": "integrity-ok"}\n')
    settings.RECOVERY_EVENTS_FILE = str(path)
    first = run("ingest_recovery_events")
    job = Job.objects.get(operation="recovery.ingest")
    assert f"enqueued job {job.pk}: import {path}" in first
    again = run("ingest_recovery_events", str(path))
    assert f"already queued as job {job.pk}" in again
    assert Job.objects.count() == 1


# --- the admin ----------------------------------------


@pytest.fixture
def admin_client(client, settings, tmp_path):
    settings.STATIC_ROOT = tmp_path  # whitenoise warns about a missing collectstatic dir
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def test_admin__lists_events_and_security_rows_escaped_and_read_only(admin_client):
    event = record_event("x<b>", detail='<script>alert(1)</script>"><img onerror=alert(2)>')
    record_security(category="<i>cat</i>", key="k", username="<b>bob</b>")
    page = admin_client.get(reverse("admin:recovery_recoveryevent_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)" not in html
    assert "<img onerror" not in html
    page = admin_client.get(reverse("admin:recovery_securityevent_changelist"))
    assert page.status_code == 200
    assert "&lt;i&gt;cat&lt;/i&gt;" in page.content.decode()
    assert "<b>bob</b>" not in page.content.decode()
    assert admin_client.get(reverse("admin:recovery_recoveryevent_add")).status_code == 403
    change = reverse("admin:recovery_recoveryevent_change", args=[event.pk])
    assert admin_client.post(change, {"type": "edited"}).status_code == 403
    delete = reverse("admin:recovery_recoveryevent_delete", args=[event.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert RecoveryEvent.objects.get(pk=event.pk).type == "x<b>"


def test_admin__the_detail_page_renders_a_job_event(admin_client):
    event = record_event(
        "job-failed",
        done=False,
        job_id=12,
        operation="x",
        checkpoint={"offset": 5},
        next_retry_at=timezone.now() + timedelta(minutes=5),
        reason="gave up",
    )
    page = admin_client.get(reverse("admin:recovery_recoveryevent_change", args=[event.pk]))
    assert page.status_code == 200
    assert "{&quot;offset&quot;: 5}" in page.content.decode()  # escaped JSON


def test_ingest_cursor_admin__refuses_deletion(admin_client, tmp_path):
    cursor = follow(str(Path(tmp_path) / "f.jsonl"), Position.fresh("1:2"))
    name = name_for(str(Path(tmp_path) / "f.jsonl"))
    assert admin_client.get(reverse("admin:recovery_ingestcursor_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:recovery_ingestpath_changelist")).status_code == 200
    url = reverse("admin:recovery_ingestcursor_delete", args=[cursor.pk])
    assert admin_client.post(url, {"post": "yes"}).status_code == 403
    assert IngestCursor.objects.filter(pk=cursor.pk).exists()
    url = reverse("admin:recovery_ingestpath_delete", args=[name.pk])
    assert admin_client.post(url, {"post": "yes"}).status_code == 403
    assert IngestPath.objects.filter(pk=name.pk).exists()
