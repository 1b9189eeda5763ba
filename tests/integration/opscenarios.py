"""One scenario per built-in database operation, for the shared tests of the guarantees.

A scenario builds its data, returns the job inputs, and checks a finished job
thoroughly: the output is right *and* nothing happened twice (events, rows,
files). The tests in ``test_builtin_ops.py`` run every scenario through the
same crashes, reclaims, pauses and cancels.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from durable import jobs, rescue
from durable.builtin import backupdir
from durable.builtin.models import IntegrityScope, InventoryEntry
from durable.lease import claim
from durable.models import Job
from durable.operations import JobContext
from tests.opsapp.models import RecordedEvent, Sample

from .dataset import TEST_EXCLUDE, alias_url, backup_contents, contents, make_dataset
from .helpers import drain


@dataclass
class Env:
    """Where a test's backups and scanned files live, and the environment workers need."""

    tmp: Path
    backups: Path
    scan_root: Path

    def worker_env(self) -> dict[str, str]:
        # Every second database's URL: a worker must reach the test databases, never
        # the development ones (unused aliases just point at an idle test database).
        env = {"DURABLE_BACKUP_DIR": str(self.backups), "TEST_SCAN_ROOT": str(self.scan_root)}
        for alias in ("other", "lite"):
            env[f"TEST_{alias.upper()}_DATABASE_URL"] = alias_url(alias)
        return env


@dataclass
class Case:
    input: dict[str, Any]
    check: Callable[[Job], None]
    check_cancelled: Callable[[Job], None] = field(default=lambda job: None)


def proc_state(pid: int) -> str:
    """A process's state letter: "T" once a "…:stop" fault point stopped it."""
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def stale_and_fresh(job) -> tuple[JobContext, JobContext]:
    """Contexts of a worker whose lease expired and was reclaimed, and of the new holder."""
    ops = [job.operation]
    stale, _ = claim("stale", queues=[], operations=ops, lease_seconds=30, job_id=job.pk)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert rescue.reclaim("rescuer") == [job.pk]
    fresh, claimed = claim("fresh", queues=[], operations=ops, lease_seconds=30, job_id=job.pk)
    ctx = JobContext(
        job_id=job.pk,
        operation=job.operation,
        input=claimed.input,
        checkpoint=None,
        attempt=1,
        worker_id="stale",
        lease_epoch=stale.epoch,
    )
    return ctx, dataclasses.replace(ctx, worker_id="fresh", lease_epoch=fresh.epoch)


def new_rows_get_fresh_ids(alias: str) -> bool:
    """A new row gets an id past every id written explicitly (PostgreSQL: the sequence moved).

    Rolled back, so a check can run twice.
    """
    with transaction.atomic(using=alias):
        highest = Sample.objects.using(alias).order_by("-pk").values_list("pk", flat=True)[0]
        created = Sample.objects.using(alias).create(name="after the restore or copy")
        transaction.set_rollback(True, using=alias)
    return created.pk > highest


def rescue_restarts_announce_nothing_new(job: Job) -> None:
    from durable.builtin.restore import on_worker_started

    before = events(job)
    on_worker_started(sender="test")
    assert events(job) == before


def events(job: Job) -> Counter:
    return Counter(RecordedEvent.objects.filter(job_id=job.pk).values_list("type", "done"))


class Scenario:
    operation = ""
    name = ""  # the test id, when one operation has two scenarios
    databases: tuple[str, ...] = ("default",)
    # Crash points after a side effect: the 3rd unit for every operation, plus
    # the operation's own delicate moment.
    crash_points: tuple[str, ...] = ("after_unit:3",)

    def cases(self, env: Env, count: int = 1) -> list[Case]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name or self.operation


class BackupScenario(Scenario):
    operation = "backup.database"
    # Between the rename that publishes the backup and the backup-created event;
    # with that event written but its transaction not committed; right after the
    # commit (the unit not yet checkpointed).
    crash_points = (
        "after_unit:3", "backup.after_publish:1", "announce.before_commit:1", "announced:1",
    )  # fmt: skip

    def cases(self, env: Env, count: int = 1) -> list[Case]:
        make_dataset()
        expected = contents("default")
        return [self._case(env, f"b{n}", expected) for n in range(count)]

    def _case(self, env: Env, name: str, expected: dict) -> Case:
        def check(job: Job) -> None:
            assert job.state == "completed", job.reason
            path = env.backups / name
            backupdir.verify(path)  # raises if anything is off
            assert backup_contents(path) == expected
            assert events(job) == {("backup-created", True): 1, ("backup-verified", True): 1}
            assert not list(backupdir.staging_dirs(env.backups))

        def check_cancelled(job: Job) -> None:
            assert not (env.backups / name).exists()  # never published half-made
            assert not events(job)
            # The next backup clears the cancelled one's staging directory.
            again = drain(jobs.enqueue(self.operation, {"name": "after"}).pk, timeout=60)
            assert again.state == "completed", again.reason
            assert not list(backupdir.staging_dirs(env.backups))

        return Case(
            {"name": name, "batch_size": 5, "exclude": TEST_EXCLUDE}, check, check_cancelled
        )


class RestoreScenario(Scenario):
    operation = "restore.database"
    databases = ("default", "other")
    # Right after the unit that deletes the current rows; before and after the
    # transaction that records restore-backup commits.
    crash_points = ("after_unit:3", "after_unit:2", "announce.before_commit:1", "announced:1")

    def cases(self, env: Env, count: int = 1) -> list[Case]:
        make_dataset()
        expected = contents("default")
        backup = jobs.enqueue(
            "backup.database", {"name": "base", "batch_size": 4, "exclude": TEST_EXCLUDE}
        )
        assert drain(backup.pk, timeout=60).state == "completed"
        # The site moves on after the backup: rows deleted, changed and added.
        Sample.objects.filter(pk__in=Sample.objects.order_by("pk").values("pk")[:3]).delete()
        Sample.objects.update(name="changed after the backup", data={"after": True})
        Sample.objects.create(name="created after the backup")
        aliases = ["default", "other"][:count]
        return [self._case(alias, expected) for alias in aliases]

    def _case(self, alias: str, expected: dict) -> Case:
        def check(job: Job) -> None:
            assert job.state == "completed", job.reason
            assert contents(alias) == expected
            assert events(job) == {("restore-backup", True): 1}
            assert new_rows_get_fresh_ids(alias)

        def check_cancelled(job: Job) -> None:
            # Cancelled after its "clear" unit: the tables are empty, and Problems →
            # Recovery says so, once, with what to run to finish.
            assert job.units_done >= 2  # verify, clear
            assert events(job) == {("restore-backup", False): 1}
            event = RecordedEvent.objects.get(job_id=job.pk)
            assert (event.severity, event.deleted_data, event.db) == ("error", True, alias)
            assert f"into database {alias!r} (job {job.pk}) was cancelled" in event.detail
            assert "after it deleted the current rows" in event.detail
            assert f"restore_database base --replace --database {alias}" in event.detail
            assert "opsapp.sample" in event.detail  # an emptied table, by name
            # A worker starting later (the catch-up for a lost announcement) adds nothing.
            rescue_restarts_announce_nothing_new(job)

        return Case(
            {"name": "base", "database": alias, "replace": True, "exclude": TEST_EXCLUDE},
            check,
            check_cancelled,
        )


class CopyScenario(Scenario):
    operation = "db.copy"
    databases = ("default", "other", "lite")
    # Right after the unit that empties the target's tables.
    crash_points = ("after_unit:3", "after_unit:1")

    def cases(self, env: Env, count: int = 1) -> list[Case]:
        make_dataset()
        return [self._case(target) for target in ["other", "lite"][:count]]

    def _case(self, target: str) -> Case:
        def check_cancelled(job: Job) -> None:
            # Stopped after emptying the target and copying a batch: what is there is
            # right, row for row; nothing was verified, so nothing claims it is complete.
            assert job.units_done >= 2
            assert not job.unit_results.filter(key__startswith="verified:").exists()
            source, partial = contents("default"), contents(target)
            for label, rows in partial.items():
                assert all(row in source[label] for row in rows), label
            assert partial != source
            # The target is not stuck: the next copy (replace) makes it whole.
            again = drain(jobs.enqueue(self.operation, job.input).pk, timeout=120)
            assert again.state == "completed", again.reason
            assert contents(target) == source

        def check(job: Job) -> None:
            assert job.state == "completed", job.reason
            assert contents(target) == contents("default")
            verified = job.unit_results.filter(key__startswith="verified:").count()
            assert verified == len(contents("default"))
            assert job.unit_results.filter(key__startswith="verify:").count() > verified
            assert new_rows_get_fresh_ids(target)

        return Case(
            {"target": target, "replace": True, "batch_size": 5, "exclude": TEST_EXCLUDE},
            check,
            check_cancelled,
        )


# Files of the scanned storage: 13 files, 5 batches of 3. The findings sit in the
# second batch (the 3rd unit), so "after_unit:3" crashes right after a batch whose
# transaction recorded findings and announced them.
FILES = {
    "a/1.txt": b"one",
    "a/2.txt": b"two",
    "a/3.txt": b"three",
    "b/corrupt.bin": b"x" * 64,
    "b/gone.txt": b"soon missing",
    "b/rewritten.txt": b"old",
    "c/d/deep.txt": b"deep",
    "c/e.txt": b"e",
    "c/f.txt": b"f",
    "g.txt": b"g",
    "h.txt": b"h",
    "i.txt": b"i",
    "j.txt": b"j",
}


def write_files(root: Path, files: dict[str, bytes], mtime: float = 1_700_000_000.0) -> None:
    for key, data in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (mtime, mtime))


def corrupt_in_place(path: Path, offset: int = 7) -> None:
    """Flip one byte without changing the size or the modification time (bit rot)."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


class ScanScenario(Scenario):
    operation = "integrity.scan"
    # 13 files in 5 batches: begin(1), 5 batches (2-6), sweep (7), report (8); and
    # inside the batch's transaction, right after it wrote its corruption-detected event.
    crash_points = ("after_unit:3", "after_unit:7", "announce.before_commit:1", "announced:1")

    def cases(self, env: Env, count: int = 1) -> list[Case]:
        prefixes = ["p0", "p1", "p2"][:count]
        for prefix in prefixes:
            write_files(env.scan_root / prefix, FILES)
            baseline = jobs.enqueue(self.operation, {"storage": "scan", "prefix": prefix})
            assert drain(baseline.pk, timeout=60).state == "completed"
            root = env.scan_root / prefix
            corrupt_in_place(root / "b/corrupt.bin")
            (root / "b/gone.txt").unlink()
            (root / "b/rewritten.txt").write_bytes(b"new and longer")
            write_files(root, {"k-new.txt": b"new file"})
        return [self._case(prefix) for prefix in prefixes]

    def _case(self, prefix: str) -> Case:
        scope = f"storage:scan:{prefix}"

        def check(job: Job) -> None:
            assert job.state == "completed", job.reason
            found = RecordedEvent.objects.filter(job_id=job.pk, type="corruption-detected")
            reported = Counter(key for event in found for key in event.object_ids)
            assert reported == {
                f"{prefix}/b/corrupt.bin": 1,
                f"{prefix}/b/rewritten.txt": 1,
                f"{prefix}/b/gone.txt": 1,
            }
            assert "error" in {event.severity for event in found}  # the corruption
            assert not RecordedEvent.objects.filter(job_id=job.pk, type="integrity-ok").exists()
            statuses = dict(InventoryEntry.objects.filter(scope=scope).values_list("key", "status"))
            assert statuses[f"{prefix}/b/corrupt.bin"] == "corrupted"
            assert statuses[f"{prefix}/b/rewritten.txt"] == "modified"
            assert statuses[f"{prefix}/b/gone.txt"] == "missing"
            assert statuses[f"{prefix}/k-new.txt"] == "new"
            assert Counter(statuses.values())["ok"] == 10
            tallies = IntegrityScope.objects.get(scope=scope).tallies
            assert tallies == {
                "checked": 13, "new": 1, "ok": 10, "modified": 1, "corrupted": 1, "missing": 1,
            }  # fmt: skip

        def check_cancelled(job: Job) -> None:
            # The scope is free again: the next scan starts at once.
            again = drain(
                jobs.enqueue(self.operation, {"storage": "scan", "prefix": prefix}).pk, timeout=60
            )
            assert again.state == "completed", again.reason
            assert again.attempts == 0

        return Case({"storage": "scan", "prefix": prefix, "batch_files": 3}, check, check_cancelled)


class DatabaseScanScenario(Scenario):
    """integrity.scan of a database: every table checked, one report, the scope released."""

    operation = "integrity.scan"
    name = "integrity.scan-database"
    databases = ("default", "other")
    # A unit of the table checks; inside and right after the report's transaction.
    crash_points = ("after_unit:3", "announce.before_commit:1", "announced:1")

    def cases(self, env: Env, count: int = 1) -> list[Case]:
        make_dataset()
        return [self._case(alias) for alias in ["default", "other"][:count]]

    def _case(self, alias: str) -> Case:
        scope = f"database:{alias}"

        def check(job: Job) -> None:
            assert job.state == "completed", job.reason
            assert events(job) == {("integrity-ok", True): 1}
            tables = set(connections[alias].introspection.table_names())
            checked = {
                key.split(":", 1)[1]
                for key in job.unit_results.filter(key__startswith="table:").values_list(
                    "key", flat=True
                )
                if key.count(":") == 1
            }
            assert checked == tables  # every table, once
            results = job.unit_results.filter(key__startswith="table:")
            assert all(r["problems"] == [] for r in results.values_list("result", flat=True))
            row = IntegrityScope.objects.get(scope=scope)
            assert (row.job_id, row.tallies["corrupted"]) == (job.pk, 0)
            assert row.finished_at is not None

        def check_cancelled(job: Job) -> None:
            assert not events(job)  # no report for a scan that did not finish
            # The scope is free again: the next scan starts at once and completes.
            again = drain(jobs.enqueue(self.operation, job.input).pk, timeout=120)
            assert again.state == "completed", again.reason
            assert (again.attempts, events(again)) == (0, {("integrity-ok", True): 1})

        return Case({"target": "database", "database": alias}, check, check_cancelled)


SCENARIOS = [
    BackupScenario(), RestoreScenario(), CopyScenario(), ScanScenario(), DatabaseScanScenario(),
]  # fmt: skip
