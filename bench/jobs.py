"""Small jobs: drain rate, enqueue rate and enqueue→start latency against raw commit rates.

    python bench/jobs.py [--jobs N] [--pings P] [--bulk B]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/jobs.py

Most jobs in a real site are one unit (a webhook, a mail): their cost is the
claim and the finish, not the unit. Printed, in one run on the database of
``DATABASE_URL`` (default: a scratch SQLite file):

- the raw commit rates of this machine through Django's connection: one
  single-row ``UPDATE`` per transaction, and an ``UPDATE`` + ``INSERT`` per
  transaction (measured before and after the workers; the ratios use the mean);
- the drain rate of N one-unit ``durable.noop`` jobs by one ``runworker
  --burst`` process at ``--concurrency 1`` and ``8`` (window: first claim to
  last completion, process start-up excluded), as ratios of those rates, and
  how many claim statements each drain took; ``8`` once more with
  ``--claim-batch 1`` (every thread claiming alone), and the ratio of the two
  (issue 12's item 5: does sharing a claim pay?);
- enqueue rates: ``enqueue()`` one job per transaction, and ``enqueue_many``
  of ``--bulk`` jobs in one call;
- the enqueue→start latency (p50/p95) of ``--pings`` jobs enqueued one at a
  time into an idle worker started with the default ``--poll-interval``, each
  after a random pause (so a poll timer cannot line up with the pings),
  measured from the ``enqueue()`` call (its own commit included) to the
  worker's ``started_at`` (``--latency-only``: just this).

Targets (issue 12): drain at concurrency 8 >= 0.30 x the single-UPDATE rate
on PostgreSQL (>= 0.10 x UPDATE+INSERT on SQLite), at concurrency 1 >= 0.20 x
(>= 0.08 x); latency p50/p95 <= 5/25 ms on PostgreSQL, <= 50/150 ms on SQLite;
``enqueue_many`` of 10,000 jobs >= 10,000 jobs/s (PostgreSQL), >= 20,000 (SQLite).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

from _setup import BASE_DIR, configure


def _timed_loop(seconds: float, body) -> float:
    """Transactions per second of ``body(n)`` run back to back for about ``seconds``."""
    n = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        for _ in range(50):
            body(n)
            n += 1
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - started)


def raw_rates(seconds: float) -> tuple[float, float]:
    """(single UPDATE per transaction, UPDATE + INSERT per transaction), through Django."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_counter")
        cursor.execute("DROP TABLE IF EXISTS bench_log")
        cursor.execute("CREATE TABLE bench_counter (id integer PRIMARY KEY, n integer)")
        cursor.execute("CREATE TABLE bench_log (id integer PRIMARY KEY, n integer, key text)")
        cursor.execute("INSERT INTO bench_counter VALUES (1, 0)")

    def update(n: int) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE bench_counter SET n = %s WHERE id = 1", [n])

    def update_insert(n: int) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE bench_counter SET n = %s WHERE id = 1", [n])
            cursor.execute("INSERT INTO bench_log (id, n, key) VALUES (%s, %s, %s)", [n, n, "k"])

    try:
        return _timed_loop(seconds, update), _timed_loop(seconds, update_insert)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE bench_counter")
            cursor.execute("DROP TABLE bench_log")


def _reset() -> None:
    from durable.models import Job

    Job.objects.all().delete()


def _fill(count: int) -> None:
    """Enqueue ``count`` one-unit jobs as fast as this version of the engine can."""
    from django.db import transaction

    from durable import jobs

    if hasattr(jobs, "enqueue_many"):
        for start in range(0, count, 5000):
            jobs.enqueue_many("durable.noop", [{"units": 1}] * min(5000, count - start))
    else:
        with transaction.atomic():
            for _ in range(count):
                jobs.enqueue("durable.noop", {"units": 1})
    _vacuum()


def _vacuum() -> None:
    """PostgreSQL: start each measurement from tables without dead rows.

    Every drain leaves a dead row version per job, event and result. With
    autovacuum off (as on some development servers) or behind, they pile up
    across the runs of one benchmark, and each later run would pay for the
    earlier ones' — the claim's index scan steps over them.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for table in ("durable_job", "durable_jobevent", "durable_unitresult"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def _worker_cmd(*extra: str) -> list[str]:
    return [sys.executable, "manage.py", "runworker", *extra]


def drain(count: int, concurrency: int, claim_batch: int | None = None) -> tuple[float, int]:
    """(jobs/s, claim statements) of one burst worker process draining ``count`` one-unit jobs.

    The claim statements are counted from the jobs: every job one statement
    claimed has that statement's ``started_at``.
    """
    from django.db.models import Max, Min

    from durable.models import Job

    _reset()
    _fill(count)
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    cmd = _worker_cmd("--burst", "--concurrency", str(concurrency))
    if claim_batch is not None:
        cmd += ["--claim-batch", str(claim_batch)]
    proc = subprocess.run(cmd, cwd=BASE_DIR, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"worker exited {proc.returncode}")
    states = set(Job.objects.values_list("state", flat=True))
    if states != {"completed"}:
        raise SystemExit(f"jobs ended {states}")
    window = Job.objects.aggregate(start=Min("started_at"), end=Max("finished_at"))
    claims = Job.objects.values("started_at").distinct().count()
    return count / (window["end"] - window["start"]).total_seconds(), claims


def enqueue_single(seconds: float) -> float:
    from durable.jobs import enqueue

    _reset()
    return _timed_loop(seconds, lambda n: enqueue("durable.noop", {"units": 1}))


def enqueue_bulk(count: int) -> float | None:
    from durable import jobs

    if not hasattr(jobs, "enqueue_many"):
        return None
    _reset()
    started = time.perf_counter()
    jobs.enqueue_many("durable.noop", [{"units": 1}] * count)
    return count / (time.perf_counter() - started)


def latency(pings: int) -> list[float]:
    """Seconds from the enqueue() call to the worker's claim, for each ping."""
    from durable.jobs import enqueue
    from durable.models import Job

    _reset()
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(_worker_cmd("--concurrency", "1"), cwd=BASE_DIR, env=env)
    try:
        # Warm up: the first job also waits for the worker's start-up.
        job = enqueue("durable.noop", {"units": 1})
        _wait_started(job.pk, 60)
        samples = []
        rng = random.Random(12)
        for _ in range(pings):
            time.sleep(rng.uniform(0.05, 0.4))
            # From the call, not its return: the worker may claim before enqueue()
            # returns (its post-commit signals run after the NOTIFY went out), so
            # the return would understate; this includes enqueue's own commit.
            called = time.time()
            job = enqueue("durable.noop", {"units": 1})
            started_at = _wait_started(job.pk, 10)
            samples.append(started_at - called)
        return samples
    finally:
        proc.terminate()
        proc.wait(30)
        Job.objects.all().delete()


def _wait_started(job_id: int, timeout: float) -> float:
    from durable.models import Job

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = Job.objects.filter(pk=job_id).values_list("started_at", flat=True).first()
        if started is not None:
            return started.timestamp()
        time.sleep(0.002)
    raise SystemExit(f"job {job_id} did not start within {timeout}s")


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per drain")
    parser.add_argument("--pings", type=int, default=60)
    parser.add_argument("--bulk", type=int, default=10_000)
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument("--latency-only", action="store_true", help="only the pings")
    args = parser.parse_args()
    url = configure("bench-jobs.sqlite3")
    from django.db import connection

    pg = connection.vendor == "postgresql"
    print(f"database: {connection.vendor} ({url.split('@')[-1]}); source: {BASE_DIR}")
    if args.latency_only:
        _print_latency(latency(args.pings), pg)
        return
    update_1, pair_1 = raw_rates(args.raw_seconds)
    print(f"raw commits: UPDATE {update_1:,.0f} tx/s; UPDATE+INSERT {pair_1:,.0f} tx/s")
    # Concurrency 8 twice: with the claim desk as shipped, and with every
    # thread claiming alone (--claim-batch 1), the baseline of issue 12 item 5.
    runs = {"1": (1, None), "8": (8, None), "8, --claim-batch 1": (8, 1)}
    drains = {name: drain(args.jobs, c, batch) for name, (c, batch) in runs.items()}
    single = enqueue_single(args.raw_seconds)
    bulk = enqueue_bulk(args.bulk)
    samples = latency(args.pings)
    update_2, pair_2 = raw_rates(args.raw_seconds)
    print(f"raw commits again: UPDATE {update_2:,.0f} tx/s; UPDATE+INSERT {pair_2:,.0f} tx/s")
    update, pair = (update_1 + update_2) / 2, (pair_1 + pair_2) / 2
    base, base_name = (update, "UPDATE") if pg else (pair, "UPDATE+INSERT")
    targets = {1: 0.20 if pg else 0.08, 8: 0.30 if pg else 0.10}
    for name, (rate, claims) in drains.items():
        target = targets[runs[name][0]]
        print(
            f"drain {args.jobs} one-unit jobs, 1 process, --concurrency {name}: "
            f"{rate:,.0f} jobs/s = {rate / base:.2f} x raw {base_name} (target >= {target:.2f}); "
            f"{claims:,} claim statements, {args.jobs / claims:.2f} jobs each"
        )
    shared, alone = drains["8"][0], drains["8, --claim-batch 1"][0]
    print(
        f"claim desk at --concurrency 8: {shared / alone:.2f} x the drain of threads claiming alone"
    )
    print(f"enqueue(), one per transaction: {single:,.0f} jobs/s = {single / pair:.2f} x raw pair")
    if bulk is None:
        print("enqueue_many: not available in this version")
    else:
        target = 10_000 if pg else 20_000
        print(f"enqueue_many of {args.bulk:,}: {bulk:,.0f} jobs/s (target >= {target:,})")
    _print_latency(samples, pg)


def _print_latency(samples: list[float], pg: bool) -> None:
    p50, p95 = _pct(samples, 0.50) * 1000, _pct(samples, 0.95) * 1000
    goal = "5 / 25" if pg else "50 / 150"
    print(
        f"enqueue->start over {len(samples)} pings: p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
        f"max {max(samples) * 1000:.1f} ms, mean {statistics.mean(samples) * 1000:.1f} ms "
        f"(target <= {goal} ms; from the enqueue() call, its own commit included)"
    )


if __name__ == "__main__":
    main()
