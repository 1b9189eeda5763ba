"""SQLite: what a worker running atomic units back to back costs the other workers.

    python bench/writer_turns.py [--units 400] [--unit-ms 80] [--long 5] [--lease 1]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/writer_turns.py

Three runs on a scratch database (the test operations of tests.settings), each
baseline measured in the same run:

1. *peers alone*: two ``runworker`` processes (``--lease-seconds LEASE``) start and
   share one ordinary unit of LONG seconds: start-up (until ``worker started``)
   and the time until that job completes;
2. *hog alone*: one worker runs UNITS atomic units of UNIT_MS each: units/s;
3. *together*: the hog starts first; once its units run, the two peers start.
   Reported: the peers' start-up and the long job's completion time against run
   1, the hog's units/s against run 2, and what must stay zero — reclaims,
   failed attempts, "database is locked" and "lease lost" in any log, a second
   run of the long unit.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from _setup import BASE_DIR, configure

STARTED = re.compile(r"msg=\"worker started\"")


def worker(args: list[str], lease: float, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "manage.py", "runworker", "--lease-seconds", str(lease)]
    cmd += ["--poll-interval", "0.05", *args]
    env = {**os.environ, "LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    handle = open(log, "w")  # noqa: SIM115 - the process owns it until it exits
    return subprocess.Popen(cmd, cwd=BASE_DIR, env=env, stdout=handle, stderr=handle)


def wait_for(predicate, timeout: float = 300.0, interval: float = 0.02) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out waiting for {predicate}")
        time.sleep(interval)
    return time.monotonic() - started


def long_job(tmp: Path, tag: str, long: float):
    from durable.jobs import enqueue

    out = tmp / f"{tag}-long.log"
    return enqueue("test.append", {"units": 1, "path": str(out), "sleep": long}), out


def peers_run(tmp: Path, tag: str, lease: float, job, out: Path) -> tuple[dict, list]:
    """Start two peers sharing one long ordinary unit; return figures and their logs."""
    from durable.models import Job

    logs = [tmp / f"{tag}-peer-{n}.log" for n in range(2)]
    started = time.monotonic()
    procs = [worker(["--operation", "test.append"], lease, log) for log in logs]
    for log in logs:
        wait_for(lambda log=log: bool(STARTED.search(log.read_text())))
    up = time.monotonic() - started  # both have registered and recovered
    wait_for(lambda: Job.objects.get(pk=job.pk).state in ("completed", "failed"))
    done = time.monotonic() - started
    for proc in procs:
        proc.terminate()
        proc.wait(30)
    job.refresh_from_db()
    begins = out.read_text().count("begin ") if out.exists() else 0
    figures = {
        "start_s": up,
        "long_job_s": done,
        "reclaims": job.reclaims,
        "attempts": job.attempts,
        "long_unit_runs": begins,
    }
    return figures, logs


def hog_start(tmp: Path, tag: str, lease: float, units: int, unit_ms: int):
    from durable.jobs import enqueue

    job = enqueue("test.rows", {"units": units, "sleep": unit_ms / 1000})
    log = tmp / f"{tag}-hog.log"
    return job, worker(["--burst", "--operation", "test.rows"], lease, log), log


def hog_rate(job) -> float:
    """Units/s between the job's claim and its completion, from its own timestamps."""
    job.refresh_from_db()
    return job.units_done / (job.finished_at - job.started_at).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=400)
    parser.add_argument("--unit-ms", type=int, default=80)
    parser.add_argument("--long", type=float, default=5.0)
    parser.add_argument("--lease", type=float, default=1.0)
    args = parser.parse_args()
    url = configure("writer-turns.sqlite3")
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    from durable.models import Job

    tmp = Path(tempfile.mkdtemp(prefix="writer-turns-"))
    print(f"database: {url.split('://')[0]}; logs in {tmp}")

    alone, _ = peers_run(tmp, "alone", args.lease, *long_job(tmp, "alone", args.long))
    print(
        f"1. peers alone:  up in {alone['start_s']:.2f} s, long job done in "
        f"{alone['long_job_s']:.2f} s"
    )

    job, proc, _ = hog_start(tmp, "solo", args.lease, args.units, args.unit_ms)
    proc.wait(600)
    solo = hog_rate(job)
    print(f"2. hog alone:    {solo:.2f} atomic units/s ({args.unit_ms} ms each)")

    # Enqueued first: before the turns, an enqueue while the atomic units ran could
    # wait out the busy timeout and fail with "database is locked".
    waiting_job = long_job(tmp, "mixed", args.long)
    job, proc, hog_log = hog_start(tmp, "mixed", args.lease, args.units, args.unit_ms)
    wait_for(lambda: Job.objects.get(pk=job.pk).units_done >= 3)
    mixed, logs = peers_run(tmp, "mixed", args.lease, *waiting_job)
    proc.wait(600)
    rate = hog_rate(job)
    text = "\n".join(path.read_text() for path in [hog_log, *logs])
    locked, lost = text.count("database is locked"), text.count("lease lost")
    print(
        f"3. together:     peers up in {mixed['start_s']:.2f} s "
        f"(x{mixed['start_s'] / alone['start_s']:.2f} of alone), long job done in "
        f"{mixed['long_job_s']:.2f} s (x{mixed['long_job_s'] / alone['long_job_s']:.2f}); "
        f"hog {rate:.2f} units/s (x{rate / solo:.2f} of alone)"
    )
    job.refresh_from_db()
    print(
        f"   must be zero: reclaims {mixed['reclaims'] + job.reclaims}, failed attempts "
        f"{mixed['attempts'] + job.attempts}, 'database is locked' {locked}, "
        f"'lease lost' {lost}, extra runs of the long unit {mixed['long_unit_runs'] - 1}"
    )
    if mixed["reclaims"] or job.reclaims or mixed["attempts"] or locked or lost:
        raise SystemExit("WRITER TURNS FAILED")
    if mixed["long_unit_runs"] != 1:
        raise SystemExit("WRITER TURNS FAILED")


if __name__ == "__main__":
    main()
