"""import.jsonl and import.csv in one process: formats, dedupe by file and by row, refusals.

Real worker processes killed mid-import, and the rest of the guarantees
(docs/explanation/guarantees.md),
are in ``test_builtin_workers.py``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from durable import jobs
from durable.errors import InputRejected, NonRetryable
from durable.models import Job, UnitResult
from durable.operations import JobContext, get_operation
from recovery.imports.models import ImportRecord
from recovery.imports.operations import ImportForm, line_prefix
from recovery.models import RecoveryEvent
from recovery.records import record_event

from .helpers import drain

pytestmark = pytest.mark.django_db

JSONL = (
    b'{"type":"backup-created","db":"wekan","detail":"Backed up","ts":"2026-11-30T10:00:00Z"}\n'
    b"not json at all\n"
    b"\n"
    b'{"type":"restore-backup","severity":"error","done":false,"ip":"::ffff:10.0.0.7"}\r\n'
    b'["an","array"]\n'
    b'{"detail":"no type"}\n'
    b'{"type":"integrity-ok","source":"ferretdb"}'  # the last line, without its newline
)
CSV = (
    b"type,severity,detail,done,deleted_data,object_ids,object_titles,ts,Comment\n"
    b'board-permanently-deleted,warning,"Deleted ""Roadmap"",\nfor good",true,true,'
    b'"[""b1""]","[""Roadmap""]",2026-11-30T10:00:00Z,ignored\n'
    b"integrity-ok,,,,,,,,\n"
    b",info,a row without a type,,,,,,\n"
    b"backup-created,info,x,,,,,,,surplus\n"
    b'"broken,quote\n'
)


@pytest.fixture(autouse=True)
def import_dir(settings, tmp_path) -> Path:
    """Imports read only inside RECOVERY_IMPORT_DIRS: here, the test's own directory."""
    settings.RECOVERY_IMPORT_DIRS = [str(tmp_path)]
    return tmp_path


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def run_import(operation: str, path: str, **extra) -> Job:
    return drain(jobs.enqueue(operation, {"path": path, **extra}).pk)


def imported() -> list[RecoveryEvent]:
    return list(RecoveryEvent.objects.filter(source_line__startswith="imp:").order_by("id"))


def test_jsonl__imports_valid_lines_and_counts_the_rest(tmp_path):
    path = write(tmp_path, "export.jsonl", JSONL)
    job = run_import("import.jsonl", path)
    assert job.state == "completed"
    events = imported()
    assert [(e.type, e.severity, e.source) for e in events] == [
        ("backup-created", "info", "startup"),
        ("restore-backup", "error", "startup"),
        ("integrity-ok", "info", "ferretdb"),
    ]
    assert (events[1].done, events[1].ipv4) == (False, "10.0.0.7")
    sha = hashlib.sha256(JSONL).hexdigest()
    assert all(e.source_line.startswith(line_prefix(sha)) for e in events)
    record = ImportRecord.objects.get()
    assert (record.sha256, record.format, record.state, record.job_id) == (
        sha,
        "jsonl",
        "completed",
        job.pk,
    )
    assert (record.records, record.imported, record.duplicates) == (7, 3, 0)
    assert record.skipped == {"malformed_json": 1, "blank": 1, "not_object": 1, "missing_type": 1}
    report = RecoveryEvent.objects.get(type="recovery-events-import")
    assert report.severity == "warning"
    assert report.detail.startswith(f"Imported 3 events from 7 lines of {path} (JSONL, sha256 ")
    assert "Skipped 3: 1 malformed JSON, 1 without a type, 1 not a JSON object." in report.detail
    assert job.events.get(kind="imported").message == report.detail


def test_csv__imports_rows_with_the_header_in_any_order(tmp_path):
    path = write(tmp_path, "export.csv", CSV)
    job = run_import("import.csv", path)
    assert job.state == "completed"
    deleted, ok = imported()
    assert (deleted.type, deleted.detail, deleted.done, deleted.deleted_data) == (
        "board-permanently-deleted",
        'Deleted "Roadmap",\nfor good',
        True,
        True,
    )
    assert (deleted.object_ids, deleted.object_titles) == (["b1"], ["Roadmap"])
    assert (ok.type, ok.severity, ok.done) == ("integrity-ok", "info", None)
    record = ImportRecord.objects.get()
    assert record.skipped == {"missing_type": 1, "wrong_field_count": 1, "malformed_csv": 1}
    report = RecoveryEvent.objects.get(type="recovery-events-import")
    assert "from 5 rows" in report.detail
    assert "Skipped 3: 1 malformed CSV, 1 without a type, 1 more fields than the header." in (
        report.detail
    )


def test_same_file_twice__one_import_record_and_no_duplicate_events(tmp_path):
    first = run_import("import.jsonl", write(tmp_path, "a.jsonl", JSONL))
    # The same bytes under another name: recognised by their SHA-256.
    second = run_import("import.jsonl", write(tmp_path, "copy-of-a.jsonl", JSONL))
    assert second.state == "completed"
    assert len(imported()) == 3
    assert ImportRecord.objects.get().job_id == first.pk
    note = second.events.get(kind="already_imported")
    assert f"was imported by job {first.pk}" in note.message
    assert UnitResult.objects.get(job_id=second.pk, key="source").result["status"] == (
        "already_imported"
    )
    assert RecoveryEvent.objects.filter(type="recovery-events-import").count() == 1


def test_same_file_while_another_job_imports_it__that_job_does_it(tmp_path):
    path = write(tmp_path, "a.jsonl", JSONL)
    busy = jobs.enqueue("durable.noop", {})  # stands in for the unfinished first import
    ImportRecord.objects.create(
        sha256=hashlib.sha256(JSONL).hexdigest(), format="jsonl", path=path, size=1, job_id=busy.pk
    )
    job = run_import("import.jsonl", path)
    assert job.state == "completed"
    assert imported() == []
    assert f"job {busy.pk} is importing this file" in job.events.get(kind="being_imported").message


def run_first_units(job: Job, count: int) -> dict:
    """Run a job's first ``count`` units by hand, as a worker that then died would have."""
    op = get_operation(job.operation)
    ctx = JobContext(job_id=job.pk, operation=job.operation, input=job.input, checkpoint=None,
                     attempt=1, worker_id="w", lease_epoch=1)  # fmt: skip
    units = op.units(ctx)
    for _ in range(count):
        unit = next(units)
        op.run_unit(ctx, unit)
        ctx.checkpoint = unit.checkpoint
    units.close()
    return ctx.checkpoint


def test_a_file_left_unfinished_by_a_failed_job_is_taken_over(tmp_path):
    path = write(tmp_path, "a.jsonl", JSONL)
    first = jobs.enqueue("import.jsonl", {"path": path, "batch_records": 2})
    run_first_units(first, 2)  # the record, then the first batch (one event, one bad line)
    Job.objects.filter(pk=first.pk).update(state="failed", finished_at=timezone.now())
    assert len(imported()) == 1
    second = run_import("import.jsonl", path)
    assert second.state == "completed"
    assert len(imported()) == 3  # nothing twice
    record = ImportRecord.objects.get()
    assert (record.job_id, record.state, record.imported, record.duplicates) == (
        second.pk,
        "completed",
        2,
        1,
    )
    assert f"left unfinished by job {first.pk}" in second.events.get(kind="taken_over").message


def test_batches_are_units_and_the_checkpoint_is_the_byte_offset(tmp_path, settings):
    settings.DURABLE_UNIT_TARGET_SECONDS = 60.0  # every unit is quick: each doubles the last
    data = b"".join(json.dumps({"type": "t", "detail": str(n)}).encode() + b"\n" for n in range(5))
    job = run_import("import.jsonl", write(tmp_path, "five.jsonl", data), batch_records=2)
    keys = list(
        UnitResult.objects.filter(job_id=job.pk).order_by("id").values_list("key", flat=True)
    )
    line = len(data) // 5
    # Paced (durable.pacing): one record first after the claim, then at most batch_records.
    assert keys == ["source", "records:0", f"records:{line}", f"records:{3 * line}", "summary"]
    assert (job.units_done, job.units_total) == (5, 5)
    assert job.checkpoint["offset"] == len(data)
    assert job.checkpoint["done"] is True
    assert [e.detail for e in imported()] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("operation", "name", "data"),
    [
        ("import.csv", "x.csv", CSV),  # a header, a quoted newline, 5 rows
        ("import.jsonl", "x.jsonl", JSONL),  # the last line without its newline
    ],
)
@pytest.mark.parametrize("batch", [1, 2, 1000])
def test_progress__a_completed_import_shows_n_of_n(tmp_path, operation, name, data, batch):
    job = run_import(operation, write(tmp_path, name, data), batch_records=batch)
    assert job.state == "completed"
    assert job.units_done == job.units_total
    again = run_import(operation, write(tmp_path, f"again-{name}", data), batch_records=batch)
    assert again.events.filter(kind="already_imported").exists()
    assert again.units_done == again.units_total == 1


def test_an_empty_file_imports_nothing(tmp_path):
    for operation, name in (("import.jsonl", "e.jsonl"), ("import.csv", "e.csv")):
        job = run_import(operation, write(tmp_path, name, b""))
        assert job.state == "completed"
    assert imported() == []


def test_a_csv_without_a_type_column_fails_with_the_reason(tmp_path):
    job = run_import("import.csv", write(tmp_path, "x.csv", b"kind,detail\nbackup,x\n"))
    assert job.state == "failed"
    assert job.reason.endswith(
        f"{tmp_path / 'x.csv'}: the CSV header has no 'type' column (2 columns; recognised: detail)"
    )
    assert "kind" not in job.reason  # a column we do not know is not quoted
    assert imported() == []


def test_a_file_that_changes_during_the_import_stops_it(tmp_path):
    path = write(tmp_path, "a.jsonl", JSONL)
    job = jobs.enqueue("import.jsonl", {"path": path, "batch_records": 2})
    checkpoint = run_first_units(job, 1)
    Job.objects.filter(pk=job.pk).update(checkpoint=checkpoint, units_done=1)
    with open(path, "ab") as handle:
        handle.write(b'{"type":"late"}\n')
    job = drain(job.pk)
    assert job.state == "failed"
    assert "changed since this import started" in job.reason
    assert imported() == []


def test_a_file_replaced_between_units_of_one_claim_is_not_imported_under_the_old_hash(tmp_path):
    """Checked by every unit, not once per claim: the records unit holds the file it reads."""
    path = write(tmp_path, "a.jsonl", JSONL)
    job = jobs.enqueue("import.jsonl", {"path": path, "batch_records": 2})
    op = get_operation(job.operation)
    ctx = JobContext(job_id=job.pk, operation=job.operation, input=job.input, checkpoint=None,
                     attempt=1, worker_id="w", lease_epoch=1)  # fmt: skip
    units = op.units(ctx)
    source = next(units)
    op.run_unit(ctx, source)
    ctx.checkpoint = source.checkpoint
    batch = next(units)  # planned on the file whose SHA-256 the source unit took
    other = JSONL.replace(b"Backed up", b"Forged up")  # same size, other bytes
    write(tmp_path, "replacement", other)
    os.replace(tmp_path / "replacement", path)  # a new inode under the same path
    with pytest.raises(NonRetryable, match="changed since this import started"):
        op.run_unit(ctx, batch)
    units.close()
    assert imported() == []


def test_a_missing_file_pauses_until_it_is_there(tmp_path):
    path = str(tmp_path / "later.jsonl")
    job = run_import("import.jsonl", path)
    assert job.state == "paused"
    assert f"{path} does not exist: put the export there, then resume" == job.reason
    Path(path).write_bytes(JSONL)
    jobs.resume(job.pk)
    assert drain(job.pk).state == "completed"
    assert len(imported()) == 3


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "path"),
        ({"path": "  "}, "path"),
        ({"path": "/x\x00y"}, "path"),
        ({"path": "/x"}, "path"),  # outside RECOVERY_IMPORT_DIRS
        ({"path": "x", "batch_records": 0}, "batch_records"),
        ({"path": "x", "batch_records": True}, "batch_records"),
    ],
)
def test_refuses_bad_input(data, field, tmp_path):
    if isinstance(data.get("path"), str) and data["path"] == "x":
        data = {**data, "path": str(tmp_path / "x")}
    with pytest.raises(InputRejected) as refused:
        jobs.enqueue("import.csv", data)
    assert refused.value.field == field


def test_import_dirs_setting_limits_where_files_are_read(settings, tmp_path):
    settings.RECOVERY_IMPORT_DIRS = [str(tmp_path / "imports")]
    (tmp_path / "imports").mkdir()
    jobs.enqueue("import.jsonl", {"path": str(tmp_path / "imports" / "a.jsonl")})
    for outside in ("/etc/passwd", str(tmp_path / "imports" / ".." / "other.jsonl")):
        with pytest.raises(InputRejected, match="RECOVERY_IMPORT_DIRS"):
            jobs.enqueue("import.jsonl", {"path": outside})


@pytest.mark.parametrize("configured", [None, []], ids=["unset", "empty"])
def test_import_dirs__default_to_var_imports_never_to_anywhere(settings, tmp_path, configured):
    settings.VAR_DIR = tmp_path / "var"
    if configured is None:
        del settings.RECOVERY_IMPORT_DIRS
    else:
        settings.RECOVERY_IMPORT_DIRS = configured
    for outside in ("/etc/passwd", str(tmp_path / "app.env")):
        with pytest.raises(InputRejected, match=r"var/imports \(RECOVERY_IMPORT_DIRS\)"):
            jobs.enqueue("import.csv", {"path": outside})
    default = tmp_path / "var" / "imports"
    assert default.is_dir()  # created on demand, for the operator to put exports in
    assert oct(default.stat().st_mode & 0o777) == oct(0o750 & ~current_umask())
    jobs.enqueue("import.csv", {"path": str(default / "export.csv")})


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_import_dirs__a_link_out_of_the_directory_is_refused(tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    outside.write_bytes(JSONL)
    try:
        link = tmp_path / "innocent.jsonl"
        link.symlink_to(outside)
        with pytest.raises(InputRejected, match="RECOVERY_IMPORT_DIRS"):
            jobs.enqueue("import.jsonl", {"path": str(link)})
        # A link swapped in after the enqueue: the worker checks again, and reads nothing.
        later = tmp_path / "later.jsonl"
        later.write_bytes(b"")
        job = jobs.enqueue("import.jsonl", {"path": str(later)})
        later.unlink()
        later.symlink_to(outside)
        job = drain(job.pk)
        assert job.state == "failed"
        assert "imports are only read from" in job.reason
        assert imported() == []
        assert not ImportRecord.objects.exists()
    finally:
        outside.unlink()


def test_import_dirs__the_workers_settings_decide_too(settings, tmp_path):
    path = write(tmp_path, "a.jsonl", JSONL)
    job = jobs.enqueue("import.jsonl", {"path": path})
    settings.RECOVERY_IMPORT_DIRS = [str(tmp_path / "elsewhere")]  # the worker's own settings
    job = drain(job.pk)
    assert job.state == "failed"
    assert f"{tmp_path / 'elsewhere'} (RECOVERY_IMPORT_DIRS)" in job.reason
    assert imported() == []


SECRETS = ("s3cr3t-k3y-do-not-show", "hunter2-database")
ENV_FILE = (
    f"DJANGO_SECRET_KEY={SECRETS[0]},DB_PASSWORD={SECRETS[1]}\n"
    "type=1\n"
    f'{{"type": "x", "detail": "fine"}}\n'
).encode()


@pytest.mark.parametrize("operation", ["import.csv", "import.jsonl"])
def test_a_secret_first_line_never_reaches_reasons_events_or_logs(tmp_path, caplog, operation):
    """An ``app.env`` that found its way into the import directory: nothing of it is shown."""
    caplog.set_level("DEBUG")
    job = run_import(operation, write(tmp_path, "app.env", ENV_FILE))
    seen = [
        job.reason,
        json.dumps(job.errors),
        json.dumps(job.checkpoint),
        *(f"{e.message} {json.dumps(e.data)}" for e in job.events.all()),
        *(json.dumps(r) for r in UnitResult.objects.values_list("result", flat=True)),
        *(f"{e.detail} {e.reason} {e.object_titles}" for e in RecoveryEvent.objects.all()),
        caplog.text,
    ]
    for secret in SECRETS:
        assert not any(secret in text for text in seen), secret
    if operation == "import.csv":
        assert job.state == "failed"
        assert "no 'type' column (2 columns, none recognised)" in job.reason
    else:  # its one JSON line is an event; the other lines are counted, not quoted
        assert job.state == "completed"
        assert [e.detail for e in imported()] == ["fine"]


def test_form__its_cleaned_data_is_the_job_input(tmp_path):
    form = ImportForm(data={"path": str(tmp_path / "a.csv")})
    assert form.is_valid(), form.errors
    job = jobs.enqueue("import.csv", form.cleaned_data)
    assert job.input == {"path": str(tmp_path / "a.csv"), "batch_records": 1000}


def test_command__refuses_a_missing_file(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        call_command("import_recovery_events", str(tmp_path / "nope.csv"), stdout=io.StringIO())


# transaction=True: --wait runs the job in a thread with its own connection.
@pytest.mark.django_db(transaction=True)
def test_command__wait_imports_and_a_second_run_says_it_was_imported(tmp_path):
    path = write(tmp_path, "export.csv", CSV)
    out = io.StringIO()
    call_command("import_recovery_events", path, "--wait", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("enqueued job ")
    assert lines[0].endswith(f"import {path} (csv)")
    assert lines[-1].startswith("Imported 2 events from 5 rows of")
    out = io.StringIO()
    call_command("import_recovery_events", path, "--format", "csv", "--wait", stdout=out)
    assert "was imported by job" in out.getvalue().splitlines()[-1]
    assert len(imported()) == 2


def test_command__run_again_while_the_import_is_unfinished_follows_that_job(tmp_path):
    path = write(tmp_path, "export.csv", CSV)
    out = io.StringIO()
    call_command("import_recovery_events", path, stdout=out)
    assert out.getvalue().startswith("enqueued job ")
    (job,) = Job.objects.filter(operation="import.csv")
    out = io.StringIO()
    call_command("import_recovery_events", path, stdout=out)
    assert out.getvalue().strip() == f"job {job.pk} is already doing this (queued); following it"
    assert Job.objects.filter(operation="import.csv").count() == 1


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_then_import__another_instance_gets_the_same_events(tmp_path, fmt):
    record_event("board-permanently-deleted", severity="warning", source="admin-panel",
                 db="wekan", detail='Deleted "Roadmap", with a comma,\nand a newline',
                 done=True, deleted_data=True, user_id="u1", username="alice",
                 ip="::ffff:203.0.113.9", object_ids=["b1"], object_titles=["Roadmap"],
                 ts="2026-11-30T10:00:05Z")  # fmt: skip
    record_event("restore-backup", severity="error", done=False, detail="failed")
    fields = ["type", "severity", "source", "db", "detail", "done", "deleted_data", "user_id",
              "username", "ipv4", "ipv6", "object_ids", "object_titles", "ts"]  # fmt: skip
    before = list(RecoveryEvent.objects.order_by("id").values_list(*fields))
    path = tmp_path / f"export.{fmt}"
    out = io.StringIO()
    call_command("export_recovery_events", "--format", fmt, "--output", str(path), stdout=out)
    assert out.getvalue() == f"exported 2 events to {path}\n"
    RecoveryEvent.objects.all().delete()  # "another instance"
    assert run_import(f"import.{fmt}", str(path)).state == "completed"
    after = list(RecoveryEvent.objects.order_by("id").values_list(*fields))
    assert after[:2] == before
    assert RecoveryEvent.objects.filter(type="recovery-events-import").count() == 1


def test_export__to_stdout_only_the_types_asked_for(capsysbinary):
    record_event("integrity-ok", detail="fine")
    record_event("backup-created", detail="saved")
    call_command("export_recovery_events", "--type", "backup-created")
    captured = capsysbinary.readouterr()
    assert json.loads(captured.out) == {
        "type": "backup-created", "severity": "info", "source": "server", "detail": "saved",
        "deleted_data": False,
    }  # fmt: skip
    assert captured.err == b"exported 1 event\n"
