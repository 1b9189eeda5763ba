"""What one worker process spends per one-unit job and per checkpointed unit: CPU and instructions.

    python bench/cost.py [--jobs N] [--units U] [--rounds R] [--callgrind]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/cost.py

Rates in jobs/s (``bench/jobs.py``, ``bench/throughput.py``) swing with whatever
else the machine does; on a shared two-core machine two runs minutes apart can
differ by half. This script measures what the worker's own code costs, which is
what a change to the engine's code moves, so that two trees can be compared
without a quiet machine:

- ``cpu``: user + system CPU seconds of one ``runworker --burst --concurrency 1``
  process (from ``os.wait4``), draining N one-unit ``durable.noop`` jobs, and
  then one job of U units; minus the CPU of an idle burst (start-up, migrations
  check, shutdown), divided by N and by U. The database server's CPU is not in it.
- ``--callgrind`` (needs ``valgrind``): the same three bursts under
  ``valgrind --tool=callgrind``, counting instructions (``Ir``) instead: repeatable
  to about 1% whatever the load. Much slower: use a few hundred jobs.

The script measures the tree it runs from (the current directory): to compare a
change with its base, check the base out beside it (``git worktree add
../base BASE``) and run ``python /path/to/this/bench/cost.py`` from each tree in
turn, alternating, in one window.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

TREE = Path.cwd()
sys.path.insert(0, str(TREE / "bench"))

from _setup import configure  # noqa: E402


def _burst(callgrind: bool) -> float:
    """CPU seconds (or instructions, under callgrind) of one burst worker process."""
    env = {**os.environ, "LOG_LEVEL": "WARNING", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "manage.py", "runworker", "--burst", "--concurrency", "1"]
    if callgrind:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
        done = subprocess.run(cmd, cwd=TREE, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"worker exited {done.returncode}: {done.stderr[-2000:]}")
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise SystemExit("callgrind printed no instruction count")
        return float(found.group(1))
    proc = subprocess.Popen(cmd, cwd=TREE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"worker exited with status {status}")
    return usage.ru_utime + usage.ru_stime


def _vacuum(*tables: str) -> None:
    """PostgreSQL: no dead rows from the previous burst for the next one to step over."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in tables:
                cursor.execute(f"VACUUM ANALYZE {table}")


def _reset() -> None:
    from durable.models import Job

    Job.objects.all().delete()
    _vacuum("durable_job", "durable_jobevent", "durable_unitresult")


def _drained() -> None:
    from durable.models import Job

    states = set(Job.objects.values_list("state", flat=True))
    if states != {"completed"}:
        raise SystemExit(f"jobs ended {states}")


def one_round(jobs: int, units: int, callgrind: bool) -> tuple[float, float, float]:
    """(idle, per job, per unit) for this tree, idle being the lower of two idle bursts."""
    from durable import jobs as engine

    _reset()
    idle = min(_burst(callgrind), _burst(callgrind))
    for start in range(0, jobs, 5000):
        engine.enqueue_many("durable.noop", [{"units": 1}] * min(5000, jobs - start))
    _vacuum("durable_job")
    many = _burst(callgrind)
    _drained()
    _reset()
    engine.enqueue("durable.noop", {"units": units})
    long = _burst(callgrind)
    _drained()
    return idle, (many - idle) / jobs, (long - idle) / units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--units", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    url = configure("cost.sqlite3")
    vendor = url.split(":", 1)[0]
    for _ in range(args.rounds):
        idle, per_job, per_unit = one_round(args.jobs, args.units, args.callgrind)
        if args.callgrind:
            print(
                f"tree={TREE.name} db={vendor} instructions: start-up {idle / 1e6:,.0f}M, "
                f"per job {per_job / 1e3:,.0f}k, per unit {per_unit / 1e3:,.1f}k"
            )
        else:
            print(
                f"tree={TREE.name} db={vendor} CPU: start-up {idle:.3f} s, "
                f"per job {per_job * 1e3:.3f} ms, per unit {per_unit * 1e3:.4f} ms"
            )


if __name__ == "__main__":
    main()
