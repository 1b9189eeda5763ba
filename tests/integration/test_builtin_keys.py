"""One unfinished job per target, whichever way it is started (``Operation.unique_key``).

The key lives in the operation, so ``enqueue`` applies it for every caller:
the management commands, the dashboard's "New job", the HTTP API and
schedules. A second start returns the first job (``created`` False) instead
of a second writer on the same database, pair of storages, scope or file.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client as WebClient
from django.urls import reverse
from django.utils import timezone

from durable import jobs
from durable.api.models import Client
from durable.api.tokens import new_token
from durable.models import Job
from durable.operations import Access, get_operation
from durable.schedules.models import Schedule
from durable.schedules.service import add_schedule, tick
from recovery.models import RecoveryEvent

from .dataset import TEST_EXCLUDE

pytestmark = pytest.mark.django_db(databases=["default", "other", "lite"])


@pytest.fixture
def places(tmp_path: Path, settings) -> Path:
    """A backup to restore, two storages to move between, a file to import."""
    settings.DURABLE_BACKUP_DIR = tmp_path / "backups"
    (tmp_path / "backups" / "base").mkdir(parents=True)
    (tmp_path / "backups" / "other-backup").mkdir()
    for name in ("src", "dst", "third"):
        (tmp_path / name).mkdir()
    settings.STORAGES = {
        **settings.STORAGES,
        **{
            name: {"BACKEND": "django.core.files.storage.FileSystemStorage",
                   "OPTIONS": {"location": str(tmp_path / name)}}
            for name in ("src", "dst", "third")
        },
    }  # fmt: skip
    settings.RECOVERY_IMPORT_DIRS = [str(tmp_path)]
    Schedule.objects.all().delete()  # the standing ones (migrate's): only ours tick here
    return tmp_path


def later() -> dict:
    # Not due for an hour: nothing runs them, they stay unfinished.
    return {"run_after": timezone.now() + timedelta(hours=1)}


# (operation, first input, an input that must get the same job, one that must not)
CASES = [
    ("restore.database", {"name": "base", "database": "other"},
     {"name": "other-backup", "database": "other", "replace": True},
     {"name": "base", "database": "lite"}),
    ("db.copy", {"target": "other"}, {"target": "other", "replace": True}, {"target": "lite"}),
    ("files.move", {"source": "src", "destination": "dst"},
     {"source": "dst", "destination": "src", "prefix": "x/"},  # either way, any names
     {"source": "src", "destination": "third"}),
    ("integrity.scan", {"target": "database", "database": "other"},
     {"target": "database", "database": "other"}, {"target": "database", "database": "lite"}),
    ("backup.database", {"name": "nightly"}, {"name": "nightly", "batch_size": 5},
     {"name": "weekly"}),
    ("import.csv", {"path": "{tmp}/x.csv"}, {"path": "{tmp}/x.csv", "batch_records": 5},
     {"path": "{tmp}/y.csv"}),
]  # fmt: skip


def fill(data: dict, tmp: Path) -> dict:
    return {k: v.replace("{tmp}", str(tmp)) if isinstance(v, str) else v for k, v in data.items()}


@pytest.mark.parametrize(("operation", "first", "same", "other"), CASES, ids=[c[0] for c in CASES])
def test_enqueue__a_second_start_on_the_same_target_returns_the_first_job(
    places, operation, first, same, other
):
    one = jobs.enqueue(operation, fill(first, places), **later())
    again = jobs.enqueue(operation, fill(same, places), **later())
    assert (again.pk, again.created) == (one.pk, False)
    elsewhere = jobs.enqueue(operation, fill(other, places), **later())
    assert elsewhere.created
    assert elsewhere.pk != one.pk
    assert Job.objects.filter(operation=operation).count() == 2


def test_enqueue__restores_and_copies_into_one_database_share_one_key(places):
    restore = jobs.enqueue("restore.database", {"name": "base", "database": "other"}, **later())
    copy = jobs.enqueue("db.copy", {"target": "other", "exclude": TEST_EXCLUDE}, **later())
    assert (copy.pk, copy.created) == (restore.pk, False)  # never two writers on "other"
    jobs.cancel(restore.pk, actor="ops")
    assert jobs.enqueue("db.copy", {"target": "other"}, **later()).created  # free again


@pytest.mark.parametrize(
    "operation",
    ["backup.database", "restore.database", "db.copy", "files.move", "import.jsonl", "import.csv"],
)
def test_access__operations_that_replace_or_read_server_data_are_privileged(operation):
    assert get_operation(operation).access == Access.PRIVILEGED


def test_access__an_integrity_scan_is_for_anyone_who_may_start_jobs():
    assert get_operation("integrity.scan").access == Access.ANYONE


# --- every entry point ----------------------------------------------------------------------


def test_dashboard__new_job_returns_the_unfinished_copy_instead_of_a_second(places):
    first = jobs.enqueue("db.copy", {"target": "other"}, **later())
    web = WebClient()
    web.force_login(User.objects.create_superuser("root", password="pw"))
    response = web.post(
        reverse("problems:new-job"),
        {"operation": "db.copy", "input-source": "default", "input-target": "other",
         "input-batch_size": "100"},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    assert response["Location"] == reverse("problems:job", args=[first.pk])
    assert Job.objects.filter(operation="db.copy").count() == 1
    # Said so, and not audited as a job this user started.
    page = web.get(response["Location"]).content.decode()
    assert f"Job {first.pk} (db.copy) is already doing this" in page
    assert not RecoveryEvent.objects.filter(type="job-created").exists()


def test_api__a_second_submission_gets_the_unfinished_restore(places):
    token = new_token()
    Client.objects.create(
        name="ops",
        scopes=["jobs:read", "jobs:write", "jobs:admin"],
        token_prefix=token.prefix,
        token_hash=token.hash,
    )
    first = jobs.enqueue("restore.database", {"name": "base", "database": "other"}, **later())
    response = WebClient().post(
        "/api/jobs",
        data=json.dumps({"operation": "restore.database",
                         "input": {"name": "other-backup", "database": "other"}}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token.token}"},
    )  # fmt: skip
    assert response.status_code == 202, response.content.decode()
    assert response.json()["id"] == first.pk
    assert Job.objects.filter(operation="restore.database").count() == 1


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
def test_schedule__an_occurrence_never_starts_a_second_writer(places, overlap):
    by_hand = jobs.enqueue("db.copy", {"target": "other"}, **later())
    schedule = add_schedule(
        "copy-nightly", "db.copy", every=timedelta(hours=1), input={"target": "other"},
        overlap=overlap,
    )  # fmt: skip
    (occurrence,) = tick(schedule.next_run_at)
    assert occurrence.job_id == by_hand.pk
    assert "still queued: not enqueued again" in occurrence.note
    assert Job.objects.filter(operation="db.copy").count() == 1


def test_schedule__without_overlap_the_previous_occurrences_job_is_returned(places):
    """An operation whose own key changes per job (a backup's generated name)."""
    schedule = add_schedule("backups", "backup.database", every=timedelta(hours=1))
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now())
    (first,) = tick(timezone.now())
    (second,) = tick(timezone.now() + timedelta(hours=1))
    assert second.job_id == first.job_id
    assert "of an earlier occurrence is still queued" in second.note
    jobs.cancel(first.job_id, actor="ops")
    (third,) = tick(timezone.now() + timedelta(hours=2))
    assert third.job_id not in (None, first.job_id)


# --- the commands ---------------------------------------------------------------------------


def test_commands__run_again_they_follow_the_unfinished_job(places):
    runs = [
        ("restore_database", ["base", "--database", "other"], "restore.database"),
        ("copy_database", ["--target", "lite"], "db.copy"),
        ("integrity_scan", ["--database", "other"], "integrity.scan"),
        ("backup_database", ["--name", "nightly"], "backup.database"),
        ("move_files", ["src", "dst"], "files.move"),
    ]
    for command, args, operation in runs:
        out = io.StringIO()
        call_command(command, *args, stdout=out)
        job = Job.objects.get(operation=operation)
        assert out.getvalue().startswith(f"enqueued job {job.pk}"), out.getvalue()
        out = io.StringIO()
        call_command(command, *args, stdout=out)
        assert f"job {job.pk} is already doing this (queued); following it" in out.getvalue()
        assert Job.objects.filter(operation=operation).count() == 1


@pytest.mark.parametrize(
    ("command", "first", "second", "holder"),
    [
        ("restore_database", ["base", "--database", "other"],
         ["other-backup", "--database", "other"], "restore.database"),
        ("move_files", ["src", "dst"], ["dst", "src", "--prefix", "2025/"], "files.move"),
    ],
)  # fmt: skip
def test_commands__an_unfinished_job_doing_something_else_is_named_not_followed(
    places, command, first, second, holder
):
    call_command(command, *first, stdout=io.StringIO())
    job = Job.objects.get(operation=holder)
    with pytest.raises(CommandError, match=rf"job {job.pk} \({holder}, queued\) holds .* with "
                       "another input .*; wait for it or cancel it"):  # fmt: skip
        call_command(command, *second, stdout=io.StringIO())
    assert Job.objects.filter(operation=holder).count() == 1
