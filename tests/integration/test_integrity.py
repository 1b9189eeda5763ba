"""integrity.scan beyond the shared scenario: database checks, real SQLite corruption, scopes.

Jobs run in the test's own transaction (on-commit signals captured) unless a
real file must be corrupted under a closed connection or a command thread must
see the rows (``transaction=True``).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import TestCase
from django.utils import timezone

from durable import jobs
from durable.builtin.integrity import ScanForm
from durable.builtin.models import IntegrityScope, InventoryEntry
from durable.errors import InputRejected
from durable.lease import claim
from durable.management.commands.integrity_scan import scan_summary
from durable.operations import JobContext, get_operation
from durable.worker import Worker
from tests.opsapp.models import RecordedEvent, Sample

from .helpers import drain
from .opscenarios import FILES, corrupt_in_place, write_files

PG = os.environ.get("DATABASE_URL", "").startswith("postgres")
pytestmark = pytest.mark.django_db


@pytest.fixture
def scan_root(tmp_path: Path, settings) -> Path:
    root = tmp_path / "scan"
    root.mkdir()
    settings.STORAGES = {
        **settings.STORAGES,
        "scan": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(root)},
        },
    }
    return root


def run(job_id: int):
    with TestCase.captureOnCommitCallbacks(execute=True):  # the engine's on-commit signals
        return drain(job_id, timeout=60)


def scan(**data):
    return run(jobs.enqueue("integrity.scan", data).pk)


def sent(job) -> list[tuple[str, str]]:
    return sorted(RecordedEvent.objects.filter(job_id=job.pk).values_list("type", "severity"))


# --- databases ------------------------------------------------------------------------------


def table_units(job) -> dict[str, dict]:
    """Each table's own unit (``table:<name>``), without its page ranges."""
    found = job.unit_results.filter(key__startswith="table:").values_list("key", "result")
    return {key: result for key, result in found if key.count(":") == 1}


def test_database__every_table_is_checked_and_a_clean_database_is_ok():
    job = scan(target="database")
    assert job.state == "completed", job.reason
    tables = connections["default"].introspection.table_names()
    checked = table_units(job)
    assert len(checked) == len(tables)
    method = "PRAGMA quick_check" if connections["default"].vendor == "sqlite" else "full read"
    all_units = job.unit_results.filter(key__startswith="table:").values_list("result", flat=True)
    assert {r["method"] for r in all_units} == {method}
    assert sent(job) == [("integrity-ok", "info")]
    assert f"{len(tables)} tables" in RecordedEvent.objects.get(job_id=job.pk).detail
    assert job.units_done == job.units_total


@pytest.mark.skipif(not PG, reason="page ranges are PostgreSQL's")
def test_database__a_big_table_is_read_in_bounded_page_ranges(monkeypatch):
    Sample.objects.bulk_create(Sample(name="x" * 90, text="y" * 600) for _ in range(300))
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_relation_size('opsapp_sample') / 8192")
        blocks = cursor.fetchone()[0]
    assert blocks >= 3
    monkeypatch.setattr("durable.builtin.integrity.BLOCKS_PER_UNIT", 2)
    job = scan(target="database")
    assert job.state == "completed", job.reason
    ranges = dict(job.unit_results.filter(key__startswith="table:opsapp_sample:")
                  .values_list("key", "result"))  # fmt: skip
    assert sorted(ranges, key=lambda k: int(k.rsplit(":", 1)[1])) == [
        f"table:opsapp_sample:{first}" for first in range(0, blocks, 2)
    ]
    assert ranges["table:opsapp_sample:0"]["pages"] == [0, 2]
    assert all(r["problems"] == [] for r in ranges.values())
    assert job.units_done == job.units_total
    assert sent(job) == [("integrity-ok", "info")]


@pytest.mark.skipif(not PG, reason="amcheck is a PostgreSQL extension")
def test_database__uses_amcheck_when_it_is_installed():
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'amcheck'")
        if cursor.fetchone() is None:
            pytest.skip("amcheck is not available on this server")
        cursor.execute("CREATE EXTENSION IF NOT EXISTS amcheck")  # rolled back with the test
    job = scan(target="database")
    assert job.state == "completed", job.reason
    results = job.unit_results.filter(key__startswith="table:").values_list("result", flat=True)
    assert {r["method"] for r in results} == {"amcheck"}  # pages (verify_heapam) and indexes
    assert all(r["problems"] == [] for r in results)
    assert sent(job) == [("integrity-ok", "info")]


@pytest.mark.skipif(PG, reason="corrupts a SQLite file")
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_database__real_sqlite_corruption_is_detected_and_reported_once():
    # transaction=True: the "other" database file is corrupted while no connection
    # (and no test transaction) holds it, and restored afterwards.
    path = Path(connections["other"].settings_dict["NAME"])
    connections["other"].close()
    pristine = path.with_name(path.name + ".pristine")
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    shutil.copyfile(path, pristine)
    try:
        raw.execute("CREATE TABLE rotting (id INTEGER PRIMARY KEY, v TEXT)")
        raw.execute("CREATE INDEX rotting_v ON rotting (v)")
        raw.executemany(
            "INSERT INTO rotting (v) VALUES (?)", [(f"value {n:05d}",) for n in range(3000)]
        )
        raw.commit()
        page_size = raw.execute("PRAGMA page_size").fetchone()[0]
        root = raw.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'rotting_v'"
        ).fetchone()[0]
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        raw.close()
        with open(path, "r+b") as handle:  # the index's root page rots away
            handle.seek((root - 1) * page_size)
            handle.write(os.urandom(page_size))
        job = run(jobs.enqueue("integrity.scan", {"target": "database", "database": "other"}).pk)
        assert job.state == "completed", job.reason
        [event] = RecordedEvent.objects.filter(job_id=job.pk)
        assert (event.type, event.severity, event.object_ids) == (
            "corruption-detected",
            "error",
            ["rotting"],
        )
        assert "PRAGMA quick_check" in event.detail
        result = job.unit_results.get(key="table:rotting").result
        assert result["problems"]
        others = {k: r for k, r in table_units(job).items() if k != "table:rotting"}
        assert all(r["problems"] == [] for r in others.values())
        assert IntegrityScope.objects.get(scope="database:other").tallies["corrupted"] == 1
    finally:
        connections["other"].close()
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        shutil.move(pristine, path)


# --- storages -------------------------------------------------------------------------------


def test_storage__first_scan_records_a_baseline_and_reports_ok(scan_root):
    write_files(scan_root, FILES)
    job = scan(storage="scan", batch_files=4)
    assert job.state == "completed", job.reason
    assert InventoryEntry.objects.filter(scope="storage:scan:", status="new").count() == len(FILES)
    assert sent(job) == [("integrity-ok", "info")]
    assert f"{len(FILES)} new files" in RecordedEvent.objects.get(job_id=job.pk).detail
    again = scan(storage="scan", batch_files=4)
    assert sent(again) == [("integrity-ok", "info")]
    assert InventoryEntry.objects.filter(scope="storage:scan:", status="ok").count() == len(FILES)


def test_storage__the_total_counts_batches_cut_short_by_the_byte_limit(scan_root):
    """Long names fill a unit's payload before batch_files do: the estimate knows it."""
    names = {"d" * 200 + f"/{n:03d}-" + "n" * 236: b"x" for n in range(400)}  # 441 characters
    write_files(scan_root, names)
    job = jobs.enqueue("integrity.scan", {"storage": "scan"})  # 200 files per batch at most
    op = get_operation("integrity.scan")
    ctx = JobContext(job_id=job.pk, operation=job.operation, input=job.input, checkpoint=None,
                     attempt=1, worker_id="w", lease_epoch=1)  # fmt: skip
    estimate = op.total_units(ctx)
    job = run(job.pk)
    assert job.state == "completed", job.reason
    results = job.unit_results.filter(key__startswith="files:")
    sizes = [result["checked"] for result in results.values_list("result", flat=True)]
    # At most 111 names a unit (the byte limit cuts before batch_files, 200): the estimate
    # counts 4 units. Paced units (durable.pacing) start smaller, so there are more; the
    # last unit makes the total exact.
    assert estimate == 4 + 3
    assert len(sizes) >= 4
    assert sum(sizes) == 400
    assert max(sizes) <= 111
    assert job.units_total == job.units_done == len(sizes) + 3


def test_storage__a_corrupted_file_is_reported_until_its_bytes_are_back(scan_root):
    write_files(scan_root, FILES)
    scan(storage="scan")
    good = InventoryEntry.objects.get(key="b/corrupt.bin").sha256
    pristine = (scan_root / "b/corrupt.bin").read_bytes()
    corrupt_in_place(scan_root / "b/corrupt.bin")
    for _ in range(2):  # the damage does not become the baseline: reported again
        job = scan(storage="scan")
        assert sent(job) == [("corruption-detected", "error")]
        entry = InventoryEntry.objects.get(key="b/corrupt.bin")
        assert (entry.status, entry.sha256) == ("corrupted", good)
        assert IntegrityScope.objects.get(scope="storage:scan:").tallies["corrupted"] == 1
    stat = (scan_root / "b/corrupt.bin").stat()
    (scan_root / "b/corrupt.bin").write_bytes(pristine)  # restored from a backup
    os.utime(scan_root / "b/corrupt.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert sent(scan(storage="scan")) == [("integrity-ok", "info")]
    assert InventoryEntry.objects.get(key="b/corrupt.bin").status == "ok"


def test_storage__touching_a_corrupted_file_accepts_its_bytes(scan_root):
    """The documented acknowledgement: a rewrite (moved mtime) is a modification, once."""
    write_files(scan_root, FILES)
    scan(storage="scan")
    corrupt_in_place(scan_root / "b/corrupt.bin")
    assert sent(scan(storage="scan")) == [("corruption-detected", "error")]
    os.utime(scan_root / "b/corrupt.bin", (1_800_000_000, 1_800_000_000))
    assert sent(scan(storage="scan")) == [("corruption-detected", "warning")]  # modified
    assert sent(scan(storage="scan")) == [("integrity-ok", "info")]


def test_storage__names_that_are_not_utf8_are_skipped_and_counted(scan_root):
    write_files(scan_root, {"ok.txt": b"fine"})
    with open(os.path.join(os.fsencode(scan_root), b"caf\xe9.txt"), "wb") as handle:
        handle.write(b"latin-1 name")
    job = scan(storage="scan")
    assert job.state == "completed", job.reason
    assert job.unit_results.get(key="files:0").result == {"checked": 1, "findings": 0, "skipped": 1}
    assert list(InventoryEntry.objects.values_list("key", flat=True)) == ["ok.txt"]


def test_storage__a_missing_file_that_comes_back_is_compared_with_what_it_was(scan_root):
    write_files(scan_root, FILES)
    scan(storage="scan")
    moved = scan_root / "b" / "gone.txt"
    moved.rename(scan_root.parent / "aside")
    missing = scan(storage="scan")
    assert sent(missing) == [("corruption-detected", "warning")]
    (scan_root.parent / "aside").rename(moved)
    back = scan(storage="scan")
    assert sent(back) == [("integrity-ok", "info")]
    assert InventoryEntry.objects.get(key="b/gone.txt").status == "ok"
    # Still missing on the next scan: not reported again.
    moved.unlink()
    scan(storage="scan")
    assert sent(scan(storage="scan")) == [("integrity-ok", "info")]


def test_storage__an_absent_root_pauses_the_scan_instead_of_reporting_everything_missing(
    scan_root,
):
    write_files(scan_root, FILES)
    scan(storage="scan")
    shutil.rmtree(scan_root)  # an unmounted volume
    job = scan(storage="scan")
    assert (job.state, job.error_code, job.attempts) == ("paused", "unavailable", 0)
    assert "does not exist (not mounted?)" in job.reason
    assert not InventoryEntry.objects.filter(status="missing").exists()


def test_scope__a_second_scan_of_the_same_scope_waits_for_the_first(scan_root):
    write_files(scan_root, FILES)
    holder = jobs.enqueue(
        "integrity.scan", {"storage": "scan"}, run_after=timezone.now() + timedelta(hours=1)
    )
    IntegrityScope.objects.create(scope="storage:scan:", job_id=holder.pk)
    # Asking again returns the unfinished scan (the operation's unique key)...
    assert jobs.enqueue("integrity.scan", {"storage": "scan"}).pk == holder.pk
    # ...and a scan that got past it (a caller's own key) waits for the scope.
    waiting = jobs.enqueue("integrity.scan", {"storage": "scan"}, unique_key="own key")
    Worker(worker_id="w").execute(
        *claim("w", queues=[], operations=["integrity.scan"], lease_seconds=30, job_id=waiting.pk)
    )
    waiting.refresh_from_db()
    assert (waiting.state, waiting.attempts) == ("queued", 0)  # no attempt spent
    assert waiting.next_attempt_at > timezone.now() + timedelta(seconds=5)
    assert f"scan {holder.pk} of storage:scan: is still running" in waiting.events.last().message
    # A different scope is not held up.
    assert scan(storage="scan", prefix="a").state == "completed"

    jobs.cancel(holder.pk)
    assert jobs.retry_now(waiting.pk).applied
    done = run(waiting.pk)
    assert done.state == "completed", done.reason
    assert IntegrityScope.objects.get(scope="storage:scan:").job_id == waiting.pk


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"target": "disk"}, "target"),
        ({"storage": "nowhere"}, "storage"),
        ({"storage": "scan", "prefix": "../etc"}, "prefix"),
        ({"storage": "scan", "prefix": 3}, "prefix"),
        ({"storage": "scan", "batch_files": 0}, "batch_files"),
        ({"target": "database", "database": "nowhere"}, "database"),
        ({"path": "/"}, "path"),
    ],
)
def test_input__precise_refusals(data, field):
    with pytest.raises(InputRejected) as refused:
        jobs.enqueue("integrity.scan", data)
    assert refused.value.field == field


def test_input__a_storage_without_a_location_is_refused(settings):
    settings.MEDIA_ROOT = ""  # FileSystemStorage would walk the current directory
    with pytest.raises(InputRejected, match="no location") as refused:
        jobs.enqueue("integrity.scan", {"storage": "default"})
    assert refused.value.field == "storage"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"target": "storage", "storage": "scan", "prefix": "/a/", "batch_files": ""},
         {"target": "storage", "storage": "scan", "prefix": "a", "batch_files": 200}),
        ({"target": "database", "database": "default", "storage": "", "batch_files": ""},
         {"target": "database", "database": "default"}),
    ],
)  # fmt: skip
def test_form__cleaned_data_is_the_job_input(scan_root, data, expected):
    form = ScanForm(data=data)
    assert form.is_valid(), form.errors
    assert jobs.enqueue("integrity.scan", form.cleaned_data).input == expected


@pytest.mark.django_db(transaction=True)
def test_command__integrity_scan_inline(scan_root, capsys):
    # transaction=True: --inline runs the job in a thread with its own connection.
    write_files(scan_root, FILES)
    call_command("integrity_scan", "--storage", "scan", "--prefix", "/a/", "--inline")
    out = capsys.readouterr().out
    assert "scanned storage:scan:a: 3 checked, 3 new" in out


@pytest.mark.django_db(transaction=True)
def test_command__a_database_scan_says_how_many_tables_it_checked(capsys):
    # transaction=True: --inline runs the job in a thread with its own connection.
    # It printed "nothing to check" while its integrity-ok event said it checked 41 tables.
    call_command("integrity_scan", "--database", "default", "--inline")
    out = capsys.readouterr().out
    tables = len(connections["default"].introspection.table_names())
    assert f"scanned database:default: {tables} tables checked, no problems" in out
    assert "nothing to check" not in out


@pytest.mark.parametrize(
    ("data", "tallies", "expected"),
    [
        # A database scan: its tallies count tables with problems; "tables" says how many.
        ({"target": "database", "database": "x"}, {"tables": 3, "corrupted": 0},
         "scanned database:x: 3 tables checked, no problems"),
        ({"target": "database", "database": "x"}, {"tables": 3, "corrupted": 1},
         "scanned database:x: 3 tables checked, 1 with problems"),
        ({"target": "database", "database": "x"}, {"corrupted": 0},
         "scanned database:x: nothing to check"),  # no table at all
        ({"target": "storage", "storage": "s", "prefix": ""}, {"checked": 2, "new": 2},
         "scanned storage:s:: 2 checked, 2 new"),
        ({"target": "storage", "storage": "s", "prefix": ""}, {"checked": 0},
         "scanned storage:s:: nothing to check"),
    ],
)  # fmt: skip
def test_summary__says_what_was_checked(data, tallies, expected):
    assert scan_summary(data, tallies) == expected
