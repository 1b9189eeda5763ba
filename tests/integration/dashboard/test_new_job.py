"""'New job': which operations a user may start (``Operation.access``), and every built-in
operation started through its own form on the page, with the input the job gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.urls import reverse

from durable.models import Job
from durable.operations import Access, get_operation
from recovery.models import RecoveryEvent, SecurityEvent

pytestmark = pytest.mark.django_db
URL = "/problems/jobs/new/"


def listed(client) -> set[str]:
    html = client.get(URL).content.decode()
    nav = html.split('<nav class="op-list"', 1)[1].split("</nav>", 1)[0]
    return {part.split('"', 1)[0] for part in nav.split("?operation=")[1:]}


# --- who may start what -------------------------------------------------------------------


def test_list__system_operations_never_and_privileged_ones_only_with_the_right(client_for):
    adder, privileged, admin = (client_for(r) for r in ("adder", "privileged", "admin"))
    for client in (adder, privileged, admin):
        shown = listed(client)
        assert "durable.noop" in shown  # Access.ANYONE
        assert "recovery.bulk_action" not in shown  # Access.SYSTEM: the site starts it
        assert "recovery.search_index" not in shown
    assert "test.one_per_target" not in listed(adder)  # Access.PRIVILEGED
    assert "test.one_per_target" in listed(privileged)
    assert "test.one_per_target" in listed(admin)  # superusers hold every permission


@pytest.mark.parametrize("method", ["get", "post"])
def test_privileged__refused_with_a_message_without_the_right(client_for, method):
    client = client_for("adder")
    data = {"operation": "test.one_per_target", "input-input": '{"target": "t"}'}
    response = getattr(client, method)(URL, data)
    html = response.content.decode()
    assert response.status_code == 403
    assert "Starting test.one_per_target needs the permission durable.start_privileged_job" in html
    assert 'name="input-input"' not in html  # no form for it
    assert not Job.objects.exists()
    row = SecurityEvent.objects.get(category="dashboard", key="no-permission:start-privileged")
    assert row.users == {"adder": 1}


def test_privileged__started_with_the_right(client_for):
    client = client_for("privileged")
    response = client.post(
        URL, {"operation": "test.one_per_target", "input-input": '{"target": "t"}'}
    )
    job = Job.objects.get()
    assert response["Location"] == reverse("problems:job", args=[job.pk])
    assert (job.operation, job.input, job.owner) == ("test.one_per_target", {"target": "t"},
                                                     "privileged")  # fmt: skip


@pytest.mark.parametrize("operation", ["recovery.bulk_action", "recovery.search_index"])
def test_system__refused_to_everybody_with_a_message(client_for, operation):
    response = client_for("admin").post(URL, {"operation": operation, "input-input": "{}"})
    assert response.status_code == 403
    assert f"{operation} is started by the site itself, never by hand." in response.content.decode()
    assert not Job.objects.exists()
    assert SecurityEvent.objects.filter(key="no-permission:start-system").exists()


# --- every built-in operation through its form ----------------------------------------------------


@pytest.fixture
def site(settings, tmp_path: Path) -> Path:
    """A backup directory with one published backup, two file storages, an import directory."""
    backups = tmp_path / "backups"
    (backups / "backup-old").mkdir(parents=True)
    (backups / "backup-old" / "SHA256SUMS").write_text("")  # published: checksums present
    settings.DURABLE_BACKUP_DIR = backups
    for name in ("inbox", "archive", "imports"):
        (tmp_path / name).mkdir()
    settings.STORAGES = {
        **settings.STORAGES,
        **{
            name: {
                "BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(tmp_path / name)},
            }
            for name in ("inbox", "archive")
        },
    }
    settings.RECOVERY_IMPORT_DIRS = [str(tmp_path / "imports")]
    line = {"type": "backup-created", "detail": "from elsewhere", "ts": ""}
    (tmp_path / "imports" / "events.jsonl").write_text(json.dumps(line) + "\n")
    (tmp_path / "imports" / "events.csv").write_text("type,detail\nbackup-created,x\n")
    return tmp_path


def builtin_cases(root: Path) -> dict[str, tuple[dict[str, str], dict]]:
    """operation -> (the form as a browser posts it, what the job's input must hold)."""
    imports = root / "imports"
    return {
        "backup.database": (
            {"database": "default", "name": "nightly-1", "batch_size": "250",
             "exclude": "sessions"},
            {"database": "default", "name": "nightly-1", "batch_size": 250,
             "exclude": ["sessions"], "snapshot": False},
        ),
        "restore.database": (
            {"name": "backup-old", "database": "default", "replace": "on", "exclude": ""},
            {"name": "backup-old", "database": "default", "replace": True},
        ),
        "db.copy": (
            {"source": "default", "target": "other", "batch_size": "100", "exclude": ""},
            {"source": "default", "target": "other", "replace": False, "batch_size": 100},
        ),
        "integrity.scan": (
            {"target": "storage", "storage": "inbox", "prefix": "boards/", "batch_files": "20"},
            {"target": "storage", "storage": "inbox", "prefix": "boards"},  # normalised
        ),
        "files.move": (
            {"source": "inbox", "destination": "archive", "prefix": "2026/",
             "on_conflict": "skip"},
            {"source": "inbox", "destination": "archive", "prefix": "2026/",
             "on_conflict": "skip"},
        ),
        "import.jsonl": (
            {"path": str(imports / "events.jsonl"), "batch_records": "50"},
            {"path": str(imports / "events.jsonl"), "batch_records": 50},
        ),
        "import.csv": (
            {"path": str(imports / "events.csv"), "batch_records": ""},
            {"path": str(imports / "events.csv")},
        ),
    }  # fmt: skip


def posted(operation: str, form: dict[str, str]) -> dict[str, str]:
    return {"operation": operation, **{f"input-{name}": value for name, value in form.items()}}


BUILTINS = ["backup.database", "restore.database", "db.copy", "integrity.scan", "files.move",
            "import.jsonl", "import.csv"]  # fmt: skip


@pytest.mark.parametrize("operation", BUILTINS)
def test_builtin__started_from_its_form_with_the_expected_input(client_for, site, operation):
    client = client_for("privileged")
    form, expected = builtin_cases(site)[operation]
    page = client.get(URL, {"operation": operation}).content.decode()
    for field in form:
        assert f'name="input-{field}"' in page, field  # the operation's own form
    response = client.post(
        URL, {"operation": operation, **{f"input-{k}": v for k, v in form.items()}}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.get()
    assert job.operation == operation
    assert job.owner == "privileged"
    assert expected.items() <= job.input.items(), job.input
    audit = RecoveryEvent.objects.get(type="job-created")
    assert (audit.job_id, audit.operation) == (job.pk, operation)


@pytest.mark.parametrize("operation", BUILTINS)
def test_builtin__without_start_privileged_job_as_its_access_says(client_for, site, operation):
    # Which built-ins are PRIVILEGED is the operations' own declaration (backup, restore,
    # copy, moves and imports read or replace data beyond their rows); the page obeys it.
    form, _ = builtin_cases(site)[operation]
    response = client_for("adder").post(URL, posted(operation, form))
    if get_operation(operation).access == Access.PRIVILEGED:
        assert response.status_code == 403
        assert "needs the permission durable.start_privileged_job" in response.content.decode()
        assert not Job.objects.exists()
    else:
        assert response.status_code == 302
        assert Job.objects.get().operation == operation


def test_builtin__a_refused_input_is_shown_beside_its_field(client_for, site):
    client = client_for("privileged")
    response = client.post(URL, {"operation": "import.jsonl", "input-path": "/etc/passwd"})
    html = response.content.decode()
    assert response.status_code == 200
    assert 'id="id_input-path-error"' in html
    assert "RECOVERY_IMPORT_DIRS" in html
    assert not Job.objects.exists()
