"""Django tasks against ``durable.noop`` jobs: enqueue and drain rates, measured in one run.

    python bench/tasks.py [--jobs N] [--processes P]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/tasks.py

Enqueue: N ``durable.noop`` jobs of one unit through ``durable.jobs.enqueue``,
then N ``nothing.enqueue()`` tasks, then the no-op jobs again (their mean is
the baseline: a busy machine shows as a gap between the two). Drain:
``runworker --burst`` with P processes over N no-op jobs, then N tasks, then N
tasks of three durable steps each; the rate is over the window from the first
claim to the last completion (process start-up excluded). A task is a no-op
job plus the framework's work: building its TaskResult for ``task_started``
and ``task_finished`` (two reads of its events) and importing its module.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _setup import BASE_DIR, configure


def enqueue_rate(count: int, kind: str) -> float:
    from durable.jobs import enqueue

    started = time.perf_counter()
    if kind == "noop":
        for _ in range(count):
            enqueue("durable.noop", {"units": 1})
    else:
        from bench.bench_tasks import nothing

        for _ in range(count):
            nothing.enqueue()
    return count / (time.perf_counter() - started)


def drain(count: int, kind: str, processes: int) -> float:
    from django.db.models import Max, Min

    from durable.jobs import enqueue
    from durable.models import Job

    Job.objects.all().delete()
    if kind == "noop":
        for _ in range(count):
            enqueue("durable.noop", {"units": 1})
    else:
        from bench import bench_tasks

        for _ in range(count):
            getattr(bench_tasks, kind).enqueue()
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    cmd = [sys.executable, "manage.py", "runworker", "--burst", "--poll-interval", "0.05"]
    procs = [subprocess.Popen(cmd, cwd=BASE_DIR, env=env) for _ in range(processes)]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"worker exited {proc.returncode}")
    states = set(Job.objects.values_list("state", flat=True))
    if states != {"completed"}:
        raise SystemExit(f"{kind}: jobs ended {states}")
    window = Job.objects.aggregate(start=Min("started_at"), end=Max("finished_at"))
    return count / (window["end"] - window["start"]).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    url = configure("bench-tasks.sqlite3")
    from django.db import connection

    from durable.models import Job

    print(f"database: {connection.vendor} ({url.split('@')[-1]})")
    noop_before = enqueue_rate(args.jobs, "noop")
    task_rate = enqueue_rate(args.jobs, "task")
    noop_after = enqueue_rate(args.jobs, "noop")
    noop = (noop_before + noop_after) / 2
    Job.objects.all().delete()
    print(
        f"enqueue: durable.noop {noop:,.0f}/s (before {noop_before:,.0f}, after "
        f"{noop_after:,.0f}); task.enqueue() {task_rate:,.0f}/s = {task_rate / noop:.0%}"
    )
    drained = {kind: drain(args.jobs, kind, args.processes) for kind in ("noop", "nothing")}
    drained["three_steps"] = drain(args.jobs, "three_steps", args.processes)
    print(
        f"drain ({args.processes} worker process(es), {args.jobs} each): "
        f"durable.noop (1 unit) {drained['noop']:,.0f} jobs/s; "
        f"task {drained['nothing']:,.0f}/s = {drained['nothing'] / drained['noop']:.0%}; "
        f"task of 3 steps {drained['three_steps']:,.0f}/s = "
        f"{drained['three_steps'] / drained['noop']:.0%}"
    )


if __name__ == "__main__":
    main()
