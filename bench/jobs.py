"""Small jobs: drain rate, enqueue rate and enqueue→start latency against raw commit rates.

    python bench/jobs.py [--jobs N] [--pings P] [--bulk B]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/jobs.py

Most jobs in a real site are one unit (a webhook, a mail): their cost is the
claim and the finish, not the unit. Printed, in one run on the database of
``DATABASE_URL`` (default: a scratch SQLite file):

- the database's own commit rate, the limit every figure is a ratio of
  (measured before and after the workers; the ratios use the mean):
  PostgreSQL: ``pgbench -M prepared``, one single-row ``UPDATE`` per
  transaction, 1 client, against a table this script creates (where pgbench
  is not installed, the rate through Django's cursor stands in, and says so);
  SQLite: Python's ``sqlite3`` module on a file beside the benchmark's
  database, WAL, ``synchronous=NORMAL``, one ``UPDATE`` + one ``INSERT`` per
  transaction. The same two loops through Django's cursor are printed beside
  them: that is our client path, not the database's limit;
- the drain rate of N one-unit ``durable.noop`` jobs by one ``runworker
  --burst`` process at ``--concurrency 1`` and ``8`` (window: first claim to
  last completion, process start-up excluded), as ratios of the raw rate, and
  how many commits (claims and finishes) each drain took; ``8`` once more with
  ``--claim-batch 1`` (every thread claiming alone), and the ratio of the two;
- enqueue rates: ``enqueue()`` one job per transaction (as a ratio of the raw
  rate), and ``enqueue_many`` of ``--bulk`` jobs in one call;
- the enqueue→start latency (p50/p95) of ``--pings`` jobs enqueued one at a
  time into an idle worker started with the default ``--poll-interval``, each
  after a random pause (so a poll timer cannot line up with the pings),
  measured from the ``enqueue()`` call (its own commit included) to the
  worker's ``started_at`` (``--latency-only``: just this).

``--enqueue-only``: just ``enqueue()`` one job per transaction and the
enqueue→start latency — the figures of issue 23's single enqueue. On a shared
machine the database's commit rate swings several-fold within a minute, so the
raw rate and the enqueue rate are measured in ``--rounds`` alternating slices
and each slice's ratio printed with their median; beside them the client CPU
per enqueue (this process's: on PostgreSQL the server's work is excluded, on
SQLite the library's is in it), the figure that moves least with the
neighbours' load.

Targets, one worker process (raw: pgbench's single-UPDATE rate on PostgreSQL,
sqlite3's UPDATE+INSERT rate on SQLite):

=====================================  ===============  ==============
figure                                 PostgreSQL       SQLite (WAL)
=====================================  ===============  ==============
drain, ``--concurrency 8``             >= 0.35 x raw    >= 0.10 x raw
drain, ``--concurrency 1``             >= 0.25 x raw    >= 0.08 x raw
drain at 8 vs 1                        not slower       not slower
``enqueue()``, one per transaction     >= 0.50 x raw    >= 0.15 x raw
enqueue->start p50 / p95               <= 5 / 25 ms     <= 20 / 60 ms
``enqueue_many`` of 10,000             >= 10,000 /s     >= 20,000 /s
=====================================  ===============  ==============
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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


def django_rates(seconds: float) -> tuple[float, float]:
    """(single UPDATE per transaction, UPDATE + INSERT per transaction), through Django's
    cursor: our own client path, printed beside the database's limit."""
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


_PGBENCH_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")


def pgbench_rate(seconds: float) -> float | None:
    """PostgreSQL's own limit: ``pgbench -M prepared``, one single-row UPDATE per
    transaction, 1 client, on a table created here. None where pgbench is missing."""
    from django.db import connection

    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_pgbench")
        cursor.execute("CREATE TABLE bench_pgbench (id integer PRIMARY KEY, n bigint)")
        cursor.execute("INSERT INTO bench_pgbench VALUES (1, 0)")
    conf = connection.settings_dict
    env = {**os.environ, "PGPASSWORD": conf.get("PASSWORD") or ""}
    args = ["-h", conf.get("HOST") or "127.0.0.1", "-p", str(conf.get("PORT") or 5432)]
    args += ["-U", conf.get("USER") or "postgres"]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            script = Path(scratch) / "update.sql"
            script.write_text("UPDATE bench_pgbench SET n = n + 1 WHERE id = 1;\n")
            cmd = [pgbench, "-n", "-M", "prepared", "-c", "1", "-j", "1"]
            cmd += ["-T", str(max(1, round(seconds))), "-f", str(script), *args, conf["NAME"]]
            out = subprocess.run(
                cmd,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE bench_pgbench")
    found = _PGBENCH_TPS.search(out)
    if found is None:
        raise SystemExit(f"pgbench printed no tps:\n{out}")
    return float(found.group(1))


def sqlite_rate(seconds: float) -> float:
    """SQLite's own limit: Python's sqlite3 on a file beside the benchmark's database, WAL,
    synchronous=NORMAL, one UPDATE + one INSERT per transaction."""
    path = BASE_DIR / "var" / "bench-raw.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE counter (id integer PRIMARY KEY, n integer)")
        db.execute("CREATE TABLE log (id integer PRIMARY KEY, n integer, key text)")
        db.execute("INSERT INTO counter VALUES (1, 0)")

        def update_insert(n: int) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE counter SET n = ? WHERE id = 1", (n,))
            db.execute("INSERT INTO log (id, n, key) VALUES (?, ?, ?)", (n, n, "k"))
            db.execute("COMMIT")

        return _timed_loop(seconds, update_insert)
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


@dataclass(frozen=True)
class Raw:
    """One measurement of the limits: the database's own, and our client path's."""

    limit: float  # pgbench UPDATE (PostgreSQL) or sqlite3 UPDATE+INSERT (SQLite), tx/s
    limit_name: str
    django_update: float
    django_pair: float

    @staticmethod
    def mean(a: Raw, b: Raw) -> Raw:
        return Raw(
            (a.limit + b.limit) / 2,
            a.limit_name,
            (a.django_update + b.django_update) / 2,
            (a.django_pair + b.django_pair) / 2,
        )


def raw_rates(seconds: float, pg: bool) -> Raw:
    django_update, django_pair = django_rates(seconds)
    if not pg:
        return Raw(sqlite_rate(seconds), "sqlite3 UPDATE+INSERT", django_update, django_pair)
    limit = pgbench_rate(seconds)
    if limit is None:
        name = "UPDATE through Django (pgbench missing)"
        return Raw(django_update, name, django_update, django_pair)
    return Raw(limit, "pgbench UPDATE", django_update, django_pair)


def _print_raw(label: str, raw: Raw) -> None:
    print(
        f"{label}: {raw.limit_name} {raw.limit:,.0f} tx/s (the limit); through Django's "
        f"cursor: UPDATE {raw.django_update:,.0f} tx/s, UPDATE+INSERT {raw.django_pair:,.0f} tx/s"
    )


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
    """(jobs/s, commits) of one burst worker process draining ``count`` one-unit jobs.

    The commits are counted from the jobs: a commit stamps what it wrote with its
    moment, so every job one claim took has that claim's ``started_at``, and a job
    claimed by the finish of the job before it (issue 23) has that finish's moment
    as its ``started_at`` too. Distinct ``started_at`` and ``finished_at`` moments
    together: the claims and finishes, each counted once.
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
    moments = set(Job.objects.values_list("started_at", flat=True))
    moments |= set(Job.objects.values_list("finished_at", flat=True))
    return count / (window["end"] - window["start"]).total_seconds(), len(moments)


def enqueue_single(seconds: float) -> float:
    return enqueue_single_cpu(seconds)[0]


def enqueue_single_cpu(seconds: float) -> tuple[float, float]:
    """(enqueue() calls per second, one job per transaction; this process's CPU
    seconds per call)."""
    from durable.jobs import enqueue

    _reset()
    calls = [0]

    def one(n: int) -> None:
        enqueue("durable.noop", {"units": 1})
        calls[0] += 1

    cpu = time.process_time()
    rate = _timed_loop(seconds, one)
    return rate, (time.process_time() - cpu) / calls[0]


def limit_rate(seconds: float, pg: bool) -> float:
    """The database's own limit alone (pgbench / sqlite3), without Django's loops."""
    if not pg:
        return sqlite_rate(seconds)
    rate = pgbench_rate(seconds)
    return rate if rate is not None else django_rates(seconds)[0]


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
    parser.add_argument("--rounds", type=int, default=4, help="--enqueue-only: alternating slices")
    parser.add_argument(
        "--enqueue-only",
        action="store_true",
        help="only the raw rates, enqueue() one per transaction and the pings",
    )
    args = parser.parse_args()
    url = configure("bench-jobs.sqlite3")
    from django.db import connection

    pg = connection.vendor == "postgresql"
    print(f"database: {connection.vendor} ({url.split('@')[-1]}); source: {BASE_DIR}")
    if args.latency_only:
        _print_latency(latency(args.pings), pg)
        return
    if args.enqueue_only:
        _enqueue_only(args, pg)
        return
    raw_1 = raw_rates(args.raw_seconds, pg)
    _print_raw("raw commits", raw_1)
    # Concurrency 8 twice: with the claim desk as shipped, and with every
    # thread claiming alone (--claim-batch 1).
    runs = {"1": (1, None), "8": (8, None), "8, --claim-batch 1": (8, 1)}
    drains = {name: drain(args.jobs, c, batch) for name, (c, batch) in runs.items()}
    single = enqueue_single(args.raw_seconds)
    bulk = enqueue_bulk(args.bulk)
    samples = latency(args.pings)
    raw_2 = raw_rates(args.raw_seconds, pg)
    _print_raw("raw commits again", raw_2)
    raw = Raw.mean(raw_1, raw_2)
    base = raw.limit
    targets = {1: 0.25 if pg else 0.08, 8: 0.35 if pg else 0.10}
    for name, (rate, commits) in drains.items():
        target = targets[runs[name][0]]
        print(
            f"drain {args.jobs} one-unit jobs, 1 process, --concurrency {name}: "
            f"{rate:,.0f} jobs/s = {rate / base:.3f} x raw (target >= {target:.2f}); "
            f"{commits:,} commits (claims and finishes), {commits / args.jobs:.2f} per job"
        )
    one, eight, alone = drains["1"][0], drains["8"][0], drains["8, --claim-batch 1"][0]
    print(f"drain at --concurrency 8: {eight / one:.2f} x the drain at 1 (target: not slower)")
    print(
        f"claim desk at --concurrency 8: {eight / alone:.2f} x the drain of threads claiming alone"
    )
    _print_single(single, raw, pg)
    if bulk is None:
        print("enqueue_many: not available in this version")
    else:
        target = 10_000 if pg else 20_000
        print(f"enqueue_many of {args.bulk:,}: {bulk:,.0f} jobs/s (target >= {target:,})")
    _print_latency(samples, pg)


def _enqueue_only(args: argparse.Namespace, pg: bool) -> None:
    """``enqueue()`` one per transaction in slices alternating with the raw rate, then
    the pings."""
    raw = raw_rates(args.raw_seconds, pg)
    _print_raw("raw commits", raw)
    target = 0.50 if pg else 0.15
    ratios, rates, cpus = [], [], []
    for n in range(1, max(1, args.rounds) + 1):
        limit = limit_rate(args.raw_seconds, pg)
        rate, cpu = enqueue_single_cpu(args.raw_seconds)
        ratios.append(rate / limit)
        rates.append(rate)
        cpus.append(cpu)
        print(
            f"  slice {n}: {raw.limit_name} {limit:,.0f} tx/s, enqueue() {rate:,.0f} jobs/s "
            f"= {rate / limit:.3f} x raw, client CPU {cpu * 1e6:.0f} us per enqueue"
        )
    print(
        f"enqueue(), one per transaction: median {statistics.median(rates):,.0f} jobs/s = "
        f"{statistics.median(ratios):.3f} x raw (median of {len(ratios)} slices; target >= "
        f"{target:.2f}); client CPU {statistics.median(cpus) * 1e6:.0f} us per enqueue"
    )
    _print_latency(latency(args.pings), pg)


def _print_single(single: float, raw: Raw, pg: bool) -> None:
    target = 0.50 if pg else 0.15
    print(
        f"enqueue(), one per transaction: {single:,.0f} jobs/s = {single / raw.limit:.3f} x raw "
        f"(target >= {target:.2f}); {single / raw.django_pair:.3f} x UPDATE+INSERT "
        f"through Django's cursor"
    )


def _print_latency(samples: list[float], pg: bool) -> None:
    p50, p95 = _pct(samples, 0.50) * 1000, _pct(samples, 0.95) * 1000
    goal = "5 / 25" if pg else "20 / 60"
    print(
        f"enqueue->start over {len(samples)} pings: p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
        f"max {max(samples) * 1000:.1f} ms, mean {statistics.mean(samples) * 1000:.1f} ms "
        f"(target <= {goal} ms; from the enqueue() call, its own commit included)"
    )


if __name__ == "__main__":
    main()
