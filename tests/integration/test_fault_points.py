"""Every built-in operation, killed at every fault point it passes and at random moments.

For each operation a crash-free run (traced as ``DURABLE_FAULTS_TRACE`` does)
gives the reference result and the list of fault points the operation passes
(the engine's and the operation's own: ``backup.after_publish``,
``announce.before_commit``, ``files.after_copy``…). Then jobs of the same
operation are run by a chain of real workers: each is SIGKILLed at the next
fault point not yet tried (its first arrival there), a few more at random
moments, and the last one finishes the job. Every finished job's result must
equal the crash-free one — rows, files, Recovery events exactly once.

One setup per operation and one job for many kills keep this within the test
budget; ``bench/soak.py`` runs the long random-kill loops. The chained jobs get
a large ``max_attempts``: what is under test here is resuming, not the attempt
policy (issue 11 decides what a death after progress costs).

``transaction=True``: the workers are other processes.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from durable import faults, jobs
from durable.builtin import backupdir
from durable.builtin.models import IntegrityScope, InventoryEntry
from durable.models import Job
from recovery.models import RecoveryEvent
from tests.opsapp.models import RecordedEvent, Sample

from .dataset import TEST_EXCLUDE, backup_contents, contents, make_dataset
from .helpers import drain
from .opscenarios import FILES as SCAN_FILES
from .opscenarios import Env, corrupt_in_place, new_rows_get_fresh_ids, write_files
from .test_derived_tables import NOISE, add_events, counted, recount

PG = os.environ.get("DATABASE_URL", "").startswith("postgres")
LEASE = 10.0
ATTEMPTS = 100
RANDOM_KILLS = int(os.environ.get("FAULT_POINTS_RANDOM_KILLS", "1"))
SEED = int(os.environ.get("FAULT_POINTS_SEED", "0")) or random.randrange(1, 10**6)
pytestmark = pytest.mark.slow


def events(job: Job) -> Counter:
    """The Recovery facts the job established (what the event recorder received)."""
    return Counter(RecordedEvent.objects.filter(job_id=job.pk).values_list("type", "done"))


def tree(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --- the operations ------------------------------------------------------------------------


class Trial:
    """One operation: its data, the input of its n-th job, and the result to compare."""

    operation = ""
    id = ""
    databases: tuple[str, ...] = ("default",)
    # The crash-free run in the test's process (a worker start saved) unless the
    # operation opens connections of its own, which pytest-django forbids.
    in_process = True

    def setup(self, env: Env) -> None:
        pass

    def input(self, env: Env, n: int) -> dict[str, Any]:
        raise NotImplementedError

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        raise NotImplementedError


class BackupTrial(Trial):
    operation = "backup.database"

    def __init__(self, snapshot: bool) -> None:
        self.snapshot = snapshot
        self.in_process = not snapshot  # the snapshot is read through an alias of its own
        self.id = "backup.database-snapshot" if snapshot else "backup.database"

    def setup(self, env: Env) -> None:
        make_dataset()

    def input(self, env: Env, n: int) -> dict[str, Any]:
        return {"name": f"b{n}", "batch_size": 5, "exclude": TEST_EXCLUDE,
                "snapshot": self.snapshot}  # fmt: skip

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        path = env.backups / f"b{n}"
        backupdir.verify(path)
        return {
            "rows": backup_contents(path),
            "events": events(job),
            # Nothing left behind: no staging directory, no snapshot.
            "leftovers": [p.name for p, _ in backupdir.staging_dirs(env.backups)],
        }


class RestoreTrial(Trial):
    operation = "restore.database"
    id = "restore.database"

    def setup(self, env: Env) -> None:
        make_dataset()
        backup = jobs.enqueue("backup.database", {"name": "base", "batch_size": 4,
                                                  "exclude": TEST_EXCLUDE})  # fmt: skip
        assert drain(backup.pk, timeout=60).state == "completed"

    def input(self, env: Env, n: int) -> dict[str, Any]:
        # The site moves on before each restore: rows deleted, changed, added.
        Sample.objects.filter(pk__in=Sample.objects.order_by("pk").values("pk")[:2]).delete()
        Sample.objects.update(name=f"changed before restore {n}")
        Sample.objects.create(name=f"created before restore {n}")
        return {"name": "base", "replace": True, "exclude": TEST_EXCLUDE}

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        return {
            "rows": contents("default"),
            "events": events(job),
            "fresh ids": new_rows_get_fresh_ids("default"),
        }


class RestoreWithRecoveryTrial(Trial):
    """restore.database --replace of the Recovery tables too (DURABLE_RESTORE_KEEP_APPS="").

    The engine appends to the events being restored (this job's reclaims, its
    restore-backup): those rows are kept, never taken for differences, and never
    overwritten by a backup row.
    """

    operation = "restore.database"
    id = "restore.database-with-recovery"

    def setup(self, env: Env) -> None:
        make_dataset()
        add_events("default")
        backup = jobs.enqueue("backup.database", {"name": "events", "batch_size": 4,
                                                  "exclude": NOISE})  # fmt: skip
        assert drain(backup.pk, timeout=60).state == "completed"
        self.backed_up = backup_contents(env.backups / "events")

    def input(self, env: Env, n: int) -> dict[str, Any]:
        RecoveryEvent.objects.filter(pk=RecoveryEvent.objects.order_by("pk")[0].pk).delete()
        RecoveryEvent.objects.create(type="remigrate", detail=f"before restore {n}")
        Sample.objects.update(name=f"changed before restore {n}")
        return {"name": "events", "replace": True, "exclude": NOISE}

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        assert "recovery" not in job.input["exclude"]
        end = self.backed_up["recovery.recoveryevent"][-1][0]  # the backup's last event id
        restored = contents("default", NOISE)
        kept = restored.pop("recovery.recoveryevent")
        appended = RecoveryEvent.objects.filter(pk__gt=end)
        return {
            "rows": restored,
            "events": kept[: len(self.backed_up["recovery.recoveryevent"])]
            == self.backed_up["recovery.recoveryevent"],
            # After the clear: this job's restore-backup (and its reclaims, as many as it had).
            "appended": Counter(
                appended.exclude(type="job-reclaimed-after-restart").values_list("type", flat=True)
            ),
            "appended by this job": set(appended.values_list("job_id", flat=True)) == {job.pk},
            "reclaims kept": appended.filter(type="job-reclaimed-after-restart").count()
            == RecoveryEvent.objects.filter(type="job-reclaimed-after-restart").count(),
            "recorded": events(job),
            "counts rebuilt": counted("default") == recount("default"),
        }


class CopyTrial(Trial):
    """db.copy *with* the Recovery tables: events and their day counts on both sides."""

    operation = "db.copy"

    def __init__(self, source: str, target: str) -> None:
        self.source, self.target = source, target
        self.id = f"db.copy-{source}-to-{target}"
        self.databases = tuple(dict.fromkeys(["default", source, target]))

    def setup(self, env: Env) -> None:
        make_dataset(self.source)
        add_events(self.source)

    def input(self, env: Env, n: int) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "replace": True,
                "batch_size": 5, "exclude": NOISE}  # fmt: skip

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        without_events = [*NOISE, "recovery.recoveryevent"]
        return {
            "rows": contents(self.target, without_events),
            # The engine appends to the source's events (reclaims): all of them arrive.
            "events equal": contents(self.target, NOISE) == contents(self.source, NOISE),
            "counts rebuilt": counted(self.target) == recount(self.target),
            "fresh ids": new_rows_get_fresh_ids(self.target),
        }


class ScanTrial(Trial):
    """integrity.scan of a storage: each job scans its own prefix, changed since a baseline."""

    operation = "integrity.scan"
    id = "integrity.scan-storage"

    def input(self, env: Env, n: int) -> dict[str, Any]:
        prefix = f"p{n}"
        root = env.scan_root / prefix
        write_files(root, SCAN_FILES)
        baseline = jobs.enqueue(self.operation, {"storage": "scan", "prefix": prefix})
        assert drain(baseline.pk, timeout=60).state == "completed"
        corrupt_in_place(root / "b/corrupt.bin")
        (root / "b/gone.txt").unlink()
        (root / "b/rewritten.txt").write_bytes(b"new and longer")
        write_files(root, {"k-new.txt": b"new file"})
        return {"storage": "scan", "prefix": prefix, "batch_files": 3}

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        prefix = f"p{n}/"
        found = RecordedEvent.objects.filter(job_id=job.pk).order_by("pk")
        reported = Counter(
            (event.type, event.done, key.removeprefix(prefix))
            for event in found
            for key in event.object_ids or [""]
        )
        scope = f"storage:scan:p{n}"
        statuses = InventoryEntry.objects.filter(scope=scope).values_list("key", "status")
        return {
            "reported": reported,
            "statuses": sorted((key.removeprefix(prefix), status) for key, status in statuses),
            "tallies": IntegrityScope.objects.get(scope=scope).tallies,
        }


class DatabaseScanTrial(Trial):
    operation = "integrity.scan"
    id = "integrity.scan-database"

    def setup(self, env: Env) -> None:
        make_dataset()

    def input(self, env: Env, n: int) -> dict[str, Any]:
        return {"target": "database", "database": "default"}

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        results = job.unit_results.filter(key__startswith="table:")
        keys = results.values_list("key", flat=True)
        return {
            "events": events(job),
            "tables": sorted({key.split(":")[1] for key in keys}),
            "problems": [r["problems"] for r in results.values_list("result", flat=True)
                         if r.get("problems")],
            "units once": len(keys) == len(set(keys)),
        }  # fmt: skip


MOVED = {f"d{n // 3}/f{n}.bin": bytes([n]) * (1000 * (n + 1)) for n in range(7)}


class FilesTrial(Trial):
    """files.move: each job moves its own prefix; every file ends in the destination once."""

    operation = "files.move"
    id = "files.move"

    def input(self, env: Env, n: int) -> dict[str, Any]:
        write_files(env.tmp / "src" / f"m{n}", MOVED)
        (env.tmp / "dst").mkdir(exist_ok=True)
        return {"source": "src", "destination": "dst", "prefix": f"m{n}/"}

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        outcomes = job.unit_results.exclude(key="summary").values_list("result", flat=True)
        return {
            "moved": tree(env.tmp / "dst" / f"m{n}"),
            "left": tree(env.tmp / "src" / f"m{n}"),
            "outcomes": {r["outcome"] for r in outcomes if isinstance(r, dict)} - {"already_moved"},
        }


class PurgeTrial(Trial):
    operation = "durable.purge"
    id = "durable.purge"

    def input(self, env: Env, n: int) -> dict[str, Any]:
        old = timezone.now() - timezone.timedelta(days=40)
        made = [jobs.enqueue("durable.noop", {"units": 1}, owner=f"old {n}") for _ in range(5)]
        for job in made:
            drain(job.pk)
        Job.objects.filter(pk__in=[j.pk for j in made]).update(finished_at=old, updated_at=old)
        jobs.enqueue("durable.noop", {"units": 1}, owner=f"unfinished {n}", run_after=old)
        return {"older_than": "30d"}

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        return {
            "old left": Job.objects.filter(owner=f"old {n}").count(),
            "unfinished kept": Job.objects.filter(owner=f"unfinished {n}").count(),
        }


class NoopTrial(Trial):
    operation = "durable.noop"
    id = "durable.noop"

    def input(self, env: Env, n: int) -> dict[str, Any]:
        return {"units": 5}

    def outcome(self, env: Env, job: Job, n: int) -> dict[str, Any]:
        return {"units": job.units_done, "results": job.unit_results.count()}


TRIALS = [
    BackupTrial(snapshot=False),
    *([] if PG else [BackupTrial(snapshot=True)]),
    RestoreTrial(),
    RestoreWithRecoveryTrial(),
    CopyTrial("default", "other"),
    *([CopyTrial("lite", "other")] if PG else []),  # SQLite -> PostgreSQL
    ScanTrial(),
    DatabaseScanTrial(),
    FilesTrial(),
    PurgeTrial(),
    NoopTrial(),
]


# --- the chain of workers ------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, settings) -> Env:
    env = Env(tmp=tmp_path, backups=tmp_path / "backups", scan_root=tmp_path / "scan")
    for path in (env.backups, env.scan_root, tmp_path / "src", tmp_path / "dst"):
        path.mkdir()
    settings.DURABLE_BACKUP_DIR = env.backups
    settings.DURABLE_RESTORE_KEEP_APPS = []  # (only the restore with recovery restores it)
    local = "django.core.files.storage.FileSystemStorage"
    settings.STORAGES = {
        **settings.STORAGES,
        "scan": {"BACKEND": local, "OPTIONS": {"location": str(env.scan_root)}},
        "src": {"BACKEND": local, "OPTIONS": {"location": str(tmp_path / "src")}},
        "dst": {"BACKEND": local, "OPTIONS": {"location": str(tmp_path / "dst")}},
    }
    return env


def worker_env(env: Env, **extra: str) -> dict[str, str]:
    return {
        **env.worker_env(),
        "FILE_STORAGES": f"src={env.tmp / 'src'},dst={env.tmp / 'dst'}",
        **extra,
    }


def first_arrivals(trace: Path) -> list[str]:
    """The fault points in the order the crash-free run first reached them."""
    return list(dict.fromkeys(trace.read_text().split()))


def kill_at_random(workers, env: Env, rng: random.Random) -> bool:
    """Start a worker and SIGKILL it after a random moment; True if it was still running."""
    proc = workers.start(burst=True, lease=LEASE, env=worker_env(env))
    deadline = time.monotonic() + rng.uniform(0.5, 3.0)  # Django's start-up takes ~1 s
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    if proc.poll() is not None:
        assert proc.returncode == 0, workers.log(proc)
        return False
    proc.kill()
    proc.wait(timeout=10)
    return True


@pytest.mark.parametrize(
    "trial",
    [
        pytest.param(
            t, id=t.id, marks=pytest.mark.django_db(transaction=True, databases=t.databases)
        )
        for t in TRIALS
    ],
)
def test_every_fault_point__a_killed_worker_resumes_to_the_crash_free_result(
    trial: Trial, env: Env, workers, tmp_path: Path, monkeypatch
):
    rng = random.Random(SEED)  # FAULT_POINTS_SEED=<the seed in a failure's message> repeats it
    trial.setup(env)

    # The crash-free run: it records the points it passes.
    trace = tmp_path / "trace.txt"
    reference_job = jobs.enqueue(trial.operation, trial.input(env, 0))
    if trial.in_process:
        monkeypatch.setattr(faults, "_trace", str(trace))
        reference_job = drain(reference_job.pk, timeout=120)
        monkeypatch.setattr(faults, "_trace", "")
    else:
        clean = workers.run(lease=LEASE, env=worker_env(env, DURABLE_FAULTS_TRACE=str(trace)))
        assert clean.returncode == 0, workers.log(clean)
        reference_job.refresh_from_db()
    assert reference_job.state == "completed", reference_job.reason
    reference = trial.outcome(env, reference_job, 0)
    points = first_arrivals(trace)
    assert {"after_claim", "before_unit", "after_unit", "after_checkpoint"} <= set(points)

    remaining, n = list(points), 0
    while remaining:
        n += 1
        job = jobs.enqueue(trial.operation, trial.input(env, n), max_attempts=ATTEMPTS)
        killed_here: list[str] = []
        random_kills = RANDOM_KILLS
        while True:
            if remaining:
                point = remaining[0]
                proc = workers.run(faults=point, lease=LEASE, env=worker_env(env))
                if proc.returncode == -signal.SIGKILL:
                    killed_here.append(remaining.pop(0))
                    continue
            elif random_kills and kill_at_random(workers, env, rng):
                random_kills -= 1
                continue
            else:
                proc = workers.run(lease=LEASE, env=worker_env(env))
            assert proc.returncode == 0, workers.log(proc)
            break  # the job finished (before the next point, if one is left: a new job)
        assert killed_here, f"no job of {trial.id} reaches {remaining[0]!r} once resumed"
        job.refresh_from_db()
        said = f"seed {SEED}, killed at {killed_here}"
        assert job.state == "completed", (said, job.reason)
        assert trial.outcome(env, job, n) == reference, said
