"""The ingest and the Security upsert with real worker processes, killed for real.

``transaction=True`` throughout: the workers (and recorders) are other
processes with their own connections, so the test's rows must be committed
and theirs must be visible here.
"""

from __future__ import annotations

import io
import json
import os
import pty
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from durable import jobs
from durable.models import Job, JobEvent, UnitResult
from recovery.models import EventType, IngestCursor, IngestPath, RecoveryEvent, SecurityEvent
from recovery.operations import job_summary
from tests.conftest import BASE_DIR, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def append(path: Path, *events: dict, tail: bytes = b"") -> None:
    with open(path, "ab") as handle:
        handle.write(b"".join(json.dumps(event).encode() + b"\n" for event in events) + tail)


def numbered(start: int, stop: int) -> list[dict]:
    return [{"type": "backup-created", "detail": f"line {n}"} for n in range(start, stop)]


def imported_details() -> Counter:
    rows = RecoveryEvent.objects.filter(source_line__isnull=False)
    return Counter(rows.values_list("detail", flat=True))


def assert_each_once(expected: int) -> None:
    details = imported_details()
    assert details == Counter(f"line {n}" for n in range(expected))
    keys = RecoveryEvent.objects.filter(source_line__isnull=False).values_list("source_line")
    assert len(set(keys)) == expected


def test_worker__imports_lines_appended_while_it_runs(workers, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    append(path, *numbered(0, 3))
    env = {"RECOVERY_EVENTS_FILE": str(path), "RECOVERY_INGEST_INTERVAL": "0.2"}
    worker = workers.start(env=env, lease=0.6)  # heartbeats every 0.2 s
    wait_until(lambda: len(imported_details()) == 3, timeout=30)
    append(path, *numbered(3, 5), tail=b'{"type": "backup-created", "detail": "li')
    wait_until(lambda: len(imported_details()) == 5, timeout=30)
    append(path, tail=b'ne 5"}\n')  # the writer finishes its line
    wait_until(lambda: len(imported_details()) == 6, timeout=30)
    assert worker.poll() is None, workers.log(worker)
    assert_each_once(6)
    ingests = Job.objects.filter(operation="recovery.ingest")
    # One job per change seen, not one per heartbeat.
    assert 3 <= ingests.count() <= 6
    assert set(ingests.values_list("state", flat=True)) <= {"completed", "queued", "running"}


# Units of 1, 2, 3, 3 and 1 lines: paced (small first after a claim, then doubling
# while a unit takes far less than the target), never above batch_lines.
STEADY_PACE = {"DURABLE_UNIT_TARGET_SECONDS": "60"}


@pytest.mark.parametrize(
    ("fault", "committed_before_the_crash"),
    [
        ("after_unit:2", 1),  # batch 2 inserted, checkpoint not yet committed
        # Batch 2 half sent (PostgreSQL: mid-COPY; SQLite: its last statement unsent).
        ("ingest.mid_insert:2", 1),
        ("after_checkpoint:2", 3),  # batch 2 committed with its checkpoint
        ("before_complete:1", 10),  # everything committed, job not yet completed
    ],
)
def test_worker_killed_mid_ingest__replay_never_duplicates(
    workers, tmp_path, fault, committed_before_the_crash
):
    path = tmp_path / "recovery-events.jsonl"
    append(path, *numbered(0, 10))
    job = jobs.enqueue("recovery.ingest", {"path": str(path), "batch_lines": 3})
    crashed = workers.run(faults=fault, env=STEADY_PACE)
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    assert len(imported_details()) == committed_before_the_crash
    job.refresh_from_db()
    assert job.state == "running"

    restarted = workers.run()
    assert restarted.returncode == 0, workers.log(restarted)
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.reclaims == 1
    assert_each_once(10)
    cursor = IngestPath.objects.get(path=str(path)).cursor
    assert (cursor.offset, cursor.lines_imported) == (path.stat().st_size, 10)


# Enough lines that the kills land mid-import: SQLite imports several times faster
# (its search index waits for a job of its own).
TORTURE_LINES = {"sqlite": 250_000, "postgresql": 60_000}
TORTURE_KILLS = 5
# Seconds between a worker's claim and its SIGKILL: less than a 10,000-line unit takes
# on PostgreSQL (which this test failed with fixed units), more than a small first unit.
KILL_AFTER_CLAIM = (0.1, 0.3)


def test_ingest_torture__workers_killed_soon_after_each_claim_still_import_every_line_once(
    workers, tmp_path
):
    """A crash-looping worker: each one SIGKILLed 0.1-0.3 s after it claims the job.

    Units are sized in time, small first after a claim, so every worker commits
    before it dies; with fixed 10,000-line units a PostgreSQL worker did not,
    and the job failed after five deaths without progress. The whole run, with
    300,000 lines and kills 0.8-3 s after each start, is bench/ingest_torture.py.
    """
    path = tmp_path / "recovery-events.jsonl"
    lines = TORTURE_LINES[connection.vendor]
    with open(path, "w") as handle:
        handle.writelines(
            json.dumps({"type": "backup-created", "detail": f"line {n}", "db": "wekan"}) + "\n"
            for n in range(lines)
        )
    job = jobs.enqueue("recovery.ingest", {"path": str(path)})
    claims = JobEvent.objects.filter(job_id=job.pk, kind="started")
    rng = random.Random(24)
    kills = 0
    for _ in range(TORTURE_KILLS):
        before, seen = claims.count(), job.units_done
        worker = workers.start(lease=10)
        wait_until(lambda: claims.count() > before or worker.poll() is not None, timeout=60)  # noqa: B023 - used at once
        time.sleep(rng.uniform(*KILL_AFTER_CLAIM))
        worker.kill()
        worker.wait(timeout=10)
        job.refresh_from_db()
        if job.state != "running":
            break  # finished within this life
        kills += 1
        assert job.units_done > seen, f"worker {kills} committed nothing before it died"
    assert kills >= 2, "the file was imported too fast for the kills to land mid-import"
    assert workers.run(lease=10).returncode == 0
    job.refresh_from_db()
    assert job.state == "completed", job.reason
    assert job.attempts == 0  # every death came after progress: no attempt spent
    assert_each_once(lines)


def test_worker_killed_after_the_summary__the_replay_reports_what_it_imported(workers, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    append(path, *numbered(0, 10))
    job = jobs.enqueue("recovery.ingest", {"path": str(path), "batch_lines": 3})
    # Killed once the run's summary committed, before the job completed...
    crashed = workers.run(faults="before_complete:1")
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    assert not RecoveryEvent.objects.filter(type=EventType.INGEST_REPORT).exists()  # clean
    # ...and lines arrive before the replay, one of them malformed.
    append(path, *numbered(10, 12), tail=b"not json\n")
    assert workers.run().returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    assert_each_once(12)
    # The replay's own summary (not skipped as "already done") reports its lines.
    report = RecoveryEvent.objects.get(type=EventType.INGEST_REPORT)
    assert report.detail.startswith("Imported 2 of 3 lines")
    assert "1 malformed JSON" in report.detail
    totals = job_summary(job.pk)
    assert (totals["imported"], totals["lines"]) == (12, 13)


def line_units() -> list[dict]:
    """The committed results of every ``lines:`` unit, of every job."""
    rows = UnitResult.objects.filter(key__startswith="lines:").order_by("id")
    return list(rows.values_list("result", flat=True))


def test_two_workers_ingesting_one_file_under_two_names__never_import_a_line_twice(
    workers, tmp_path
):
    path = tmp_path / "recovery-events.jsonl"
    append(path, *numbered(0, 600))
    link = tmp_path / "elsewhere" / "recovery-events.jsonl"
    link.parent.mkdir()
    os.link(path, link)  # a second name of the same file: two unique keys, two jobs
    first = jobs.enqueue("recovery.ingest", {"path": str(path), "batch_lines": 20})
    second = jobs.enqueue("recovery.ingest", {"path": str(link), "batch_lines": 20})
    assert first.pk != second.pk
    # Each worker stops (SIGSTOP) right after committing its 2nd batch. They share
    # one cursor, and only one of them can have committed last: the other holds
    # a position the cursor has left, so when both go on, it must lose a race.
    procs = [workers.start("--burst", faults="after_checkpoint:2:stop", lease=30) for _ in range(2)]
    wait_until(lambda: all(proc_state(proc.pid) == "T" for proc in procs), timeout=60)
    for proc in procs:
        os.kill(proc.pid, signal.SIGCONT)
    for proc in procs:
        assert proc.wait(timeout=120) == 0, workers.log(proc)
    assert set(Job.objects.values_list("state", flat=True)) == {"completed"}
    assert_each_once(600)
    # The overlap happened: a batch read from a stale position was refused...
    assert JobEvent.objects.filter(job__in=[first, second], kind="rescheduled").exists()
    # ...before it committed: the committed batches cover each line exactly once.
    # (A unique-constraint hit alone would show as a committed batch of duplicates.)
    units = line_units()
    assert sum(unit["lines"] for unit in units) == 600
    assert [unit["duplicates"] for unit in units] == [0] * len(units)
    (cursor,) = IngestCursor.objects.all()
    assert cursor.lines_imported == 600
    names = IngestPath.objects.order_by("path")
    assert [(name.path, name.cursor_id) for name in names] == sorted(
        [(str(path), cursor.pk), (str(link), cursor.pk)]
    )


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def test_two_ingests_of_one_file__the_late_one_notices_and_imports_nothing_twice(workers, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    append(path, *numbered(0, 100))
    link = tmp_path / "recovery-events-link.jsonl"
    os.link(path, link)
    late = jobs.enqueue("recovery.ingest", {"path": str(path), "batch_lines": 20})
    # Worker A imports the first batch, then stops (SIGSTOP) right after that commit.
    stalled = workers.start("--burst", faults="after_checkpoint:1:stop", lease=30)
    wait_until(lambda: proc_state(stalled.pid) == "T")
    assert len(imported_details()) == 1  # the first unit after a claim: 20 / 32, one line
    # Meanwhile another ingest of the same file (under its other name) runs to the end.
    other = jobs.enqueue("recovery.ingest", {"path": str(link), "batch_lines": 20})
    assert workers.run(lease=30).returncode == 0
    assert Job.objects.get(pk=other.pk).state == "completed"
    assert len(imported_details()) == 100
    # A wakes up holding a stale position: its next batch is refused, it rereads
    # the cursor, finds nothing left, and completes.
    os.kill(stalled.pid, signal.SIGCONT)
    assert stalled.wait(timeout=60) == 0, workers.log(stalled)
    late.refresh_from_db()
    assert late.state == "completed"
    assert late.events.filter(kind="rescheduled").exists()
    assert late.attempts == 0  # a lost race is not a failed attempt
    assert_each_once(100)


RECORDER = """
import sys, time
from pathlib import Path
import django
django.setup()
from recovery.records import record_security
n, me, gate = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
(gate.parent / f"ready-{me}").touch()
while not gate.exists():  # all four start recording together
    time.sleep(0.005)
for i in range(n):
    assert record_security(category="ssrf", key="webhook.url", cwe=918, source="test",
                           username=me, ip=f"192.0.2.{int(me[-1]) + 1}") is not None
"""


def test_security_upsert__four_processes_at_once_lose_no_count(workers, tmp_path):
    """Real processes hammering one row. On SQLite writers take turns anyway, so
    this cannot catch a read-modify-write there; the deterministic proof on
    both databases is test_recovery_security's concurrent-writer test."""
    per_process = 40
    gate = tmp_path / "go"
    env = workers.env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RECORDER, str(per_process), f"p{n}", str(gate)],
            cwd=BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for n in range(4)
    ]
    try:
        wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 4, timeout=60)
    finally:
        gate.touch()  # never leave a recorder waiting
    for proc in procs:
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output.decode()
    row = SecurityEvent.objects.get()
    assert row.count == 4 * per_process
    assert row.users == {f"p{n}": per_process for n in range(4)}
    assert sum(row.addresses.values()) == 4 * per_process


def test_ingest_command__wait_runs_it_here_and_reports(tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    append(path, *numbered(0, 4), tail=b"garbage\n")
    out = io.StringIO()
    call_command("ingest_recovery_events", str(path), "--wait", stdout=out)
    text = out.getvalue()
    assert "imported 4 of 5 new lines; skipped 1 malformed_json" in text
    assert_each_once(4)
    assert Job.objects.get(operation="recovery.ingest").state == "completed"


def run_under_a_terminal(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    """Run ``manage.py`` with a pseudo-terminal as its stdout; everything it wrote."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=subprocess.STDOUT,
    )
    os.close(terminal)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: the other end closed
                break
            if not data:
                break
            output += data
        assert proc.wait(timeout=10) == 0, output.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    return output.decode(errors="replace")


def test_ingest_command__shows_a_progress_bar_on_a_terminal(workers, tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    append(path, *numbered(0, 3000))
    # --wait runs it in the command's own process; the bar redraws in place (\r).
    text = run_under_a_terminal(["ingest_recovery_events", str(path), "--wait"], workers.env())
    assert "\r[" in text
    bars = [part for part in text.replace("\n", "\r").split("\r") if part.startswith("[")]
    assert bars[-1].startswith("[" + "#" * 30 + "] ")
    assert bars[-1].rstrip().endswith("completed")
    assert "imported 3,000 of 3,000 new lines" in text
    assert_each_once(3000)
