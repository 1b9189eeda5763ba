"""Torture run: workers SIGKILLed at random while they work; then check nothing was lost.

    python bench/soak.py [--minutes 2] [--workers 4] [--jobs 200]

Uses the test operations (tests.settings) on a scratch SQLite file, or on
DATABASE_URL. ``test.rows`` units are atomic, so every unit must have exactly
one side-effect row at the end; every job must be completed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from _setup import BASE_DIR, configure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    configure("soak.sqlite3")
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    from durable.jobs import enqueue
    from durable.models import Job
    from tests.testapp.models import SideEffect

    for _ in range(args.jobs):
        enqueue("test.rows", {"units": 20, "sleep": 0.002}, on_restart="resume", max_attempts=1000)
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    cmd = [
        sys.executable,
        "manage.py",
        "runworker",
        "--lease-seconds",
        "2",
        "--poll-interval",
        "0.1",
    ]
    procs = [subprocess.Popen(cmd, cwd=BASE_DIR, env=env) for _ in range(args.workers)]
    kills = 0
    deadline = time.monotonic() + args.minutes * 60
    rng = random.Random(42)
    while time.monotonic() < deadline and Job.objects.exclude(state="completed").exists():
        time.sleep(rng.uniform(0.2, 1.5))
        victim = rng.randrange(len(procs))
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        kills += 1
        procs[victim] = subprocess.Popen(cmd, cwd=BASE_DIR, env=env)
    while Job.objects.exclude(state="completed").exists() and time.monotonic() < deadline + 120:
        time.sleep(0.5)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    states = Counter(Job.objects.values_list("state", flat=True))
    rows = Counter(SideEffect.objects.values_list("job_id", "key"))
    duplicates = sum(1 for count in rows.values() if count > 1)
    missing = args.jobs * 20 - len(rows)
    # A death spends an attempt only if its lease committed no unit: every attempt
    # of these jobs (whose units never fail) is such a death, and no other death is.
    deaths, miscounted = Counter(), 0
    for attempts, errors in Job.objects.values_list("attempts", "errors"):
        lost = [e for e in errors if e["error_class"] == "WorkerLost"]
        deaths.update("spent" if e.get("attempt_spent", True) else "free" for e in lost)
        spent = sum(e.get("attempt_spent", True) for e in lost)
        if len(errors) < 20 and spent != attempts:  # the history keeps the newest 20
            miscounted += 1
    print(f"kills: {kills}; job states: {dict(states)}")
    print(f"unit side effects: {len(rows)} distinct, {duplicates} duplicated, {missing} missing")
    print(
        f"deaths taken back: {deaths['free']} after progress (no attempt spent), "
        f"{deaths['spent']} before any commit; jobs whose attempts disagree: {miscounted}"
    )
    if duplicates or missing or miscounted or set(states) != {"completed"}:
        raise SystemExit("SOAK FAILED")
    print("soak passed: every unit ran exactly once despite the kills")


if __name__ == "__main__":
    main()
