"""files.move, import.jsonl, import.csv and a schedule's occurrence job against real workers.

The list of guarantees (docs/explanation/guarantees.md) — positive completion,
crash before the checkpoint, crash after a side effect, expired-lease reclaim,
pause, cancel — is written once as scenarios and run for each operation
through a small adapter (``Case``) that knows how to start its job and what
"done exactly once" means for it.
Concurrent-worker exclusion and each operation's own failure modes follow.

``transaction=True`` throughout: the workers are other processes with their
own connections, so the test's rows must be committed and theirs visible here.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from durable import jobs
from durable.models import Job, UnitResult
from durable.schedules.models import Occurrence, Schedule
from durable.schedules.service import add_schedule
from recovery.imports.models import ImportRecord
from recovery.models import RecoveryEvent
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --- the operations, as cases -----------------------------------------------------------


class Case:
    """One operation's job: how to start it, and what done-exactly-once means for it."""

    atomic = False  # atomic units hold the write lock inside a unit: stop a worker only outside

    def __init__(self, tmp_path: Path, settings) -> None:
        self.tmp = tmp_path
        self.env: dict[str, str] = {}

    def start(self) -> None:
        raise NotImplementedError

    def job(self) -> Job:
        raise NotImplementedError

    def assert_done_once(self) -> None:
        """Completed, and every side effect there exactly once."""
        raise NotImplementedError

    def assert_consistent(self) -> None:
        """Stopped part-way (paused, cancelled): nothing half-done, nothing twice."""
        raise NotImplementedError

    @property
    def stop_point(self) -> str:
        return "after_checkpoint" if self.atomic else "after_unit"


FILES = {
    f"d{n // 3}/f{n}.bin": hashlib.sha256(str(n).encode()).digest() * (n + 1) for n in range(5)
}


class FilesCase(Case):
    def __init__(self, tmp_path: Path, settings) -> None:
        super().__init__(tmp_path, settings)
        self.src, self.dst = tmp_path / "src", tmp_path / "dst"
        for root in (self.src, self.dst):
            root.mkdir()
        for name, data in FILES.items():
            (self.src / name).parent.mkdir(parents=True, exist_ok=True)
            (self.src / name).write_bytes(data)
        self.env = {"FILE_STORAGES": f"src={self.src},dst={self.dst}"}
        settings.STORAGES = {
            **settings.STORAGES,
            "src": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                    "OPTIONS": {"location": str(self.src)}},
            "dst": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                    "OPTIONS": {"location": str(self.dst)}},
        }  # fmt: skip

    def start(self) -> None:
        self.job_id = jobs.enqueue("files.move", {"source": "src", "destination": "dst"}).pk

    def job(self) -> Job:
        return Job.objects.get(pk=self.job_id)

    def results(self) -> list[dict]:
        rows = UnitResult.objects.filter(job_id=self.job_id).exclude(key="summary")
        return [row.result for row in rows]

    def assert_done_once(self) -> None:
        assert tree(self.dst) == FILES
        assert tree(self.src) == {}
        names = [result["name"] for result in self.results()]
        assert len(names) == len(set(names))
        # A file whose unit was killed after its delete is no longer listed, so
        # it has no result: moved once, by the unit that crashed.
        assert len(names) >= len(FILES) - 1
        assert {result["outcome"] for result in self.results()} <= {"moved", "already_moved"}

    def assert_consistent(self) -> None:
        moved, left = tree(self.dst), tree(self.src)
        assert moved.keys().isdisjoint(left.keys())  # never in both places
        assert {**moved, **left} == FILES  # every file intact, somewhere
        after = self.job().checkpoint["after"]
        assert set(moved) == {name for name in FILES if name <= after}


JSONL_LINES = [json.dumps({"type": "backup-created", "detail": f"event {n}"}) for n in range(12)]


class ImportCase(Case):
    atomic = True
    format = "jsonl"

    def __init__(self, tmp_path: Path, settings) -> None:
        super().__init__(tmp_path, settings)
        # Imports read only inside RECOVERY_IMPORT_DIRS: here and in the workers.
        settings.RECOVERY_IMPORT_DIRS = [str(tmp_path)]
        self.env = {"RECOVERY_IMPORT_DIRS": str(tmp_path)}
        self.path = tmp_path / f"export.{self.format}"
        self.path.write_bytes(self.content())

    def content(self) -> bytes:
        lines = [*JSONL_LINES[:5], "garbage", *JSONL_LINES[5:], "[1]"]
        return "\n".join(lines).encode() + b"\n"

    def start(self) -> None:
        data = {"path": str(self.path), "batch_records": 3}
        self.job_id = jobs.enqueue(f"import.{self.format}", data).pk

    def job(self) -> Job:
        return Job.objects.get(pk=self.job_id)

    @staticmethod
    def details() -> Counter:
        rows = RecoveryEvent.objects.filter(source_line__startswith="imp:")
        return Counter(rows.values_list("detail", flat=True))

    def assert_done_once(self) -> None:
        assert self.details() == Counter(f"event {n}" for n in range(12))
        record = ImportRecord.objects.get()
        assert (record.state, record.imported, record.duplicates) == ("completed", 12, 0)
        assert sum(record.skipped.values()) == 2

    def assert_consistent(self) -> None:
        details = self.details()
        assert set(details.values()) <= {1}
        assert ImportRecord.objects.get().imported == len(details)


class CsvImportCase(ImportCase):
    format = "csv"

    def content(self) -> bytes:
        rows = ["type,detail"] + [f'backup-created,"event {n}"' for n in range(12)]
        rows.insert(6, 'backup-created,"bad "quoting" here"')  # malformed CSV
        rows.insert(3, "backup-created,x,surplus")
        return "\n".join(rows).encode() + b"\n"


class ScheduleCase(Case):
    """The job an occurrence of a schedule enqueued: one occurrence, one job, each unit once."""

    def __init__(self, tmp_path: Path, settings) -> None:
        super().__init__(tmp_path, settings)
        self.out = tmp_path / "side-effects.log"

    def start(self) -> None:
        data = {"units": 4, "path": str(self.out), "idempotent": True}
        schedule = add_schedule("every-hour", "test.append", every=timedelta(hours=1), input=data)
        Schedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now())  # due

    def job(self) -> Job:
        (occurrence,) = Occurrence.objects.all()
        return Job.objects.get(pk=occurrence.job_id)

    def done(self) -> Counter:
        if not self.out.exists():
            return Counter()
        rows = [line.split() for line in self.out.read_text().splitlines()]
        return Counter(row[2] for row in rows if row[0] == "done")

    def assert_done_once(self) -> None:
        assert Occurrence.objects.count() == 1
        assert Job.objects.filter(owner="schedule:every-hour").count() == 1
        assert self.done() == {f"u{n}": 1 for n in range(4)}

    def assert_consistent(self) -> None:
        assert Occurrence.objects.count() == 1
        assert Job.objects.filter(owner="schedule:every-hour").count() == 1
        assert set(self.done().values()) <= {1}


CASES = {
    "files.move": FilesCase,
    "import.jsonl": ImportCase,
    "import.csv": CsvImportCase,
    "schedule-occurrence": ScheduleCase,
}


@pytest.fixture(params=sorted(CASES))
def case(request, tmp_path, settings) -> Case:
    made = CASES[request.param](tmp_path, settings)
    made.start()
    return made


# --- the guarantees, once for every case ---------------------------------------------------


def test_completes(case, workers):
    proc = workers.run(env=case.env)
    assert proc.returncode == 0, workers.log(proc)
    assert case.job().state == "completed"
    case.assert_done_once()


@pytest.mark.parametrize(
    "fault",
    [
        "before_unit:2",  # the unit was about to run: nothing of it happened yet
        "after_unit:2",  # the unit's side effect happened; its checkpoint did not
        "after_checkpoint:2",  # the checkpoint committed; the next unit did not start
    ],
)
def test_crash__a_restarted_worker_finishes_and_nothing_is_done_twice(case, workers, fault):
    crashed = workers.run(faults=fault, env=case.env)
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    assert case.job().state == "running"
    if fault.startswith("before_unit"):
        # Crashed before its second unit: one unit checkpointed, and it is not run again.
        assert case.job().units_done == 1
        first = set(UnitResult.objects.filter(job_id=case.job().pk).values_list("key", "id"))
    restarted = workers.run(env=case.env)
    assert restarted.returncode == 0, workers.log(restarted)
    job = case.job()
    assert (job.state, job.reclaims) == ("completed", 1)
    case.assert_done_once()
    if fault.startswith("before_unit"):
        assert first <= set(UnitResult.objects.filter(job_id=job.pk).values_list("key", "id"))


def test_expired_lease__another_worker_takes_over_and_the_stale_one_changes_nothing(case, workers):
    stale = workers.start("--burst", faults=f"{case.stop_point}:2:stop", lease=1.0, env=case.env)
    wait_until(lambda: proc_state(stale.pid) == "T", timeout=30)
    job = case.job()
    wait_until(lambda: Job.objects.get(pk=job.pk).lease_expires_at < timezone.now(), timeout=10)
    rescuer = workers.run(env=case.env)
    assert rescuer.returncode == 0, workers.log(rescuer)
    job.refresh_from_db()
    assert (job.state, job.reclaims) == ("completed", 1)
    os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(timeout=30) == 0, workers.log(stale)
    assert "lease lost" in workers.log(stale)
    assert Job.objects.get(pk=job.pk).state == "completed"
    case.assert_done_once()


@pytest.mark.parametrize("action", ["pause", "cancel"])
def test_pause_or_cancel__stops_at_a_unit_boundary(case, workers, action):
    worker = workers.start("--burst", faults="after_checkpoint:1:stop", lease=30, env=case.env)
    wait_until(lambda: proc_state(worker.pid) == "T", timeout=30)
    job = case.job()
    assert getattr(jobs, action)(job.pk, actor="ops").applied
    os.kill(worker.pid, signal.SIGCONT)
    assert worker.wait(timeout=30) == 0, workers.log(worker)
    job.refresh_from_db()
    assert job.state == {"pause": "paused", "cancel": "cancelled"}[action]
    assert job.lease_owner is None
    assert 1 <= job.units_done < job.units_total
    case.assert_consistent()
    if action == "pause":
        assert jobs.resume(job.pk, actor="ops").applied
        assert workers.run(env=case.env).returncode == 0
        assert case.job().state == "completed"
        case.assert_done_once()
    else:
        assert workers.run(env=case.env).returncode == 0  # nothing resumes a cancelled job
        assert case.job().state == "cancelled"
        case.assert_consistent()


# --- concurrent workers -----------------------------------------------------------------


def test_files__two_jobs_contending_for_the_same_files_move_each_once_and_lose_nothing(
    workers, tmp_path, settings
):
    """Two moves of the same files at once, on two workers.

    ``enqueue`` folds a second move over the same pair of storages into the
    first (its unique key); these two are enqueued past that, with keys of their
    own, as two sites sharing one storage might. Each file is copied and
    published by one of them; the other finds it published (not its own) or
    gone, and never deletes a copy it did not make.
    """
    files = FilesCase(tmp_path, settings)
    extra = {f"d{n}/g{k}": bytes([n, k]) * 20_000 for n in range(2) for k in range(6)}
    for name, data in extra.items():
        (files.src / name).parent.mkdir(parents=True, exist_ok=True)
        (files.src / name).write_bytes(data)
    data = {"source": "src", "destination": "dst"}
    ids = [jobs.enqueue("files.move", data, unique_key=f"contender {n}").pk for n in range(2)]
    procs = [workers.start("--burst", env=files.env) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, workers.log(proc)
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    assert tree(files.dst) == {**FILES, **extra}  # every file intact, no temporary copy left
    assert tree(files.src) == {}
    results = [r.result for r in UnitResult.objects.filter(job_id__in=ids).exclude(key="summary")]
    copied = Counter(result["name"] for result in results if result.get("copied"))
    # Published once: the job that lost the race found the file there (or gone).
    assert copied == Counter({name: 1 for name in {**FILES, **extra}})
    assert {result["outcome"] for result in results} <= {"moved", "already_moved", "vanished"}


def test_imports__two_workers_one_record_per_file_and_no_duplicate_events(
    workers, tmp_path, settings
):
    first = ImportCase(tmp_path, settings)
    same = tmp_path / "same-bytes-another-name.jsonl"
    same.write_bytes(first.path.read_bytes())
    other = tmp_path / "other.csv"
    other.write_text("type,detail\n" + "".join(f"integrity-ok,other {n}\n" for n in range(9)))
    ids = [
        jobs.enqueue("import.jsonl", {"path": str(first.path), "batch_records": 2}).pk,
        jobs.enqueue("import.jsonl", {"path": str(same), "batch_records": 2}).pk,
        jobs.enqueue("import.csv", {"path": str(other), "batch_records": 2}).pk,
    ]
    procs = [workers.start("--burst", env=first.env) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, workers.log(proc)
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    assert ImportRecord.objects.count() == 2
    assert ImportCase.details() == Counter(
        [f"event {n}" for n in range(12)] + [f"other {n}" for n in range(9)]
    )
    sources = UnitResult.objects.filter(job_id__in=ids[:2], key="source")
    statuses = Counter(result["status"] for result in sources.values_list("result", flat=True))
    assert statuses["importing"] == 1
    assert statuses["already_imported"] + statuses["being_imported"] == 1


# --- files.move: between copy and delete ------------------------------------------------


def test_files__a_crash_between_copy_and_delete_is_finished_without_copying_again(
    workers, tmp_path, settings
):
    files = FilesCase(tmp_path, settings)
    files.start()
    crashed = workers.run(faults="files.after_copy:2", env=files.env)
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    second = sorted(FILES)[1]
    # Both copies exist: the crash came after the copy was verified, before the delete.
    assert (files.src / second).read_bytes() == (files.dst / second).read_bytes()
    copy = (files.dst / second).stat()
    restarted = workers.run(env=files.env)
    assert restarted.returncode == 0, workers.log(restarted)
    files.assert_done_once()
    result = UnitResult.objects.get(job_id=files.job_id, key=f"file:{second}").result
    assert (result["outcome"], result["copied"]) == ("moved", False)
    again = (files.dst / second).stat()
    assert (again.st_ino, again.st_mtime_ns) == (copy.st_ino, copy.st_mtime_ns)  # not rewritten


def test_files__a_long_move_killed_more_often_than_its_attempts_still_finishes(
    workers, tmp_path, settings
):
    # Each worker moves a file (or copies one) and is killed: deaths after progress spend no
    # attempt (issue 11), so a move of many files survives more kills than max_attempts.
    files = FilesCase(tmp_path, settings)
    many = {f"many/{n:02d}.bin": bytes([n]) * (2000 + n) for n in range(10)}
    for name, data in many.items():
        (files.src / name).parent.mkdir(parents=True, exist_ok=True)
        (files.src / name).write_bytes(data)
    files.start()
    limit = files.job().max_attempts
    kills = ["after_checkpoint:1"] * limit + ["files.after_copy:1", "after_checkpoint:1"]
    for fault in kills:
        crashed = workers.run(faults=fault, env=files.env)
        assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
        assert files.job().state == "running"
    finished = workers.run(env=files.env)
    assert finished.returncode == 0, workers.log(finished)
    job = files.job()
    assert job.state == "completed", job.reason
    assert job.reclaims == len(kills) > limit
    assert tree(files.dst) == {**FILES, **many}
    assert tree(files.src) == {}


def test_files__a_move_killed_many_times_leaves_no_temporary_name_of_its_own(
    workers, tmp_path, settings
):
    """Kills at the fault points and right after a source was deleted, then a clean finish.

    A unit that deleted its source and was killed before it removed its
    temporary name was never run again (the file is no longer listed), and the
    completed job left ``dir one/.durable-move-<job>-<hash>.part`` behind: a
    second hard link to a moved file. The name now goes before the source.
    """
    files = FilesCase(tmp_path, settings)
    many = {f"dir one/{n:02d}.bin": bytes([n]) * (3000 + n) for n in range(30)}
    for name, data in many.items():
        (files.src / name).parent.mkdir(parents=True, exist_ok=True)
        (files.src / name).write_bytes(data)
    files.start()
    kills = ["files.after_copy:3", "files.after_delete:2", "after_unit:4", "files.after_delete:5"]
    for fault in kills:
        crashed = workers.run(faults=fault, env=files.env)
        assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
        assert files.job().state == "running"
    finished = workers.run(env=files.env)
    assert finished.returncode == 0, workers.log(finished)
    job = files.job()
    assert job.state == "completed", job.reason
    assert job.reclaims == len(kills)
    moved = tree(files.dst)
    assert [name for name in moved if ".durable-move-" in name] == []
    assert moved == {**FILES, **many}  # every file, right, once
    assert tree(files.src) == {}


# --- schedules: several workers, crashes mid-tick, catch-up -----------------------------


def test_schedule__several_workers_ticking_apply_each_occurrence_once(workers):
    schedule = add_schedule(
        "fast", "durable.noop", every=timedelta(seconds=0.5), input={"units": 1}, overlap=True
    )
    procs = [workers.start(lease=0.6) for _ in range(3)]  # each ticks every 0.2 s
    wait_until(lambda: Occurrence.objects.filter(schedule=schedule).count() >= 6, timeout=60)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0, workers.log(proc)
    occurrences = list(Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for"))
    job_ids = [o.job_id for o in occurrences]
    # One job per occurrence (overlap=True: nothing else folds duplicates together).
    assert None not in job_ids
    assert len(set(job_ids)) == len(job_ids)
    assert Job.objects.filter(owner="schedule:fast").count() == len(occurrences)
    times = [o.scheduled_for for o in occurrences]
    assert len(set(times)) == len(times)
    steps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(step % timedelta(seconds=0.5) == timedelta(0) for step in steps)  # on the grid


@pytest.mark.parametrize(
    ("fault", "recorded_before_restart"),
    [
        ("schedules.before_commit:1", 0),  # killed inside the tick's transaction: nothing stays
        ("schedules.after_commit:1", 1),  # killed just after it: the occurrence and job stay
    ],
)
def test_schedule__a_worker_killed_mid_tick_applies_the_occurrence_once(
    workers, fault, recorded_before_restart
):
    schedule = add_schedule("hourly", "durable.noop", every=timedelta(hours=1), input={"units": 2})
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now())
    crashed = workers.run(faults=fault)
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    assert Occurrence.objects.count() == recorded_before_restart
    assert Job.objects.filter(owner="schedule:hourly").count() == recorded_before_restart
    restarted = workers.run()
    assert restarted.returncode == 0, workers.log(restarted)
    (occurrence,) = Occurrence.objects.all()
    (job,) = Job.objects.filter(owner="schedule:hourly")
    assert (occurrence.job_id, job.state) == (job.pk, "completed")
    assert workers.run().returncode == 0  # and yet another restart applies nothing more
    assert Occurrence.objects.count() == 1


def test_schedule__after_downtime_the_latest_missed_occurrence_runs_once(workers):
    schedule = add_schedule("minutely", "durable.noop", cron="* * * * *", input={"units": 1})
    down_since = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=10)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=down_since)
    first = workers.run()
    assert first.returncode == 0, workers.log(first)
    second = workers.run()  # a restart catches nothing up twice
    assert second.returncode == 0, workers.log(second)
    occurrences = list(Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for"))
    assert len(occurrences) in (1, 2)  # a minute boundary may pass between the two runs
    latest = occurrences[0]
    assert latest.missed >= 10
    assert latest.scheduled_for > down_since + timedelta(minutes=9)
    assert Job.objects.filter(owner="schedule:minutely", state="completed").count() == len(
        occurrences
    )
    report = RecoveryEvent.objects.get(type="schedule-caught-up")
    assert "ran once for" in report.detail
    assert f"{latest.missed} earlier occurrence(s) were not run" in report.detail
