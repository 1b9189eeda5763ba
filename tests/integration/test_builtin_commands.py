"""The built-in operations' commands on a terminal: the progress bar they draw, and Ctrl-C.

Each command runs as a real process whose standard output is a pseudo-terminal,
as an operator's shell gives it: the bar is redrawn in place (``\\r``) and must
end full, ``[####…] N/N completed``, followed by the command's summary.

``transaction=True``: the commands are other processes reading the test's rows.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import transaction

from durable.models import Job
from tests.conftest import BASE_DIR, wait_until

from .dataset import TEST_EXCLUDE, alias_url, make_dataset
from .helpers import drain
from .opscenarios import FILES, proc_state, write_files
from .test_backup_restore import read_until

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "other"]),
    pytest.mark.slow,
]

FULL_BAR = re.compile(r"\r\[#{30}\] (\d+)/(\d+) completed\r?\n")
EXCLUDES = [arg for label in TEST_EXCLUDE for arg in ("--exclude", label)]


def on_a_terminal(workers, args: list[str], env: dict[str, str], timeout: float = 120.0):
    """Run ``manage.py ARGS`` with a pty as stdout/stderr: (exit code, everything it wrote)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR, env={**workers.env(), **env}, stdin=subprocess.DEVNULL,
        stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return proc.returncode, output.decode(errors="replace")


def assert_full_bar(output: str) -> None:
    bars = FULL_BAR.findall(output)
    assert bars, output
    done, total = bars[-1]
    assert done == total, output


@pytest.fixture
def places(tmp_path: Path, settings) -> dict[str, str]:
    backups, scan, src, dst = (tmp_path / n for n in ("backups", "scan", "src", "dst"))
    for path in (backups, scan, src, dst):
        path.mkdir()
    settings.DURABLE_BACKUP_DIR = backups
    settings.RECOVERY_IMPORT_DIRS = [str(tmp_path)]
    return {
        "DURABLE_BACKUP_DIR": str(backups),
        "TEST_SCAN_ROOT": str(scan),
        "TEST_OTHER_DATABASE_URL": alias_url("other"),
        "FILE_STORAGES": f"src={src},dst={dst}",
        "RECOVERY_IMPORT_DIRS": str(tmp_path),
    }


def test_backup_restore_copy_and_scan_draw_a_bar_that_ends_full(workers, places, tmp_path):
    make_dataset(samples=6)
    write_files(tmp_path / "scan", FILES)
    runs = [
        (["backup_database", "--name", "tty", "--batch-size", "3", "--inline", *EXCLUDES],
         "backup tty published and verified"),
        (["restore_database", "tty", "--replace", "--inline", *EXCLUDES],
         "every table's digest matches the backup"),
        (["copy_database", "--target", "other", "--replace", "--inline", *EXCLUDES],
         "row counts and checksums match"),
        (["integrity_scan", "--storage", "scan", "--batch-files", "4", "--inline"],
         "scanned storage:scan:"),
        (["integrity_scan", "--database", "other", "--inline"], "scanned database:other"),
    ]  # fmt: skip
    for args, summary in runs:
        code, output = on_a_terminal(workers, args, places)
        assert code == 0, output
        assert_full_bar(output)
        assert summary in output.split("completed", 1)[-1], output


def test_move_files_and_import_draw_a_bar_that_ends_full(workers, places, tmp_path):
    write_files(tmp_path / "src", FILES)
    code, output = on_a_terminal(workers, ["move_files", "src", "dst", "--wait"], places)
    assert code == 0, output
    assert_full_bar(output)
    assert f"moved {len(FILES)} file(s)" in output
    export = tmp_path / "export.csv"
    export.write_text("type,detail\n" + "".join(f"integrity-ok,row {n}\n" for n in range(7)))
    code, output = on_a_terminal(
        workers, ["import_recovery_events", str(export), "--batch", "2", "--wait"], places
    )
    assert code == 0, output
    assert_full_bar(output)
    assert "Imported 7 events from 7 rows" in output


def test_move_files__ctrl_c_releases_the_job_at_a_file_boundary(workers, places, tmp_path):
    """Ctrl-C in ``move_files --wait``: the file in flight finishes, no attempt is spent."""
    write_files(tmp_path / "src", FILES)
    env = {**workers.env(faults="after_checkpoint:2:stop"), **places}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "move_files", "src", "dst", "--wait"],
        cwd=BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: proc_state(proc.pid) == "T", timeout=60)  # two files moved
        job = Job.objects.get(operation="files.move")
        with transaction.atomic():
            # Hold the job's row: the job's thread cannot commit another file until the
            # command has taken the Ctrl-C, so the test does not race it.
            Job.objects.select_for_update().get(pk=job.pk)
            os.kill(proc.pid, signal.SIGINT)  # Ctrl-C, taken when it continues
            os.kill(proc.pid, signal.SIGCONT)
            early = read_until(proc, "interrupted: stopping at the next unit boundary")
        out, _ = proc.communicate(timeout=60)
        out = early + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out
    assert "interrupted: stopping at the next unit boundary" in out
    assert "continues from its checkpoint when run again (no attempt was spent)" in out
    job.refresh_from_db()
    assert (job.state, job.lease_owner, job.attempts) == ("queued", None, 0)
    assert 2 <= job.units_done < job.units_total
    moved = {p.name for p in (tmp_path / "dst").rglob("*") if p.is_file()}
    left = {p.name for p in (tmp_path / "src").rglob("*") if p.is_file()}
    assert moved.isdisjoint(left)  # every file in exactly one place
    assert len(moved | left) == len(FILES)
    # Run again, the command follows the same job to the end.
    code, output = on_a_terminal(workers, ["move_files", "src", "dst", "--wait"], places)
    assert code == 0, output
    assert f"job {job.pk} is already doing this (queued); following it" in output
    assert_full_bar(output)
    assert drain(job.pk).state == "completed"
    assert Job.objects.filter(operation="files.move").count() == 1
