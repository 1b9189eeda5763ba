"""Kill torture: a big ``recovery.ingest`` whose workers are SIGKILLed 0.8-3 s after each start.

    python bench/ingest_torture.py [--lines 300000] [--kills 15] [--life 0.8 3.0] [--seed N]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_torture python bench/ingest_torture.py

A crash-looping deploy, an OOM killer: ``--kills`` times in a row a real
``runworker`` process is started and SIGKILLed after a random moment between
the two ``--life`` bounds; then one last worker is left to finish. Each worker
takes the job back at start (its predecessor's process is gone) and must
commit something before it dies: units are sized in time (``durable.pacing``),
small first after a claim, so even a worker that lives one second does.

Prints, for each worker: how long it lived, how long it took from process
start to its claim (the ``started`` event), the units and lines it committed;
then the result: the job's state, lines imported against lines in the file,
duplicates (must be 0), and ``result=ok`` or ``result=FAILED``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from _setup import BASE_DIR, configure
from ingest import reset, write_lines

# A developer's own deployment settings must not reach the workers (they would ingest
# the real recovery-events.jsonl, or run its fault points).
HOST_ONLY = (
    "RECOVERY_EVENTS_FILE",
    "WEKAN_FERRETDB_SQLITE_DIR",
    "FERRETDB_SQLITE_DIR",
    "WEKAN_SQLITE_DIR",
    "DURABLE_FAULTS",
)


def worker_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HOST_ONLY}
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="recovery.settings", LOG_LEVEL="WARNING")
    env["RECOVERY_INGEST_INTERVAL"] = "0"  # no periodic ingest of its own
    return env


def start_worker(env: dict[str, str], lease: float, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "manage.py", "runworker", "--lease-seconds", str(lease)]
    cmd += ["--poll-interval", "0.05"]
    with open(log, "a") as handle:
        return subprocess.Popen(cmd, cwd=BASE_DIR, env=env, stdout=handle, stderr=handle)


def state_of(job_id: int) -> tuple[str, int, int]:
    """(state, units done, lines imported) as committed."""
    from durable.models import Job
    from recovery.models import RecoveryEvent

    job = Job.objects.get(pk=job_id)
    lines = RecoveryEvent.objects.filter(source_line__isnull=False).count()
    return job.state, job.units_done, lines


def claim_after(job_id: int, started: datetime) -> float | None:
    """Seconds from a worker's start to its claim of the job (None: it never claimed)."""
    from durable.models import JobEvent

    event = (
        JobEvent.objects.filter(job_id=job_id, kind="started", created_at__gte=started)
        .order_by("seq")
        .first()
    )
    return None if event is None else (event.created_at - started).total_seconds()


def one_life(job_id: int, env: dict, args: argparse.Namespace, life: float | None, log: Path):
    """Start a worker; SIGKILL it after ``life`` seconds (None: let it finish the job)."""
    from django.db import close_old_connections

    before = state_of(job_id)
    started_at = datetime.now(UTC)
    proc = start_worker(env, args.lease, log)
    began = time.monotonic()
    deadline = began + (life if life is not None else args.finish_timeout)
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01 if life is not None else 0.2)
        if life is None and state_of(job_id)[0] not in ("queued", "running"):
            break  # finished: the last worker is stopped politely
    lived = time.monotonic() - began
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if life is not None else signal.SIGTERM)
        proc.wait(timeout=60)
    close_old_connections()
    after = state_of(job_id)
    return {
        "lived": lived,
        "claim": claim_after(job_id, started_at),
        "units": after[1] - before[1],
        "lines": after[2] - before[2],
        "state": after[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=300_000)
    parser.add_argument("--kills", type=int, default=15)
    parser.add_argument("--life", type=float, nargs=2, default=(0.8, 3.0), metavar=("MIN", "MAX"))
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--finish-timeout", type=float, default=600.0)
    args = parser.parse_args()
    seed = args.seed or random.randrange(1, 10**6)
    rng = random.Random(seed)
    url = configure("bench-torture.sqlite3")
    from django.db import connection

    from durable import jobs
    from durable.models import Job
    from recovery.models import RecoveryEvent

    print(f"database: {connection.vendor} ({url.split('@')[-1]}); seed {seed}")
    reset()
    work = BASE_DIR / "var" / "bench-torture"
    work.mkdir(parents=True, exist_ok=True)
    path, log = work / "events.jsonl", work / "workers.log"
    log.write_text("")
    valid = write_lines(path, 0, args.lines, mode="w")
    env = worker_env(url)
    job = jobs.enqueue("recovery.ingest", {"path": str(path)}, owner="torture")
    connection.close()  # the workers write; this process only reads between lives
    started = time.monotonic()
    lives = []
    try:
        for n in range(args.kills):
            life = one_life(job.pk, env, args, rng.uniform(*args.life), log)
            lives.append(life)
            claim = "never" if life["claim"] is None else f"{life['claim']:.2f} s"
            print(
                f"worker {n + 1:2}: killed after {life['lived']:.2f} s; claimed after {claim}; "
                f"committed {life['units']} units, {life['lines']:,} lines; job {life['state']}"
            )
            if life["state"] not in ("queued", "running"):
                break
        final = one_life(job.pk, env, args, None, log)
        print(
            f"last worker: ran {final['lived']:.2f} s; committed {final['units']} units, "
            f"{final['lines']:,} lines; job {final['state']}"
        )
    finally:
        elapsed = time.monotonic() - started
        job = Job.objects.get(pk=job.pk)
        imported = RecoveryEvent.objects.filter(source_line__isnull=False).count()
        distinct = (
            RecoveryEvent.objects.filter(source_line__isnull=False)
            .values("source_line")
            .distinct()
            .count()
        )
        path.unlink(missing_ok=True)
    claims = [life["claim"] for life in lives if life["claim"] is not None]
    killed = [life for life in lives if life["state"] in ("queued", "running")]
    progressed = sum(1 for life in killed if life["units"] > 0)
    nan = float("nan")
    print(
        f"kills mid-job: {len(killed)}; of them committed before their kill: {progressed}; "
        f"start-to-claim median {statistics.median(claims) if claims else nan:.2f} s "
        f"(min {min(claims, default=nan):.2f}, max {max(claims, default=nan):.2f})"
    )
    print(
        f"job {job.pk}: {job.state} after {elapsed:.1f} s, {job.units_done} units, "
        f"{job.reclaims} reclaims, attempts {job.attempts}; reason: {job.reason or '-'}"
    )
    ok = job.state == "completed" and imported == valid and distinct == imported
    print(
        f"lines: {valid:,} valid in the file, {imported:,} imported, "
        f"{imported - distinct} duplicates; result={'ok' if ok else 'FAILED'}"
    )
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
