"""Problems dashboard: server time of its pages on 1,000,000 recovery events and 100,000 jobs.

    python bench/dashboard.py [--events 1000000] [--jobs 100000] [--repeat 40] [--reuse]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_issue5 python bench/dashboard.py

1. Loads the events through the ingest's own bulk insert (``insert_lines``), so
   the search index and the per-day counts are kept by their triggers exactly
   as in production; the jobs are bulk-created in every state with progress,
   attempts, leases and errors. ``--reuse`` keeps data already loaded.
2. Times each page through Django's full stack in this process (middleware,
   session, queries, templates: the server's share of a request), logged in as
   a superuser, ``--repeat`` times after one warm-up: median and p95.
   Target: every page marked <= 100 ms p95 on SQLite and PostgreSQL (the operators'
   console included: Queues, Workers, throughput over time, 200,000 job events). The login
   page (no query) is the baseline measured in the same run. The per-hour charts read
   the hourly rollup (``recovery.dashboard.rollup``): its one-time count of 7 days is
   printed first; the timed requests read it as every later request does.
3. Prints the query plans of the searches and the Failed filter.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from _setup import BASE_DIR, configure

RARE = "zebracorn"
WORDS = [
    *[
        "backup",
        "verified",
        "restored",
        "wekan",
        "boards",
        "attachments",
        "sqlite",
        "ferretdb",
        "integrity",
        "bloat",
    ],
    *[
        "index",
        "vacuum",
        "remigrate",
        "snapshot",
        "archive",
        "checksum",
        "manifest",
        "users",
        "cards",
        "lists",
    ],
    *[
        "swimlanes",
        "migration",
        "startup",
        "shutdown",
        "disk",
        "quota",
        "permission",
        "retention",
        "upload",
    ],
    *["avatar", "webhook", "mail", "import"],
]
TYPES = [
    ("backup-created", 30), ("backup-verified", 20), ("integrity-ok", 20), ("bloat-repaired", 5),
    ("remigrate", 3), ("restore-backup", 2), ("restore-prev", 1), ("corruption-detected", 1),
    ("manual-required", 1), ("board-permanently-deleted", 2), ("job-reclaimed-after-restart", 1),
]  # fmt: skip
TARGET_MS = 100.0
METRICS_TARGET_MS = 50.0  # GET /metrics, one Prometheus scrape


def make_events(count: int, seed: int = 5):
    """(offset, crc, LineEvent) tuples: a mix like a busy WeKan host's, over 90 days."""
    from recovery.parsing import LineEvent

    rng = random.Random(seed)
    names, weights = zip(*TYPES, strict=True)
    now = datetime.now(UTC)
    rare_at = {int(count * f) for f in (0.1, 0.35, 0.6, 0.85, 0.999)}  # 5 rows hold the rare word
    for n in range(count):
        kind = rng.choices(names, weights)[0]
        roll = rng.random()
        severity = "error" if roll < 0.01 else "warning" if roll < 0.06 else "info"
        done = False if rng.random() < 0.02 else (None if rng.random() < 0.5 else True)
        deleted = kind == "board-permanently-deleted" or rng.random() < 0.003
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
        if n in rare_at:
            words += f" {RARE}"
        detail = f"{kind.replace('-', ' ').capitalize()}: {words} (run {n})"
        ts = now - timedelta(days=90) * (1 - n / count) - timedelta(seconds=rng.random() * 60)
        user = f"user{n % 40}" if rng.random() < 0.05 else ""
        yield n * 200, n & 0xFFFFFFFF, LineEvent(
            kind, severity, "startup" if n % 3 else "server", f"wekan{n % 4 or ''}", detail,
            done, deleted, user and str(n % 40), user,
            f"192.0.2.{n % 250}" if user else None, None, (), (), 0, ts,
        )  # fmt: skip


def load_events(count: int, *, tag: str = "bench", seed: int = 5) -> float:
    from django.db import transaction
    from django.utils import timezone

    from recovery.policy import line_prefix
    from recovery.records.lines import insert_lines

    started = time.perf_counter()
    batch: list = []
    prefix = line_prefix(tag, 0)
    for item in make_events(count, seed=seed):
        batch.append(item)
        if len(batch) == 10_000:
            with transaction.atomic():
                insert_lines(batch, prefix=prefix, recorded_at=timezone.now())
            batch = []
    if batch:
        with transaction.atomic():
            insert_lines(batch, prefix=prefix, recorded_at=timezone.now())
    return time.perf_counter() - started


def tail_size() -> int:
    """Events loaded beyond ``--events`` on SQLite: the tail the indexer has not reached."""
    from django.db import connection

    from recovery.dashboard import indexing, sql

    return indexing.WORTH_A_JOB - 1 if sql.deferred(connection) else 0


def catch_up_and_leave_a_tail() -> None:
    """SQLite: index the load as the indexer job would, then add the newest events the
    indexer has not reached yet (just under what makes it start), so the pages are timed
    in their normal state: a bulk-indexed history plus a tail read directly."""
    from django.db import connection, transaction

    from recovery.dashboard import sql

    if not sql.deferred(connection):
        print("search index and day counts: maintained during the load (PostgreSQL)")
        return
    started, indexed = time.perf_counter(), 0
    while True:
        with transaction.atomic():
            done = sql.catch_up(connection)
        if not done:
            break
        indexed += done
    seconds = time.perf_counter() - started
    rate = indexed / seconds
    print(f"search index caught up: {indexed:,} events in {seconds:.1f} s ({rate:,.0f}/s)")
    tail = tail_size()
    load_events(tail, tag="bench-tail", seed=6)
    print(f"plus {tail:,} newer events not indexed yet (read directly by every page)")


def error_entry(now: datetime, error: str) -> dict:
    return {
        "at": now.isoformat(),
        "attempt": 1,
        "error_class": error,
        "message": f"{error}: something went wrong",
        "retryable": True,
        "traceback": "Traceback (most recent call last):\n" + "  ...\n" * 20,
    }


def load_jobs(count: int) -> float:
    """Bulk-created rows (a benchmark's shortcut; the app changes jobs only through the engine)."""
    from django.utils import timezone

    from durable.models import Job

    rng = random.Random(7)
    now = timezone.now()
    states = [("completed", 70), ("failed", 8), ("cancelled", 4), ("queued", 10),
              ("paused", 5), ("running", 2), ("cancelling", 1)]  # fmt: skip
    names, weights = zip(*states, strict=True)
    operations = ["durable.noop", "recovery.ingest", "files.move", "imports.trello", "mail.send"]
    errors = ["OSError", "httpx.ConnectTimeout", "durable.errors.NonRetryable", "ValueError"]
    queues = ["default", "default", "mail", "imports", "files"]
    started = time.perf_counter()
    rows = []
    for n in range(count):
        state = rng.choices(names, weights)[0]
        finished = state in ("completed", "failed", "cancelled")
        total = rng.randint(1, 5000)
        failed = state in ("failed", "paused") or (state == "queued" and rng.random() < 0.3)
        error = rng.choice(errors) if failed else ""
        leased = state in ("running", "cancelling")
        rows.append(
            Job(
                operation=rng.choice(operations),
                owner=f"user{n % 40}",
                state=state,
                units_total=total,
                units_done=total if state == "completed" else rng.randint(0, total),
                attempts=rng.randint(1, 4) if failed else 0,
                next_attempt_at=now + timedelta(seconds=rng.randint(-3600, 600)),
                last_error_class=error,
                errors=[error_entry(now, error)] if error else [],
                reason="paused by admin" if state == "paused" else "",
                lease_owner=f"host:{n % 7}:abc" if leased else None,
                lease_expires_at=now + timedelta(seconds=30) if leased else None,
                created_at=now - timedelta(seconds=count - n),
                updated_at=now,
                queue=rng.choice(queues),
                # finished over the last 7 days, denser in the last hour (the charts' ranges)
                finished_at=(
                    now - timedelta(seconds=rng.choice([3600, 86400, 7 * 86400]) * rng.random())
                    if finished
                    else None
                ),
            )
        )
        if finished or leased:  # ran for 0-10 minutes (GET /metrics' run-time histogram)
            job = rows[-1]
            job.started_at = (job.finished_at or now) - timedelta(seconds=rng.random() * 600)
        if len(rows) == 5000:
            Job.objects.bulk_create(rows)
            rows = []
    Job.objects.bulk_create(rows)
    load_console(count, now, rng)
    return time.perf_counter() - started


def load_console(jobs: int, now: datetime, rng: random.Random) -> None:
    """What the Queues, Workers and throughput views read besides jobs: job events (a
    tenth of them retries, over the last 7 days) and 150 worker processes, 20 live."""
    from durable.models import Job, JobEvent, WorkerProcess

    first = Job.objects.order_by("id").values_list("id", flat=True).first() or 0
    events = []
    for n in range(jobs * 2):
        # a tenth retries; one in a hundred a reclaim after a worker's death (GET /metrics)
        kind = "retry_scheduled" if n % 10 == 0 else "reclaimed" if n % 100 == 1 else "started"
        at = now - timedelta(seconds=rng.choice([3600, 86400, 7 * 86400]) * rng.random())
        data = {"attempt_spent": n % 200 == 1} if kind == "reclaimed" else {}
        events.append(
            JobEvent(job_id=first + n // 2, seq=1000 + n % 2, kind=kind, data=data, created_at=at)
        )
        if len(events) == 10_000:
            JobEvent.objects.bulk_create(events)
            events = []
    JobEvent.objects.bulk_create(events)
    queues = ["default", "mail", "imports"]  # "files" is served by nobody: flagged
    workers = []
    for n in range(150):
        live = n < 20
        workers.append(
            WorkerProcess(
                worker_id=f"host{n % 5}:{1000 + n}:bench",
                hostname=f"host{n % 5}",
                pid=1000 + n,
                queues=[queues[n % 3]],
                concurrency=4,
                lease_seconds=30,
                started_at=now - timedelta(hours=n),
                heartbeat_at=now if live else now - timedelta(hours=n),
                stopped_at=None if live else now - timedelta(minutes=n * 9),
                exit_reason="" if live else rng.choice(["clean", "lost", "unit-timeout"]),
            )
        )
    WorkerProcess.objects.bulk_create(workers)


def reset() -> None:
    """Empty the tables this benchmark fills (only needed when reusing a database)."""
    from django.db import connection

    from durable.models import Job, JobEvent, UnitResult, WorkerProcess
    from recovery.models import DailyCount, RecoveryEvent

    WorkerProcess.objects.all().delete()
    if connection.vendor == "postgresql":
        tables = [RecoveryEvent._meta.db_table, DailyCount._meta.db_table, Job._meta.db_table]
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        return
    # In foreign-key order; the triggers keep the search index in step.
    for model in (JobEvent, UnitResult, Job, RecoveryEvent, DailyCount):
        model.objects.all().delete()


def reset_jobs() -> None:
    """Empty the engine's tables this benchmark fills, keeping the events (``--fresh-jobs``)."""
    from django.db import connection

    from durable.models import Job, JobEvent, UnitResult, WorkerProcess
    from recovery.dashboard import rollup

    WorkerProcess.objects.all().delete()
    rollup.forget("default")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {Job._meta.db_table} RESTART IDENTITY CASCADE")
        return
    for model in (JobEvent, UnitResult, Job):
        model.objects.all().delete()


def analyze() -> None:
    """Statistics, and on PostgreSQL the visibility map that index-only scans need: what
    autovacuum keeps in production, done at once after a bulk load."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")


def timed(client, path: str, repeat: int) -> tuple[float, float]:
    from django.core.cache import cache

    client.get(path)  # warm-up: connection, templates
    times = []
    for _ in range(repeat):
        cache.clear()  # nothing of the pages timed is cached per process
        started = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{path}: {response.status_code}")
    times.sort()
    p95 = times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)]
    return statistics.median(times), p95


def plans() -> None:
    from django.db import connection

    from recovery.dashboard import listing

    print("plans:")
    for label, q, status in (("rare word", RARE, "all"), ("common word", "backup", "all"),
                             ("rare word, failed", RARE, "failed")):  # fmt: skip
        sql, order, kind = listing._indexed_search_sql(status)
        sql = f"{sql} {order}"
        params = listing._params(kind, q)
        with connection.cursor() as cursor:
            prefix = "EXPLAIN" if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN"
            cursor.execute(f"{prefix} {sql} LIMIT 10", params)
            rows = [" ".join(str(c) for c in row) for row in cursor.fetchall()]
        print(f"  search, {label}: " + " / ".join(r.strip() for r in rows)[:230])
    from recovery.models import RecoveryEvent

    failed = RecoveryEvent.objects.failed().newest_first()[:10].explain()
    print("  failed filter: " + " / ".join(x.strip() for x in failed.splitlines())[:230])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--reuse", action="store_true", help="keep data already loaded")
    parser.add_argument(
        "--fresh-jobs",
        action="store_true",
        help="with --reuse: load the jobs again (their times follow the load: an older "
        "load has its busy last hour in the past, which flatters the per-hour charts)",
    )
    parser.add_argument("--no-analyze", action="store_true", help="skip ANALYZE after loading")
    parser.add_argument(
        "--metrics-only", action="store_true", help="time GET /metrics only, not the pages"
    )
    args = parser.parse_args()
    if args.reuse and "DATABASE_URL" not in os.environ:
        # configure() starts a fresh SQLite file unless DATABASE_URL names one.
        os.environ["DATABASE_URL"] = f"sqlite:///{BASE_DIR / 'var' / 'bench-dashboard.sqlite3'}"
    configure("bench-dashboard.sqlite3")
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from durable.models import Job
    from recovery.dashboard.listing import recovery_totals
    from recovery.dashboard.query import PAGE_MAX, PER_PAGE_DEFAULT
    from recovery.models import RecoveryEvent

    print(f"database: {connection.vendor} ({settings.DATABASES['default']['NAME']})")
    have = RecoveryEvent.objects.count(), Job.objects.count()
    # What a load leaves: the events asked for, plus SQLite's unindexed tail.
    wanted = args.events + tail_size(), args.jobs
    if not args.reuse or have != wanted:
        reset()
        seconds = load_events(args.events)
        print(f"loaded {args.events:,} events in {seconds:.0f} s ({args.events / seconds:,.0f}/s, "
              "through the ingest's insert_lines)")  # fmt: skip
        catch_up_and_leave_a_tail()
        seconds = load_jobs(args.jobs)
        print(f"loaded {args.jobs:,} jobs in {seconds:.0f} s")
        if not args.no_analyze:
            analyze()
    else:
        print(f"reusing {have[0]:,} events and {have[1]:,} jobs")
        if args.fresh_jobs:
            reset_jobs()
            seconds = load_jobs(args.jobs)
            print(f"loaded {args.jobs:,} jobs again, finished relative to now, in {seconds:.0f} s")
        if not args.no_analyze:
            analyze()

    setup_test_environment()  # lets the test client's host through ALLOWED_HOSTS
    call_command("collectstatic", interactive=False, verbosity=0)  # as `make setup` does
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "", "bench"
    )
    client = Client()
    client.force_login(user)
    # The real last page (the tail included), not --events / 10.
    last = max(1, math.ceil(recovery_totals()["all"] / PER_PAGE_DEFAULT))
    pages = [
        ("Recovery, first page", "/problems/recovery/", True),
        (f"Recovery, search for a rare word ({RARE!r})", f"/problems/recovery/?q={RARE}", True),
        ("Recovery, Failed filter", "/problems/recovery/?status=failed", True),
        (f"Recovery, last page ({last:,})", f"/problems/recovery/?page={last}", True),
        ("Jobs, first page", "/problems/jobs/", True),
        ("Summary (with throughput per minute)", "/problems/", True),
        ("Queues (with throughput per minute)", "/problems/queues/", True),
        ("Queues, throughput per hour, 7 days", "/problems/queues/?range=week", True),
        ("Queues, throughput of one queue, 24 h", "/problems/queues/?range=day&queue=mail", True),
        ("Workers (20 live, 130 stopped)", "/problems/workers/", True),
        ("Jobs, one queue", "/problems/jobs/?queue=files", True),
        # A scan of every job, as the Jobs search has always been (no trigram index on
        # jobs): not targeted, like "search 'user3'" below; the error columns add to it.
        ("Jobs, search an error class ('Timeout')", "/problems/jobs/?q=Timeout", False),
        ("Recovery, search for a common word ('backup')", "/problems/recovery/?q=backup", False),
        ("Recovery, 2-letter search ('ok')", "/problems/recovery/?q=ok", False),
        ("Recovery, common word + Failed", "/problems/recovery/?q=backup&status=failed", False),
        ("Recovery, middle page", f"/problems/recovery/?page={last // 2}", False),
        (
            "Recovery, Failed, last page",
            f"/problems/recovery/?status=failed&page={PAGE_MAX}",
            False,
        ),
        ("Recovery, 100 rows", "/problems/recovery/?per_page=100", False),
        ("Jobs, failed", "/problems/jobs/?state=failed", False),
        ("Jobs, last page", f"/problems/jobs/?page={PAGE_MAX}", False),
        ("Jobs, search 'user3'", "/problems/jobs/?q=user3", False),
        ("Security", "/problems/security/", False),
    ]
    # GET /metrics, as Prometheus scrapes it (a staff session here; a token costs one
    # indexed read more). Every scrape reads the database: nothing is cached.
    from durable.metrics.models import forget

    forget("default")  # the first scrape adds every settled finished job to the totals once
    started = time.perf_counter()
    client.get("/metrics")
    first = (time.perf_counter() - started) * 1000
    print(f"first scrape, counting the settled finished jobs once: {first:.0f} ms")
    median, p95 = timed(client, "/metrics", args.repeat)
    verdict = "ok" if p95 <= METRICS_TARGET_MS else "OVER"
    print(f"{'GET /metrics (one scrape)':52} {median:7.1f}ms {p95:7.1f}ms  "
          f"target <= {METRICS_TARGET_MS:.0f} ms p95: {verdict}")  # fmt: skip
    if args.metrics_only:
        return
    where = client.get(f"/problems/recovery/?page={last}").content.decode()
    if f"page {last:,} / {last:,}<" not in where:  # a page timed as "the last" must be it
        raise SystemExit(f"page {last:,} is not the last page of the Recovery report")
    # The hourly throughput rollup is counted once, by the first chart that needs an
    # hour, then read by every process: its one-time cost, from nothing counted.
    from recovery.dashboard import rollup

    rollup.forget("default")
    started = time.perf_counter()
    client.get("/problems/queues/?range=week")
    first = (time.perf_counter() - started) * 1000
    print(f"first 7-day chart, counting 7 days of closed hours once: {first:.0f} ms")
    base_median, base_p95 = timed(Client(), "/problems/login/", args.repeat)
    print(
        f"baseline, the login page (no query): median {base_median:.1f} ms, p95 {base_p95:.1f} ms"
    )
    print(f"{'page':52} {'median':>8} {'p95':>8} {'x base':>7}  target")
    failures = 0
    for label, path, targeted in pages:
        median, p95 = timed(client, path, args.repeat)
        verdict = ""
        if targeted:
            ok = p95 <= TARGET_MS
            failures += not ok
            verdict = "ok" if ok else "OVER"
        print(f"{label:52} {median:7.1f}ms {p95:7.1f}ms {p95 / base_p95:6.1f}x  {verdict}")
    plans()
    print(f"target: <= {TARGET_MS:.0f} ms p95 for the pages marked; {failures} over")


if __name__ == "__main__":
    main()
