"""Checkpointed units per second against the raw commit rate of the same database.

    python bench/throughput.py [--jobs N] [--units M] [--raw K]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/throughput.py

Enqueues N ``durable.noop`` jobs of M units (default 200 x 500: a measuring
window of several seconds on SQLite and about a minute on PostgreSQL, long
enough that scheduling noise on a shared machine averages out), runs
``runworker --burst`` with 1 and then 4 worker processes, and reports units/s
and jobs/s over the window from the first claim to the last completion
(process start-up excluded).
The baseline, measured in the same run on the same database: a loop of
single-row UPDATE + INSERT transactions through Django's connection
(``transaction.atomic`` + ``cursor.execute``), i.e. what the cheapest possible
checkpoint commit costs a Django process. It is measured before and after the
workers and the ratio uses their mean (both are printed: a large difference
means the machine was busy). Target: 1-worker units/s >= 40% of that rate.
For transparency the same loop on the bare DB-API connection (no Django in
between) is printed too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _setup import BASE_DIR, configure


def raw_commit_rate(count: int) -> float:
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_counter")
        cursor.execute("DROP TABLE IF EXISTS bench_log")
        cursor.execute(
            "CREATE TABLE bench_counter (id integer PRIMARY KEY, n integer, payload text)"
        )
        cursor.execute("CREATE TABLE bench_log (id integer PRIMARY KEY, n integer, key text)")
        cursor.execute("INSERT INTO bench_counter VALUES (1, 0, '{}')")
    started = time.perf_counter()
    for n in range(count):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE bench_counter SET n = n + 1, payload = %s WHERE id = 1",
                [f'{{"next": {n}}}'],
            )
            cursor.execute(
                "INSERT INTO bench_log (id, n, key) VALUES (%s, %s, %s)", [n, n, f"n:{n}"]
            )
    elapsed = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_counter")
        cursor.execute("DROP TABLE bench_log")
    return count / elapsed


def dbapi_commit_rate(count: int) -> float:
    """The same loop on the driver's own connection, bypassing Django entirely."""
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    pg = connection.vendor == "postgresql"
    p = "%s" if pg else "?"
    cursor = raw.cursor()
    cursor.execute("DROP TABLE IF EXISTS bench_counter")
    cursor.execute("DROP TABLE IF EXISTS bench_log")
    cursor.execute("CREATE TABLE bench_counter (id integer PRIMARY KEY, n integer, payload text)")
    cursor.execute("CREATE TABLE bench_log (id integer PRIMARY KEY, n integer, key text)")
    cursor.execute("INSERT INTO bench_counter VALUES (1, 0, '{}')")
    if pg:
        raw.commit()
    started = time.perf_counter()
    for n in range(count):
        if not pg:
            cursor.execute("BEGIN IMMEDIATE")
        cursor.execute(f"UPDATE bench_counter SET n = n + 1, payload = {p} WHERE id = 1", [str(n)])
        cursor.execute(f"INSERT INTO bench_log (id, n, key) VALUES ({p}, {p}, {p})", [n, n, str(n)])
        raw.commit() if pg else cursor.execute("COMMIT")
    elapsed = time.perf_counter() - started
    cursor.execute("DROP TABLE bench_counter")
    cursor.execute("DROP TABLE bench_log")
    if pg:
        raw.commit()
    cursor.close()
    return count / elapsed


def run_workers(processes: int, jobs: int, units: int) -> dict[str, float]:
    from django.db.models import Max, Min

    from durable.jobs import enqueue
    from durable.models import Job

    Job.objects.all().delete()
    for _ in range(jobs):
        enqueue("durable.noop", {"units": units})
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    cmd = [sys.executable, "manage.py", "runworker", "--burst", "--poll-interval", "0.05"]
    procs = [subprocess.Popen(cmd, cwd=BASE_DIR, env=env) for _ in range(processes)]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"worker exited {proc.returncode}")
    states = set(Job.objects.values_list("state", flat=True))
    if states != {"completed"}:
        raise SystemExit(f"jobs ended {states}")
    window = Job.objects.aggregate(start=Min("started_at"), end=Max("finished_at"))
    seconds = (window["end"] - window["start"]).total_seconds()
    return {"seconds": seconds, "units_s": jobs * units / seconds, "jobs_s": jobs / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--units", type=int, default=500)
    parser.add_argument("--raw", type=int, default=20_000, help="baseline transactions")
    args = parser.parse_args()
    url = configure("bench-throughput.sqlite3")
    from django.db import connection

    print(f"database: {connection.vendor} ({url.split('@')[-1]})")
    print(f"workload: {args.jobs} jobs x {args.units} no-op units")
    raw_before = raw_commit_rate(args.raw)
    print(f"raw commit rate (UPDATE+INSERT per transaction, Django): {raw_before:,.0f} tx/s")
    bare = dbapi_commit_rate(args.raw)
    print(f"same loop on the bare DB-API connection: {bare:,.0f} tx/s")
    results = {processes: run_workers(processes, args.jobs, args.units) for processes in (1, 4)}
    raw_after = raw_commit_rate(args.raw)
    print(f"raw commit rate again, after the workers: {raw_after:,.0f} tx/s")
    raw = (raw_before + raw_after) / 2
    for processes, result in results.items():
        print(
            f"{processes} worker(s): {result['units_s']:,.0f} units/s, "
            f"{result['jobs_s']:,.1f} jobs/s over {result['seconds']:.2f}s; "
            f"ratio to raw commits {result['units_s'] / raw:.0%} (mean of before/after; "
            f"to bare DB-API {result['units_s'] / bare:.0%})"
        )


if __name__ == "__main__":
    main()
