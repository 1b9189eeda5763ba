"""Backups and restores beyond the shared scenarios: damaged backups, merge mode, commands.

Most tests run the job in the test's own transaction (recovery events are
written in the announcing transaction; the engine's other signals, sent on
commit, are captured with ``captureOnCommitCallbacks``; Django's test case
checks deferred foreign keys at teardown). Tests with a worker
subprocess or a command running the job in a thread use ``transaction=True``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import tracemalloc
import zlib
from datetime import timedelta
from pathlib import Path
from subprocess import PIPE, STDOUT

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import TestCase
from django.utils import timezone

from durable import jobs
from durable.builtin import backupdir
from durable.builtin.backup import BackupForm
from durable.builtin.manifest import MANIFEST, SUMS, format_sums, parse_sums
from durable.builtin.models import Announcement
from durable.builtin.restore import RestoreForm
from durable.builtin.tables import TableDigest, row_bytes
from durable.errors import InputRejected, LeaseLost
from durable.lease import claim, commit_unit
from durable.models import Job
from durable.operations import JobContext, Unit, get_operation
from durable.transitions import settle
from tests.conftest import BASE_DIR, wait_until
from tests.opsapp.models import Node, RecordedEvent, Sample, Tag

from .dataset import TEST_EXCLUDE, alias_url, backup_contents, contents, make_dataset
from .helpers import drain
from .opscenarios import proc_state, stale_and_fresh

# Long enough that a live worker on this busy 2-core machine never loses its lease
# to a late renewal: a reclaim here would be noise, not the scenario under test.
LEASE = 10.0
pytestmark = pytest.mark.django_db
# Another process or thread must see the test's rows: they must really be committed.
committed = pytest.mark.django_db(transaction=True)


def using(*aliases: str) -> pytest.MarkDecorator:
    """Also set up these second databases."""
    return pytest.mark.django_db(databases=["default", *aliases])


PG = os.environ.get("DATABASE_URL", "").startswith("postgres")


@pytest.fixture
def backups(tmp_path: Path, settings) -> Path:
    settings.DURABLE_BACKUP_DIR = tmp_path / "backups"
    settings.DURABLE_BACKUP_DIR.mkdir()
    return settings.DURABLE_BACKUP_DIR


def run(job_id: int):
    """Run the job here; signals sent on commit are delivered as it runs."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return drain(job_id, timeout=60)


def backup(name: str, **extra) -> Path:
    job = jobs.enqueue(
        "backup.database", {"name": name, "batch_size": 4, "exclude": TEST_EXCLUDE, **extra}
    )
    job = run(job.pk)
    assert job.state == "completed", job.reason
    return Path(job.unit_results.get(key="publish").result["path"])


def restore(name: str, **extra):
    return run(
        jobs.enqueue("restore.database", {"name": name, "exclude": TEST_EXCLUDE, **extra}).pk
    )


def rewrite_sums(path: Path) -> None:
    """Recompute SHA256SUMS, as an attacker or a careless edit would: checksums then agree."""
    sums = parse_sums((path / SUMS).read_text())
    for name in sums:
        sums[name] = hashlib.sha256((path / name).read_bytes()).hexdigest()
    (path / SUMS).write_text(format_sums(sums))


def first_part(path: Path) -> Path:
    return sorted(path.glob("opsapp.sample.*.jsonl.gz"))[0]


# --- damaged backups ----------------------------------------------------------------------


def flip_byte(path: Path) -> None:
    part = first_part(path)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x40
    part.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    part = first_part(path)
    part.write_bytes(part.read_bytes()[:-10])


def edit_manifest_keep_sums(path: Path) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["tables"][0]["parts"] = manifest["tables"][0]["parts"][:-1]
    (path / MANIFEST).write_text(json.dumps(manifest))


def valid_checksums_wrong_rows(path: Path) -> None:
    """A part rewritten with other rows, and every checksum brought in line: the row count and
    the manifest still tell."""
    manifest = json.loads((path / MANIFEST).read_text())
    table = next(t for t in manifest["tables"] if t["model"] == "opsapp.sample")
    part = table["parts"][0]
    lines = gzip.decompress((path / part["file"]).read_bytes()).splitlines()
    data = gzip.compress(b"\n".join(lines[:-1]) + b"\n")
    (path / part["file"]).write_bytes(data)
    part["bytes"], part["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (path / MANIFEST).write_text(json.dumps(manifest))
    rewrite_sums(path)


DAMAGE = {
    "flipped byte in a part": (flip_byte, "SHA-256 mismatch"),
    "truncated part": (truncate, "bytes, the manifest recorded"),
    "missing part file": (lambda p: first_part(p).unlink(), "is missing"),
    "missing manifest": (lambda p: (p / MANIFEST).unlink(), "manifest.json is missing"),
    "missing SHA256SUMS": (lambda p: (p / SUMS).unlink(), "SHA256SUMS is missing"),
    "manifest edited": (edit_manifest_keep_sums, "does not match its SHA-256"),
    "rows swapped, checksums redone": (valid_checksums_wrong_rows, "rows, the manifest recorded"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_restore__refuses_a_damaged_backup_without_touching_the_database(backups, damage):
    make_dataset()
    path = backup("damaged")
    Sample.objects.update(name="written after the backup")
    Tag.objects.create(code="after")
    before = contents("default")
    harm, reason = DAMAGE[damage]
    harm(path)

    job = restore("damaged", replace=True)

    assert job.state == "failed"
    assert job.error_code == "non_retryable"
    assert job.attempts == 1  # a verdict, not retried
    assert reason in job.reason
    assert contents("default") == before  # not one row deleted or written
    [event] = RecordedEvent.objects.filter(job_id=job.pk)
    assert (event.type, event.done, event.severity) == ("restore-backup", False, "error")
    assert reason in event.detail
    assert "Nothing was changed" in event.detail


def add_column(path: Path, label: str, column: str, value) -> None:
    """Rewrite one table of a backup as if it came from a schema with one more column.

    Everything is made consistent again (parts, digest, manifest, SHA256SUMS):
    only the schema check can tell.
    """
    manifest = json.loads((path / MANIFEST).read_text())
    table = next(t for t in manifest["tables"] if t["model"] == label)
    table["columns"] = [*table["columns"], column]
    digest = TableDigest()
    for part in table["parts"]:
        rows = [[*row, value] for row in backupdir.decode_part(
            (path / part["file"]).read_bytes(), name=part["file"])[1]]  # fmt: skip
        for row in rows:
            digest.add(row_bytes(row))
        data = backupdir.encode_part({"model": label, "columns": table["columns"]}, rows)
        (path / part["file"]).write_bytes(data)
        part["bytes"], part["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    table["digest"] = digest.hexdigest()
    (path / MANIFEST).write_text(json.dumps(manifest))
    rewrite_sums(path)


def test_restore__refuses_a_backup_of_another_schema(backups):
    make_dataset()
    path = backup("old-schema")
    add_column(path, "opsapp.tag", "colour", "red")
    backupdir.verify(path)  # a sound backup, of another schema
    before = contents("default")

    job = restore("old-schema", replace=True)

    assert job.state == "failed"
    assert "opsapp.tag: the backup's columns" in job.reason
    assert "migrate" in job.reason
    assert contents("default") == before


def test_restore__a_staging_directory_is_not_a_backup(backups):
    make_dataset()
    (backups / ".half.partial-99").mkdir()
    with pytest.raises(InputRejected, match="name"):
        jobs.enqueue("restore.database", {"name": ".half.partial-99"})


def test_restore__a_worker_that_lost_its_lease_cannot_delete_anything(backups):
    make_dataset()
    path = backup("fenced")
    before = contents("default")
    job = jobs.enqueue(
        "restore.database", {"name": "fenced", "replace": True, "exclude": TEST_EXCLUDE}
    )
    stale, fresh = stale_and_fresh(job)
    sha = hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()
    stale.checkpoint = fresh.checkpoint = {"next": 2, "manifest": sha}
    restore_op = get_operation("restore.database")
    with pytest.raises(LeaseLost):
        restore_op.run_unit(stale, Unit(key="clear"))
    assert contents("default") == before
    assert restore_op.run_unit(fresh, Unit(key="clear"))["deleted"] > 0


# --- a replace that stops after deleting --------------------------------------------------


def _interrupted(job) -> list[RecordedEvent]:
    return list(RecordedEvent.objects.filter(job_id=job.pk, type="restore-backup"))


def test_restore__failing_after_the_clear_says_which_tables_are_empty_and_how_to_finish(
    backups, monkeypatch
):
    make_dataset()
    backup("base")
    real = backupdir.read_part

    def unreadable_samples(path, part, columns):
        if part["file"].startswith("opsapp.sample."):
            raise backupdir.BackupDamaged(f"{part['file']} changed after the backup was verified")
        return real(path, part, columns)

    monkeypatch.setattr(backupdir, "read_part", unreadable_samples)
    job = restore("base", replace=True)
    assert job.state == "failed"
    assert Sample.objects.count() == 0  # deleted by the clear, never loaded again
    (event,) = _interrupted(job)
    assert (event.done, event.deleted_data, event.severity) == (False, True, "error")
    assert f"(job {job.pk}) failed after it deleted the current rows" in event.detail
    assert "opsapp.sample" in event.detail
    assert "restored completely" in event.detail  # the parents loaded before the failure
    assert "restore_database base --replace --database default" in event.detail
    # The same stop reported again (a worker start's catch-up): nothing new.
    from durable.builtin.restore import announce_interrupted, on_worker_started

    assert announce_interrupted(job.pk) is False
    on_worker_started(sender="test")
    assert len(_interrupted(job)) == 1
    # Fixed and retried, the job finishes; "done" is the newer event.
    monkeypatch.setattr(backupdir, "read_part", real)
    assert jobs.retry_now(job.pk, actor="ops").applied
    assert run(job.pk).state == "completed"
    assert [e.done for e in _interrupted(job)] == [False, True]


def test_restore__an_announcement_lost_to_a_crash_is_made_at_the_next_worker_start(backups):
    make_dataset()
    backup("base")
    job = jobs.enqueue(
        "restore.database", {"name": "base", "replace": True, "exclude": TEST_EXCLUDE}
    )
    lease, claimed = claim("w", queues=[], operations=["restore.database"], lease_seconds=30,
                           job_id=job.pk)  # fmt: skip
    op = get_operation("restore.database")
    ctx = JobContext(job_id=job.pk, operation=job.operation, input=claimed.input,
                     checkpoint=None, attempt=1, worker_id="w",
                     lease_epoch=lease.epoch)  # fmt: skip
    units = op.units(ctx)
    for _ in range(2):  # verify, then clear: the tables are empty now
        unit = next(units)
        result = op.run_unit(ctx, unit)
        commit_unit(lease, key=unit.key, result=result, checkpoint=unit.checkpoint,
                    units_total=None)  # fmt: skip
        ctx.checkpoint = unit.checkpoint
    units.close()
    assert Sample.objects.count() == 0
    # Cancelled and settled with no on-commit receiver ever running: the process
    # that made the change died right after its commit.
    assert jobs.cancel(job.pk, actor="ops").applied
    settle(lease)
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert _interrupted(job) == []
    from durable.builtin.restore import on_worker_started

    on_worker_started(sender="worker")
    (event,) = _interrupted(job)
    assert (event.done, event.deleted_data) == (False, True)
    assert "was cancelled after it deleted the current rows" in event.detail
    on_worker_started(sender="worker")
    assert len(_interrupted(job)) == 1


def test_restore__a_stop_before_the_clear_or_without_replace_reports_nothing_more(backups):
    make_dataset()
    backup("base")
    merged = jobs.enqueue("restore.database", {"name": "base", "exclude": TEST_EXCLUDE})
    queued = jobs.enqueue(
        "restore.database",
        {"name": "base", "database": "default", "replace": True, "exclude": TEST_EXCLUDE},
        unique_key="another",
    )
    with TestCase.captureOnCommitCallbacks(execute=True):
        jobs.cancel(merged.pk, actor="ops")
        jobs.cancel(queued.pk, actor="ops")
    assert _interrupted(merged) == []
    assert _interrupted(queued) == []


# --- round trips and modes ----------------------------------------------------------------


def test_round_trip__replace_restores_exactly_the_backed_up_rows(backups):
    make_dataset()
    expected = contents("default")
    backup("full")
    # Everything changes: rows deleted (cascading), updated, added, a cycle rewired.
    Node.objects.filter(parent__isnull=True).delete()
    Sample.objects.all().delete()
    Tag.objects.update(title="renamed")
    Sample.objects.create(name="new", data={"x": 1})
    assert contents("default") != expected

    job = restore("full", replace=True)

    assert job.state == "completed", job.reason
    assert contents("default") == expected
    assert job.unit_results.get(key="finish").result["verified"] is True
    event = RecordedEvent.objects.get(job_id=job.pk)
    assert (event.type, event.done, event.deleted_data) == ("restore-backup", True, True)


def test_replace__the_final_check_runs_in_bounded_batches(backups, monkeypatch):
    make_dataset()
    backup("full")
    monkeypatch.setattr("durable.builtin.restore.CHECK_BATCH", 5)
    job = restore("full", replace=True)
    assert job.state == "completed", job.reason
    checks = dict(job.unit_results.filter(key__startswith="check:opsapp.sample:")
                  .values_list("key", "result"))  # fmt: skip
    assert sorted(checks) == [f"check:opsapp.sample:{n}" for n in range(3)]  # 12 rows: 5 + 5 + 2
    assert [checks[f"check:opsapp.sample:{n}"]["rows"] for n in range(3)] == [5, 5, 2]
    assert job.units_done == job.units_total


@pytest.mark.parametrize("when", ["before its check", "after its check"])
def test_replace__a_write_during_the_restore_is_found_and_reported(backups, monkeypatch, when):
    make_dataset()
    backup("full")
    op = get_operation("restore.database")
    real = op.run_unit

    def meanwhile(ctx, unit):
        if unit.key == "check:opsapp.sample:0" and when == "before its check":
            Sample.objects.filter(pk=Sample.objects.order_by("pk")[0].pk).update(name="changed")
        if unit.key == "finish" and when == "after its check":
            Sample.objects.create(name="written after the check")
        return real(ctx, unit)

    monkeypatch.setattr(op, "run_unit", meanwhile)
    job = restore("full", replace=True)
    assert job.state == "failed"
    assert "these tables differ from the backup" in job.reason
    (event,) = RecordedEvent.objects.filter(job_id=job.pk)
    assert (event.type, event.done) == ("restore-backup", False)
    assert "opsapp.sample" in event.detail


def test_merge__brings_back_deleted_and_changed_rows_and_keeps_new_ones(backups):
    make_dataset()
    expected = contents("default")
    backup("merge")
    Sample.objects.filter(pk=Sample.objects.order_by("pk")[0].pk).delete()
    Tag.objects.update(title="renamed")
    added = Tag.objects.create(code="added-later", title="new")

    job = restore("merge")

    assert job.state == "completed", job.reason
    after = contents("default")
    assert after["opsapp.sample"] == expected["opsapp.sample"]
    assert [row for row in after["opsapp.tag"] if row[0] != added.code] == expected["opsapp.tag"]
    assert Tag.objects.get(code="added-later").title == "new"
    event = RecordedEvent.objects.get(job_id=job.pk)
    assert (event.type, event.done, event.deleted_data) == ("restore-backup", True, False)


def test_merge__a_row_colliding_on_another_unique_column_fails_at_once_and_says_where(backups):
    make_dataset()
    backup("collide")
    user = User.objects.get(username="user1")
    user.delete()
    User.objects.create_user("user1")  # the same name again, under a new id
    job = restore("collide")
    assert (job.state, job.attempts) == ("failed", 1)  # a verdict on the data, not retried
    assert "the database refused the rows of auth.user.000000.jsonl.gz" in job.reason
    assert "username" in job.reason.lower() or "unique" in job.reason.lower()


@using("other")
def test_restore__into_another_database(backups):
    make_dataset()
    expected = contents("default")
    backup("elsewhere")
    job = restore("elsewhere", database="other", replace=True)
    assert job.state == "completed", job.reason
    assert contents("other") == expected


@pytest.mark.skipif(not PG, reason="crosses vendors on the PostgreSQL leg")
@using("lite")
def test_round_trip__a_sqlite_backup_restores_into_postgresql(backups):
    make_dataset("lite")
    expected = contents("lite")
    backup("from-sqlite", database="lite")
    manifest = json.loads((backups / "from-sqlite" / MANIFEST).read_text())
    assert manifest["vendor"] == "sqlite"
    job = restore("from-sqlite", replace=True)
    assert job.state == "completed", job.reason
    assert contents("default") == expected


def test_backup__keeps_auto_now_timestamps_and_names_itself(backups):
    make_dataset(samples=2)
    stamped = list(Sample.objects.order_by("pk").values_list("created_at", flat=True))
    job = run(jobs.enqueue("backup.database", {"exclude": TEST_EXCLUDE}).pk)
    assert job.state == "completed", job.reason
    assert job.input["name"].startswith("backup-")
    Sample.objects.all().delete()
    assert restore(job.input["name"], replace=True).state == "completed"
    assert list(Sample.objects.order_by("pk").values_list("created_at", flat=True)) == stamped


def test_backup__a_published_backup_checks_with_sha256sum_format(backups):
    make_dataset(samples=3)
    path = backup("checkable")
    sums = parse_sums((path / SUMS).read_text())
    files = {p.name for p in path.iterdir()}
    assert set(sums) == files - {SUMS}
    for name, digest in sums.items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest
    header = json.loads(gzip.decompress(first_part(path).read_bytes()).splitlines()[0])
    assert header["model"] == "opsapp.sample"
    assert header["columns"][0] == "id"


def test_verify__streams_the_parts_in_bounded_memory(tmp_path):
    """A backup of big parts is verified one line at a time, never a whole file in memory."""
    path = tmp_path / "big"
    path.mkdir()
    columns = ["id", "text"]
    parts, digest = [], TableDigest()
    for index in range(2):
        rows = [[index * 10_000 + n, os.urandom(400).hex()] for n in range(10_000)]  # 8 MB each
        for row in rows:
            digest.add(row_bytes(row))
        data = backupdir.encode_part({"model": "opsapp.tag", "columns": columns}, rows)
        name = f"opsapp.tag.{index:06d}.jsonl.gz"
        (path / name).write_bytes(data)
        parts.append({"file": name, "rows": len(rows), "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()})  # fmt: skip
    manifest = {"format": "durable-backup/1", "tables": [
        {"model": "opsapp.tag", "table": "opsapp_tag", "columns": columns, "pk": "id",
         "rows": 20_000, "digest": digest.hexdigest(), "parts": parts}]}  # fmt: skip
    raw = json.dumps(manifest).encode()
    (path / MANIFEST).write_bytes(raw)
    sums = {part["file"]: part["sha256"] for part in parts}
    (path / SUMS).write_text(format_sums({**sums, MANIFEST: hashlib.sha256(raw).hexdigest()}))
    size = (path / parts[0]["file"]).stat().st_size
    tracemalloc.start()
    try:
        backupdir.verify(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size > 4_000_000
    assert peak < size / 4, f"peak {peak:,} bytes for parts of {size:,}"


@pytest.mark.parametrize("sums", ["left as they were", "recomputed after the damage"])
def test_verify__a_part_whose_deflate_stream_is_damaged_is_reported_not_raised(backups, sums):
    """Damage that makes zlib itself fail (not gzip's CRC): still a refusal with the reason."""
    make_dataset(samples=12)
    path = backup("rots")
    part = first_part(path)
    pristine = part.read_bytes()
    for offset in range(20, len(pristine) - 10):
        damaged = bytearray(pristine)
        damaged[offset] ^= 0x40
        try:
            gzip.decompress(bytes(damaged))
        except zlib.error:
            break
        except (OSError, EOFError):
            continue
    else:
        pytest.skip("no single flipped byte makes zlib fail on this part")
    part.write_bytes(bytes(damaged))
    if sums == "recomputed after the damage":
        rewrite_sums(path)
        manifest = json.loads((path / MANIFEST).read_text())
        for table in manifest["tables"]:
            for entry in table["parts"]:
                if entry["file"] == part.name:
                    entry["sha256"] = hashlib.sha256(bytes(damaged)).hexdigest()
        (path / MANIFEST).write_text(json.dumps(manifest))
        rewrite_sums(path)
    with pytest.raises(backupdir.BackupDamaged) as damage:
        backupdir.verify(path)
    expected = "cannot be read" if sums == "recomputed after the damage" else "SHA-256 mismatch"
    assert expected in str(damage.value)


@committed
def test_backup__damage_found_right_after_publishing_is_reported(backups, workers):
    make_dataset(samples=3)
    job = jobs.enqueue("backup.database", {"name": "rots", "exclude": TEST_EXCLUDE})
    env = {"DURABLE_BACKUP_DIR": str(backups)}
    proc = workers.start("--burst", faults="backup.after_publish:1:stop", lease=LEASE, env=env)
    wait_until(lambda: (backups / "rots" / SUMS).exists())
    flip_byte(backups / "rots")  # the disk rots between publishing and verifying
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0, workers.log(proc)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "failed verification" in job.reason
    assert sorted(RecordedEvent.objects.filter(job_id=job.pk).values_list("type", "done")) == [
        ("backup-created", True),
        ("backup-verified", False),
    ]


@pytest.mark.parametrize("snapshot", [True, False], ids=["snapshot", "per-batch"])
@committed
def test_backup__writes_during_the_backup(backups, workers, snapshot):
    """With ``snapshot`` (SQLite) the backup is the database as of its start; without, the
    writes made after a table was read are missing and later tables have them."""
    if snapshot and PG:
        with pytest.raises(InputRejected, match="pg_dump"):
            jobs.enqueue("backup.database", {"name": "s", "snapshot": True})
        return
    make_dataset()
    at_start = contents("default")
    job = jobs.enqueue(
        "backup.database",
        {"name": "live", "batch_size": 4, "exclude": TEST_EXCLUDE, "snapshot": snapshot},
    )
    env = {"DURABLE_BACKUP_DIR": str(backups)}
    # Stopped after a few parts: the first table read is the last in foreign-key order.
    proc = workers.start("--burst", faults="after_checkpoint:3:stop", lease=LEASE, env=env)
    wait_until(lambda: proc_state(proc.pid) == "T")
    Sample.objects.filter(pk=Sample.objects.order_by("pk")[0].pk).delete()
    Tag.objects.create(code="written-during-the-backup")
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0, workers.log(proc)
    job.refresh_from_db()
    assert job.state == "completed", job.reason
    found = backup_contents(backups / "live")
    manifest = json.loads((backups / "live" / MANIFEST).read_text())
    assert manifest["consistency"] == ("snapshot" if snapshot else "per-batch")
    assert not (backups / "live" / "snapshot.sqlite3").exists()
    if snapshot:
        assert found == at_start
    else:
        assert found != at_start
        assert ("written-during-the-backup", "") in found["opsapp.tag"]


@pytest.mark.skipif(PG, reason="snapshots are for SQLite")
@committed
def test_backup__a_snapshot_backups_total_is_the_snapshots(backups, workers):
    make_dataset()
    job = jobs.enqueue("backup.database", {"name": "snap", "batch_size": 4, "snapshot": True,
                                           "exclude": TEST_EXCLUDE})  # fmt: skip
    env = {"DURABLE_BACKUP_DIR": str(backups)}
    # Stopped after the claim counted the live rows, before "begin" takes the snapshot.
    proc = workers.start("--burst", faults="before_unit:1:stop", lease=LEASE, env=env)
    wait_until(lambda: proc_state(proc.pid) == "T")
    Sample.objects.bulk_create(Sample(name=f"late {n}") for n in range(8))  # two more parts
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0, workers.log(proc)
    job.refresh_from_db()
    assert job.state == "completed", job.reason
    assert job.units_done == job.units_total
    assert job.unit_results.get(key="publish").result["rows"] >= 20  # the late rows are in


@pytest.mark.skipif(PG, reason="snapshots are for SQLite")
@committed
def test_backup__a_snapshot_backup_resumes_from_its_snapshot_after_a_crash(backups, workers):
    make_dataset()
    at_start = contents("default")
    job = jobs.enqueue(
        "backup.database",
        {"name": "snap", "batch_size": 4, "exclude": TEST_EXCLUDE, "snapshot": True},
    )
    env = {"DURABLE_BACKUP_DIR": str(backups)}
    assert workers.run(faults="after_unit:4", lease=LEASE, env=env).returncode == -signal.SIGKILL
    Sample.objects.all().delete()  # the site writes while no worker runs the backup
    assert workers.run(lease=LEASE, env=env).returncode == 0
    job.refresh_from_db()
    assert (job.state, job.reclaims) == ("completed", 1)
    assert backup_contents(backups / "snap") == at_start
    assert sorted(p.name for p in backups.iterdir()) == ["snap"]


@pytest.mark.skipif(PG, reason="snapshots are for SQLite")
@committed
def test_backup__a_snapshot_backup_killed_right_after_publishing_resumes(backups, workers):
    # The snapshot was deleted before the rename while the saved progress (still in the
    # "tables" phase) planned the repeated publish from it: every retry failed.
    make_dataset()
    at_start = contents("default")
    job = jobs.enqueue(
        "backup.database",
        {"name": "snap", "batch_size": 4, "exclude": TEST_EXCLUDE, "snapshot": True},
    )
    env = {"DURABLE_BACKUP_DIR": str(backups)}
    killed = workers.run(faults="backup.after_publish", lease=LEASE, env=env)
    assert killed.returncode == -signal.SIGKILL, workers.log(killed)
    assert (backups / "snap").is_dir()  # published, the event not yet recorded
    assert workers.run(lease=LEASE, env=env).returncode == 0
    job.refresh_from_db()
    assert (job.state, job.reclaims) == ("completed", 1), job.reason
    assert backup_contents(backups / "snap") == at_start
    types = sorted(RecordedEvent.objects.filter(job_id=job.pk).values_list("type", "done"))
    assert types == [("backup-created", True), ("backup-verified", True)]
    assert sorted(p.name for p in backups.iterdir()) == ["snap"]  # the snapshot is gone too


def test_backup__a_failed_backup_is_reported_as_not_done(backups):
    job = jobs.enqueue("backup.database", {"name": "late"})
    (backups / "late").mkdir()  # someone took the name after the job was queued
    job = run(job.pk)
    assert job.state == "failed"
    assert "already exists" in job.reason
    event = RecordedEvent.objects.get(job_id=job.pk)
    assert (event.type, event.done, event.severity) == ("backup-created", False, "error")
    assert not list(backupdir.staging_dirs(backups))


def test_purge__removes_a_finished_backups_announcements_with_it(backups):
    make_dataset(samples=2)
    backup("old")
    assert Announcement.objects.count() == 2
    Job.objects.update(finished_at=timezone.now() - timedelta(days=60))
    assert run(jobs.enqueue("durable.purge", {"older_than": "30d"}).pk).state == "completed"
    assert not Job.objects.filter(operation="backup.database").exists()
    assert not Announcement.objects.exists()


def test_backup__an_unusable_backup_directory_pauses_the_job(tmp_path, settings):
    settings.DURABLE_BACKUP_DIR = tmp_path / "not-mounted" / "backups"
    job = run(jobs.enqueue("backup.database", {"name": "x"}).pk)
    assert (job.state, job.error_code, job.attempts) == ("paused", "unavailable", 0)
    assert "not-mounted/backups cannot be created" in job.reason


# --- input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "data", "field"),
    [
        ("backup.database", {"name": "../escape"}, "name"),
        ("backup.database", {"name": ".hidden"}, "name"),
        ("backup.database", {"name": "a/b"}, "name"),
        ("backup.database", {"database": "nope"}, "database"),
        ("backup.database", {"batch_size": 0}, "batch_size"),
        ("backup.database", {"batch_size": True}, "batch_size"),
        ("backup.database", {"exclude": ["no_such_app"]}, "exclude"),
        ("backup.database", {"exclude": ["auth.nosuchmodel"]}, "exclude"),
        ("backup.database", {"tables": ["auth"]}, "tables"),
        ("restore.database", {}, "name"),
        ("restore.database", {"name": "never-made"}, "name"),
        ("restore.database", {"name": "x", "replace": "yes"}, "replace"),
    ],
)
def test_input__precise_refusals(backups, operation, data, field):
    (backups / "x").mkdir()
    with pytest.raises(InputRejected) as refused:
        jobs.enqueue(operation, data)
    assert refused.value.field == field


def test_input__a_taken_backup_name_is_refused(backups):
    (backups / "taken").mkdir()
    with pytest.raises(InputRejected, match="already exists"):
        jobs.enqueue("backup.database", {"name": "taken"})


def test_forms__cleaned_data_is_the_job_input(backups):
    form = BackupForm(
        data={
            "database": "default",
            "name": "",
            "batch_size": "",
            "exclude": "sessions, auth.group",
        }
    )
    assert form.is_valid(), form.errors
    job = jobs.enqueue("backup.database", form.cleaned_data)
    assert job.input["exclude"] == ["auth.group", "sessions"]
    assert job.input["batch_size"] == 1000
    assert not BackupForm(data={"database": "default", "exclude": "nope"}).is_valid()
    (backups / "made").mkdir()
    (backups / "made" / SUMS).write_text("")
    restore_form = RestoreForm(data={"name": "made", "database": "default"})
    assert restore_form.is_valid(), restore_form.errors
    assert jobs.enqueue("restore.database", restore_form.cleaned_data).input["replace"] is False


# --- commands -------------------------------------------------------------------------------


@committed
def test_commands__backup_and_restore_inline(backups, capsys):
    make_dataset(samples=3)
    expected = contents("default")
    call_command(
        "backup_database", "--name", "cli", "--inline", "--exclude", ",".join(TEST_EXCLUDE)
    )
    out = capsys.readouterr().out
    assert "backup cli published and verified" in out
    Sample.objects.all().delete()
    call_command("restore_database", "cli", "--replace", "--inline", *_excludes())
    out = capsys.readouterr().out
    assert "every table's digest matches the backup" in out
    assert contents("default") == expected


@committed
def test_commands__restore_of_a_damaged_backup_fails_the_command(backups):
    make_dataset(samples=3)
    call_command("backup_database", "--name", "bad", "--inline", *_excludes())
    (backups / "bad" / MANIFEST).unlink()
    with pytest.raises(CommandError, match=r"manifest\.json is missing"):
        call_command("restore_database", "bad", "--inline", *_excludes())


@committed
def test_commands__wait_follows_a_worker(backups, workers, capsys):
    make_dataset(samples=3)
    worker = workers.start(lease=LEASE, env={"DURABLE_BACKUP_DIR": str(backups)})
    call_command("backup_database", "--name", "waited", "--wait", *_excludes())
    assert "backup waited published and verified" in capsys.readouterr().out
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


@committed
def test_commands__ctrl_c_leaves_an_inline_job_to_continue_where_it_stopped(backups, workers):
    make_dataset(samples=3)
    env = workers.env(faults="after_checkpoint:2:stop", DURABLE_BACKUP_DIR=str(backups))
    command = [sys.executable, "manage.py", "backup_database", "--name", "nightly", "--inline"]
    first = subprocess.Popen(
        [*command, *_excludes()], cwd=BASE_DIR, env=env, stdout=PIPE, stderr=STDOUT, text=True
    )
    try:
        wait_until(lambda: proc_state(first.pid) == "T")  # two units done
        job = Job.objects.get(input__name="nightly")
        with transaction.atomic():
            # Hold the job's row: the worker thread cannot commit another unit until the
            # command has taken the Ctrl-C, so the test does not race it.
            Job.objects.select_for_update().get(pk=job.pk)
            os.kill(first.pid, signal.SIGINT)  # Ctrl-C, delivered when it continues
            os.kill(first.pid, signal.SIGCONT)
            early = read_until(first, "interrupted: stopping at the next unit boundary")
        out, _ = first.communicate(timeout=60)
        out = early + out
    finally:
        first.kill()
        first.stdout.close()
    assert first.returncode == 1, out
    assert "continues from its checkpoint when run again" in out
    job.refresh_from_db()
    assert (job.state, job.lease_owner) == ("queued", None)
    # Stopped at the boundary it reached first: right away, or after the unit it had begun.
    assert job.units_done in (2, 3)
    assert job.units_done < job.units_total
    assert job.attempts == 0

    env["DURABLE_FAULTS"] = ""
    again = subprocess.run(
        [*command, *_excludes()], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"job {job.pk} is already doing this" in again.stdout
    assert "backup nightly published and verified" in again.stdout
    job.refresh_from_db()
    assert job.state == "completed"
    assert Job.objects.filter(operation="backup.database").count() == 1


def read_until(proc: subprocess.Popen, text: str, timeout: float = 30.0) -> str:
    """Read the process's output until it contains ``text``; return all that was read.

    Raw reads of the pipe, not ``readline``: a text file object reads ahead, and
    ``select`` on the pipe cannot see lines already waiting in its buffer.
    """
    fd, data = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
            if text in data.decode(errors="replace"):
                return data.decode(errors="replace")
    pytest.fail(
        f"{text!r} not seen within {timeout}s; output so far:\n{data.decode(errors='replace')}"
    )


def _excludes() -> list[str]:
    return [arg for label in TEST_EXCLUDE for arg in ("--exclude", label)]


@using("other", "lite")
def test_alias_urls_reach_the_test_databases():
    # The worker subprocesses depend on it.
    for alias in ("other", "lite"):
        assert connections[alias].settings_dict["NAME"] in alias_url(alias)


def test_restore__never_rewrites_the_recovery_history(backups):
    """The recovery app's tables are backed up, but a restore leaves them as they are."""
    from recovery.models import RecoveryEvent
    from recovery.records import record_event

    make_dataset()
    record_event("corruption-detected", detail="found before the backup", severity="error")
    job = run(
        jobs.enqueue(
            "backup.database",
            {"name": "with-history", "exclude": ["opsapp.recordedevent", "testapp.sideeffect"]},
        ).pk
    )
    assert job.state == "completed", job.reason
    tables = json.loads((backups / "with-history" / MANIFEST).read_text())["tables"]
    assert "recovery.recoveryevent" in {t["model"] for t in tables}
    record_event("manual-required", detail="recorded after the backup", severity="warning")

    job = run(jobs.enqueue("restore.database", {"name": "with-history", "replace": True}).pk)

    assert job.state == "completed", job.reason
    assert "recovery" in job.input["exclude"]
    details = set(RecoveryEvent.objects.values_list("detail", flat=True))
    assert "recorded after the backup" in details  # not wiped by the replace
    assert "found before the backup" in details
